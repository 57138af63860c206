"""How a failing background loop waits before it tries again: :class:`Retrying` (a wait
that doubles from ``first`` up to :data:`MAX_BACKOFF`, reset after a success), and
:func:`wait_to_retry` for the loops a wake-up event may resume early (the scheduler, the
partitions' spread, the schedule firer).

A loop that retries at once loops without waiting for anything: it holds up the whole
process, or hammers Redis. One that sleeps its whole backoff resumes late after Redis
comes back. So: the backoff, cut short by the loop's wake-up event (set when its
subscription is back, among others), but never before :data:`MIN_RETRY`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

__all__ = ["MAX_BACKOFF", "MIN_RETRY", "Retrying", "wait_to_retry"]

MAX_BACKOFF = 5.0
"""Seconds a failing background loop waits at most before it tries again."""

MIN_RETRY = 0.1
"""Seconds a failed pass waits at least, whatever wakes its loop meanwhile."""


async def wait_to_retry(wake: anyio.Event, backoff: float) -> None:
    """Wait ``backoff`` seconds, or until ``wake`` is set once :data:`MIN_RETRY` has passed."""
    first = min(backoff, MIN_RETRY)
    await anyio.sleep(first)
    with anyio.move_on_after(backoff - first):
        await wake.wait()


@dataclass(slots=True)
class Retrying:
    """One failing loop's wait before its next try: ``first`` seconds, doubled after each
    failure up to ``most``; :meth:`reset` after a success."""

    first: float = 0.05
    most: float = MAX_BACKOFF
    delay: float = field(init=False)
    """The wait before the next try (what a log line says)."""

    def __post_init__(self) -> None:
        self.delay = self.first

    def reset(self) -> None:
        """A try succeeded: the next failure waits ``first`` again."""
        self.delay = self.first

    def next(self) -> float:
        """The wait for this failure (:attr:`delay`); the next one waits twice as long."""
        delay = self.delay
        self.delay = min(delay * 2, self.most)
        return delay

    async def sleep(self) -> None:
        """Sleep :meth:`next`'s wait."""
        await anyio.sleep(self.next())
