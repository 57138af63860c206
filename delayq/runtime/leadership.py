"""The scheduler lock as one process sees it: taking, renewing, stealing, releasing, and
what the process may do while the lock cannot be reached.

The lock (``{prefix}:scheduler-lock``, ``SET NX PX`` by token) only saves work: every
move is one atomic script, so two processes moving the same type at once move nothing
twice. That makes a **lease** safe. A leader whose renewal fails (the ``{prefix}``
node is away: killed, failing over, cut off) goes on leading until the lock it last
took or renewed would expire on its own, counted from when that call was *sent*
(Redis set the expiry later, so no other process can have taken the lock before this
lease ends), and tries again on its own short backoff meanwhile; it renews in a task
of its own, so a renewal that fails slowly holds up none of its moves. When the lease ends
without a renewal it steps down and stands by. A standby that cannot reach the lock
stays a standby: it moves what the leader leaves overdue by ``takeover_delay``, as
always, and takes the lock once it can. A lock lost with a failed-over node (a
replica promoted before it had the key) is taken again at the next renewal.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import anyio.abc

from .._pacing import Backoffs
from ..metrics import ServiceMetrics
from ..storage.store import Store

__all__ = ["Leadership"]

log = logging.getLogger("delayq.scheduler")


class Leadership:
    """The scheduler lock for one :class:`~delayq.runtime.scheduler.Scheduler`."""

    def __init__(
        self,
        store: Store,
        metrics: ServiceMetrics,
        *,
        lock_ms: int,
        interval: float,
        token: Callable[[], str],
        on_leading: Callable[[], None],
    ):
        self._store = store
        self._metrics = metrics
        self._lock_ms = lock_ms
        self._interval = interval
        self._token = token
        self._on_leading = on_leading  # called when this process becomes the leader
        self.is_leader = False
        self.holder: str | None = None
        """The leader's token, as last seen by a standby."""
        self.tried_at = -math.inf
        """When the lock was last taken, renewed or tried (monotonic)."""
        self._lease_end = -math.inf
        self._failing = Backoffs()
        self._renewing = False
        self.tasks: anyio.abc.TaskGroup | None = None
        """Where a leader's renewals run (the scheduler's task group, set by its run())."""

    def released(self) -> None:
        """The leader released the lock (its ``:released`` wake-up): try it at once."""
        self.tried_at = -math.inf

    def next_try(self) -> float:
        """When a standby tries the lock next (monotonic)."""
        return max(self.tried_at + self._interval, self._failing.until(""))

    async def hold(self) -> bool:
        """Keep the lock (renewed once a third of its time to live has passed, in a task),
        or try to take it once per ``interval`` while standing by; return whether this
        process leads. A failed call leaves a leader leading until its lease ends."""
        now = time.monotonic()
        if self.is_leader:
            due = now - self.tried_at >= self._lock_ms / 3000
            if due and not self._renewing and not self._failing.waiting("", now):
                if self.tasks is None:
                    await self._renew()
                else:
                    self._renewing = True
                    self.tasks.start_soon(self._renew)
            return self._within_lease(now)
        if self._failing.waiting("", now) or now - self.tried_at < self._interval:
            return False
        try:
            return await self.take()
        except Exception as exc:
            self._failed(exc, now)
            return False

    async def _renew(self) -> None:
        try:
            await self.take()
        except Exception as exc:
            self._failed(exc, time.monotonic())
        finally:
            self._renewing = False

    def _failed(self, exc: Exception, now: float) -> None:
        self._metrics.increment("redis_errors")
        wait = self._failing.failed("", now)
        if self.is_leader and now < self._lease_end:
            log.warning(
                "scheduler %s cannot reach the lock (%s: %s); leading for %.1fs "
                "more (its lease), trying again in %.2fs",
                self._token()[:8],
                type(exc).__name__,
                exc,
                self._lease_end - now,
                wait,
            )
        else:
            log.warning(
                "scheduler %s cannot reach the lock (%s: %s); trying again in %.2fs",
                self._token()[:8],
                type(exc).__name__,
                exc,
                wait,
            )

    def _within_lease(self, now: float) -> bool:
        if self.is_leader and now >= self._lease_end:
            log.warning(
                "scheduler %s: its lease on the lock ended unrenewed; standing by",
                self._token()[:8],
            )
            self._became(False, "")
        return self.is_leader

    def _became(self, held: bool, how: str) -> None:
        if held != self.is_leader:
            log.info("scheduler %s %s the lock", self._token()[:8], how if held else "lost")
            if held:
                self._on_leading()
        self.is_leader = held

    def _succeeded(self, sent: float, held: bool) -> None:
        if self._failing.succeeded(""):
            log.info("scheduler %s reaches the lock again", self._token()[:8])
        self.tried_at = time.monotonic()
        if held:
            self._lease_end = sent + self._lock_ms / 1000

    async def take(self) -> bool:
        """Take or renew the lock; return whether this process holds it."""
        sent = time.monotonic()
        held, self.holder = await self._store.scheduling.take_lock(self._token(), self._lock_ms)
        self._succeeded(sent, held)
        self._became(held, "took")
        return held

    async def take_over(self, late_ms: int) -> None:
        """Take the lock from a leader that left events ``late_ms`` overdue (or take it if
        free). A failure is logged: the overdue events were moved anyway."""
        try:
            if self.holder is None:
                await self.take()
                return
            sent = time.monotonic()
            held = await self._store.scheduling.steal_lock(
                self.holder, self._token(), self._lock_ms
            )
        except Exception as exc:
            self._metrics.increment("redis_errors")
            self._failing.failed("", time.monotonic())
            log.warning(
                "scheduler %s could not take the lock over (%s: %s)",
                self._token()[:8],
                type(exc).__name__,
                exc,
            )
            return
        self._succeeded(sent, held)
        if held:
            self._metrics.increment("scheduler_takeovers")
            log.warning(
                "scheduler %s took over from %s, which left events %d ms overdue",
                self._token()[:8],
                self.holder[:8],
                late_ms,
            )
            self.holder = None
        self._became(held, "took over")

    async def release(self) -> None:
        """Release the lock if held (on the way out; a failure is only logged)."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            await self._store.scheduling.release_lock(self._token())
        except Exception as exc:
            log.debug("releasing the scheduler lock failed: %s", exc)
