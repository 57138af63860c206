"""Durations and times as the library sends them to Redis: whole milliseconds, one rule.

**Rounding: up, to the whole ms** (after dropping float noise below a microsecond, so
``0.1`` s is 100 ms, not 101). A delay, a lease, a debounce window or a due time is never
shorter or earlier than asked; the at most 1 ms it may be longer is below what Redis's
clock resolves for a scheduler anyway. Every conversion of seconds, ``timedelta`` or
``datetime`` to ms goes through :func:`seconds_to_ms`, except :func:`delay_ms` of a
``timedelta`` (every enqueue's usual delay), which counts its whole µs: the same ms by
the same rule, without the float.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

__all__ = ["delay_ms", "delay_seconds", "due_unix_ms", "seconds_to_ms"]


def seconds_to_ms(seconds: float) -> int:
    """``seconds`` in whole ms, rounded up (float noise under 1 µs dropped first)."""
    return math.ceil(round(seconds * 1_000_000) / 1000)


def delay_seconds(value: float | timedelta, what: str = "delay") -> float:
    """Return ``value`` as finite, non-negative seconds, or raise ``TypeError``/``ValueError``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"{what} must be a timedelta or a number of seconds, not {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{what} must be finite and >= 0, not {value!r}")
    return seconds


def delay_ms(value: float | timedelta, what: str = "delay") -> int:
    """:func:`delay_seconds` of ``value`` in whole ms (:func:`seconds_to_ms`).

    A ``timedelta`` is counted in its whole µs instead: the same ms, rounded up, some 40 %
    cheaper (every single enqueue's usual delay comes this way). Its subclasses, which may
    hold more than µs, go the float way."""
    if type(value) is timedelta:
        us = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        if us >= 0:
            return -(-us // 1000)
    return seconds_to_ms(delay_seconds(value, what))


def due_unix_ms(when: datetime) -> int:
    """``when`` (a timezone-aware datetime) as unix ms, or raise ``TypeError``/``ValueError``."""
    if not isinstance(when, datetime):
        raise TypeError(f"when must be a datetime, not {type(when).__name__}")
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError("when must be timezone-aware, e.g. datetime.now(timezone.utc)")
    return seconds_to_ms(when.timestamp())
