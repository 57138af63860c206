"""Flow keys: which key an event is served under (fair turns between keys, per-key limits).

An event gets its key from ``enqueue_*(..., key="tenant-42")``, or else from the
field its class names (``class Job(Event, flow_key="tenant")``). Events without a
key share one (the empty key) once the type uses keys. See docs/FLOW.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["MAX_KEY_LENGTH", "KeyBacklog", "KeyBacklogs", "check_key", "event_key"]

MAX_KEY_LENGTH = 200
"""The longest flow key, in characters (it is part of Redis key names)."""


def check_key(key: object) -> str | None:
    """Return ``key`` as a flow key (None: none); raise for anything but a non-empty str
    of at most :data:`MAX_KEY_LENGTH` characters without a NUL (an int is turned into its
    digits)."""
    if key is None:
        return None
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if not isinstance(key, str):
        raise TypeError(f"a flow key is a str (or an int), not {type(key).__name__}: {key!r}")
    if not key or len(key) > MAX_KEY_LENGTH or "\0" in key:
        # NUL separates a key from the rest of its members in Redis (see lua/_prelude.lua)
        raise ValueError(f"a flow key has 1 to {MAX_KEY_LENGTH} characters and no NUL, not {key!r}")
    return key


def event_key(event: Any, explicit: object = None) -> str | None:
    """The flow key of ``event``: ``explicit`` if given, else the value of the field its class
    names with ``flow_key=...`` (None when it has none or the field holds None or "")."""
    if explicit is not None:
        return check_key(explicit)
    field = getattr(type(event), "event_flow_key", None)
    if field is None:
        return None
    value = getattr(event, field)
    return None if value == "" else check_key(value)


@dataclass(frozen=True, slots=True)
class KeyBacklog:
    """One flow key of a type (or delivery group) that has work."""

    key: str
    """The flow key (``""``: events enqueued without one)."""
    ready: int
    """Events waiting in the key's line (due, not claimed yet)."""
    running: int
    """Live deliveries counted against a per-key concurrency limit (0 without one)."""
    parked_until: datetime | None
    """While a per-key limit holds the key back: when it gets its next turn at the latest."""


@dataclass(frozen=True, slots=True)
class KeyBacklogs:
    """The flow keys with work, the biggest backlogs first (see ``EventService.key_backlog``)."""

    keys: list[KeyBacklog]
    """At most the limit asked for, by ready events, most first."""
    in_rotation: int
    """Keys taking turns now."""
    parked: int
    """Keys held back by a per-key limit."""
    scanned: int
    """How many keys were looked at (the top is exact when it covers every key)."""
