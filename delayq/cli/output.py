"""How the CLI talks to people and scripts: Rich on a terminal, JSON with ``--json``.

Everything read from Redis is untrusted: it goes into Rich as ``Text`` (never
parsed as markup) or through ``escape``.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

__all__ = [
    "CliError",
    "add_columns",
    "console",
    "err_console",
    "fail",
    "fail_line",
    "not_found",
    "print_json",
    "text",
    "when",
]

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


class CliError(Exception):
    """Bad input or an unusable setup: printed as one line, exit code 2 (or ``code``)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = 2) -> NoReturn:
    """Stop the command with a one-line error."""
    raise CliError(message, code)


def report_error(exc: CliError) -> None:
    """Print ``exc`` as ``error: ...`` on stderr (one line)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    fail_line(first)


def fail_line(message: str) -> None:
    """Print ``error: message`` on stderr as one line (``message`` is shown literally)."""
    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)


def print_json(data: Any) -> None:
    """Write ``data`` as JSON on stdout (for scripts)."""
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2, default=str) + "\n")
    sys.stdout.flush()


def not_found(message: str, as_json: bool) -> NoReturn:
    """End a command that shows one thing which is not there, with exit code 1: ``message``
    on a terminal (shown literally), ``null`` with ``--json``."""
    if as_json:
        print_json(None)
    else:
        console.print(text(message))
    raise typer.Exit(1)


def add_columns(table: Table, names: tuple[str, ...]) -> None:
    """Columns that never cut a value short on a narrow terminal: long values fold (an id
    must stay whole to be pasted into the next command; see also ``when(short=True)``)."""
    for name in names:
        table.add_column(name, overflow="fold")


def text(value: object) -> Text:
    """Untrusted text for a table cell: shown as is, never interpreted as markup."""
    if value is None:
        return Text("-", style="dim")
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False, default=str)
    return Text(value)


def when(moment: datetime | None, now: datetime | None = None, *, short: bool = False) -> Text:
    """A time as ISO 8601 UTC, with how far it is from ``now``; ``short``: to the second,
    date and time as two words (for table cells: they wrap instead of being cut)."""
    if moment is None:
        return Text("-", style="dim")
    now = now or datetime.now(timezone.utc)
    delta = (moment - now).total_seconds()
    rel = f"in {human_seconds(delta)}" if delta >= 0 else f"{human_seconds(-delta)} ago"
    if short:
        stamp = moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    else:
        stamp = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return Text(f"{stamp} ({rel})")


def human_seconds(seconds: float) -> str:
    """``950ms``, ``12.3s``, ``5m02s``, ``3h10m``, ``2d04h``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    return f"{int(seconds // 86400)}d{int(seconds % 86400 // 3600):02d}h"
