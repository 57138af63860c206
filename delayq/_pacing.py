"""How a failing background loop waits before it tries again (the scheduler, the
partitions' spread, the schedule firer).

A loop that retries at once loops without waiting for anything: it holds up the whole
process, or hammers Redis. One that sleeps its whole backoff resumes late after Redis
comes back. So: the backoff, cut short by the loop's wake-up event (set when its
subscription is back, among others), but never before :data:`MIN_RETRY`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import anyio

from .errors import RedisResponseError, is_transient

__all__ = ["MAX_BACKOFF", "MIN_RETRY", "Backoffs", "Retrying", "wait_to_retry"]

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


class Backoffs:
    """Each key's own backoff (a shard, a type, the membership): one that keeps failing
    is tried again later and later, up to ``cap``, while the others go on.

    ``cap`` is short on purpose: a key fails most often because its cluster node is
    failing over, and it should resume soon after the promotion, not a long backoff
    later. A try costs one refused command.
    """

    def __init__(self, first: float = 0.1, cap: float = 0.5) -> None:
        self._first = first
        self._cap = cap
        self._delay: dict[str, float] = {}
        self._until: dict[str, float] = {}

    def failed(self, key: str, now: float) -> float:
        """``key`` failed at ``now``: return how long it waits before its next try."""
        delay = self._delay.get(key, self._first / 2) * 2
        self._delay[key] = delay = min(delay, self._cap)
        self._until[key] = now + delay
        return delay

    def hold(self, key: str, until: float) -> None:
        """Keep ``key`` from being tried before ``until``."""
        self._until[key] = until

    def succeeded(self, key: str) -> bool:
        """``key`` succeeded: forget its backoff; return whether it was failing."""
        self._until.pop(key, None)
        return self._delay.pop(key, None) is not None

    def waiting(self, key: str, now: float) -> bool:
        """True while ``key`` waits for its next try."""
        return self._until.get(key, -1.0) > now

    def until(self, key: str) -> float:
        """When ``key`` may be tried next (``-1`` when it is not waiting)."""
        return self._until.get(key, -1.0)

    def failing(self, key: str) -> bool:
        """True from ``key``'s failure until its next success."""
        return key in self._delay

    def move_failed(
        self, key: str, exc: Exception, now: float, *, refused_wait: float, log: logging.Logger
    ) -> None:
        """A move of ``key`` (a type or a partition) raised ``exc``: log it and back ``key``
        off, the others going on. Refused by Redis (a key of the wrong type written by
        someone else): ``refused_wait``. Its node away, failing over or busy (a lost
        connection, a timeout, a "not now" such as ``READONLY``): the backoff."""
        if isinstance(exc, RedisResponseError) and not is_transient(exc):
            log.error("%s: moving due events failed: %s; trying again later", key, exc)
            self.hold(key, now + refused_wait)
            return
        first = not self.failing(key)
        wait = self.failed(key, now)
        (log.warning if first else log.debug)(
            "%s: moving due events failed (%s: %s); retrying in %.2fs",
            key, type(exc).__name__, exc, wait,
        )  # fmt: skip


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
