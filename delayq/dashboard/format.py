"""How the dashboard shows values: times, durations, JSON, and untrusted text.

Everything that comes from Redis is untrusted. Jinja2 escapes HTML; on top of
that :func:`neutralise` makes bidirectional-text controls visible, so an id
such as ``"inv\\u202egnp.exe"`` cannot pose as ``"invexe.png"``. It runs on
every ``{{ value }}`` of every template (the environment's ``finalize``);
hidden form fields that must carry the exact value use the ``field`` filter.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

from markupsafe import Markup, escape

__all__ = [
    "BIDI",
    "field",
    "finalize",
    "fmt_ms_time",
    "fmt_seconds",
    "fmt_time",
    "neutralise",
    "pretty_json",
    "relative",
]

BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
"""The bidirectional formatting characters: marks, embeddings, overrides and isolates."""
_BIDI_RE = re.compile(f"[{BIDI}]")


def neutralise(text: str) -> str:
    """``text`` with each bidi control shown as ``[U+XXXX]`` instead of reordering what follows."""
    return _BIDI_RE.sub(lambda m: f"[U+{ord(m.group()):04X}]", text)


def finalize(value: Any) -> Any:
    """Jinja2's ``finalize``: every string printed by a template is neutralised (markup
    built by the dashboard itself, such as charts or ``field`` values, is left alone)."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return neutralise(value)
    return value


def field(value: Any) -> Markup:
    """A form field's value exactly as stored (escaped, not neutralised): what the action acts on."""
    return escape(value)


def fmt_time(when: datetime | None) -> str:
    """UTC, to the second; a dash for None."""
    return "–" if when is None else when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def fmt_ms_time(ms: int | None) -> str:
    """:func:`fmt_time` of a time in ms since the epoch (Redis's clock)."""
    return fmt_time(None if ms is None else datetime.fromtimestamp(ms / 1000, timezone.utc))


def fmt_seconds(seconds: float | None) -> str:
    """A duration in the unit that reads best (ms, s, min, h, d)."""
    if seconds is None:
        return "–"
    s = abs(seconds)
    if s < 1:
        text = f"{s * 1000:.0f} ms"
    elif s < 120:
        text = f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    elif s < 7200:
        text = f"{s / 60:.0f} min"
    elif s < 172800:
        text = f"{s / 3600:.1f} h"
    else:
        text = f"{s / 86400:.1f} d"
    return text


def relative(when: datetime | None, now: datetime) -> str:
    """``in 5 min``, ``3.2 s ago`` or ``now``; empty for None."""
    if when is None:
        return ""
    delta = (when - now).total_seconds()
    if abs(delta) < 0.5:
        return "now"
    return f"in {fmt_seconds(delta)}" if delta > 0 else f"{fmt_seconds(delta)} ago"


def pretty_json(value: Any) -> str:
    """Indented JSON (keys sorted), or the repr of what JSON cannot hold."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return repr(value)
