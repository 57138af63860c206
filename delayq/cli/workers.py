"""``delayq workers``: the live worker processes under a prefix, from their heartbeats."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

import typer
from rich.table import Table

from ..runtime.heartbeat import WorkerInfo
from .ops import Connection, Json, run, with_connection
from .output import console, print_json, text, when

__all__ = ["register", "worker_dict", "workers"]


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def worker_dict(w: WorkerInfo) -> dict[str, Any]:
    """One worker as JSON (stable field names)."""
    return {
        "id": w.id,
        "host": w.host,
        "pid": w.pid,
        "version": w.version,
        "types": dict(w.types),
        "in_flight": dict(w.in_flight),
        "started_at": _iso(w.started_at),
        "seen_at": _iso(w.seen_at),
        "ttl_seconds": w.ttl,
    }


@with_connection
def workers(
    limit: Annotated[int, typer.Option("--limit", min=1, max=10000, help="Most rows.")] = 1000,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """The live worker processes (their heartbeats): host, pid, the types each handles
    with its concurrency and handlers running, when it started and was last seen."""

    async def main() -> list[WorkerInfo]:
        async with conn.connect() as service:
            return await service.workers(limit)

    found = run(main)
    if as_json:
        print_json({"prefix": conn.prefix, "workers": [worker_dict(w) for w in found]})
        return
    table = Table(
        title=text(f"workers · prefix {conn.prefix}"), title_justify="left", caption_justify="left"
    )
    for column in ("id", "host", "pid", "handling (running/concurrency)", "started", "seen"):
        table.add_column(column, overflow="fold")
    now = datetime.now(timezone.utc)
    for w in found:
        handling = ", ".join(
            f"{name} {w.in_flight.get(name, 0)}/{limit_}"
            for name, limit_ in sorted(w.types.items())
        )
        table.add_row(
            text(w.id),
            text(w.host),
            str(w.pid),
            text(handling or None),
            when(w.started_at, now, short=True),
            when(w.seen_at, now, short=True),
        )
    if not found:
        table.caption = text(
            conn.nothing("live workers") + " (heartbeat_interval=0 hides a worker)"
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add the ``workers`` command to ``app``."""
    app.command(rich_help_panel="Operate")(workers)
