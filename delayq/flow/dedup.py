"""Dedup modes of an enqueue, beyond keep-first and ``replace=True`` (see docs/FLOW.md).

- ``debounce=max_wait``: each enqueue of an existing id replaces it (payload,
  context, due time, as ``replace=True``), but its due time never passes the
  end of the id's window: its first enqueue + ``max_wait``.
- ``unique_for=ttl``: keep-first while the event exists; once it has been
  handled (acked by its last delivery group), the id is refused for ``ttl``.

``lua/enqueue.lua`` applies them (flag ``d<ms>`` / ``u<ms>``), ``lua/ack.lua``
starts a unique id's ttl.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from ..durations import seconds_to_ms

__all__ = ["Dedup", "check_debounce", "dedup_mode"]

_MAX_MS = 366 * 86_400_000


@dataclass(frozen=True, slots=True)
class Dedup:
    """A dedup mode and its time in ms (the debounce window, or the unique ttl)."""

    mode: Literal["debounce", "unique"]
    ms: int

    @property
    def flag(self) -> str:
        """The enqueue script's mode flag."""
        return ("d" if self.mode == "debounce" else "u") + str(self.ms)


def _ms(name: str, value: float | timedelta) -> int:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{name} must be seconds or a timedelta, not {value!r}")
    ms = seconds_to_ms(seconds)
    if not 1 <= ms <= _MAX_MS:
        raise ValueError(f"{name} must be from 1 ms to 366 days, not {value!r}")
    return ms


def dedup_mode(
    replace: bool, debounce: float | timedelta | None, unique_for: float | timedelta | None
) -> bool | Dedup:
    """What an enqueue call asks for: ``replace`` (a bool) or a :class:`Dedup`.

    The three are exclusive: ``ValueError`` when more than one is given.
    """
    given = [
        n
        for n, v in (("replace", replace), ("debounce", debounce), ("unique_for", unique_for))
        if v
    ]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} are exclusive: give one dedup mode per call")
    if debounce is not None:
        return Dedup("debounce", _ms("debounce", debounce))
    if unique_for is not None:
        return Dedup("unique", _ms("unique_for", unique_for))
    return bool(replace)


def check_debounce(mode: bool | Dedup, ms: int) -> None:
    """``ValueError`` when a debounced event is due more than its ``max_wait`` from now
    (``ms``: its delay): the window's cap would pull it in, which is never what a
    caller means."""
    if isinstance(mode, Dedup) and mode.mode == "debounce" and ms > mode.ms:
        raise ValueError(
            f"a debounced event's delay ({ms} ms) must not exceed debounce ({mode.ms} ms)"
        )
