"""The scheduler's moves: one bounded batch of one shard's due events, and the leader's
backlog drainer.

:class:`Mover` is owned by the :class:`~delayq.runtime.scheduler.Scheduler`, which runs
:meth:`Mover.drainer` in its task group and decides when each type gets a look; the
mover does the look (one ``move_due`` call), counts and logs what it moved, and notes
when the type next needs one. The scheduler's spread moves the partitions with
:meth:`Mover.drain` too.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from .._pacing import Backoffs, Retrying, Wakeup, log_retry
from ..keys import DEFAULT_GROUP
from ..metrics import ServiceMetrics
from ..partitions.shards import type_of
from ..storage.store import Store

__all__ = ["Mover"]

log = logging.getLogger("delayq.scheduler")


class Mover:
    """Moves due events a batch at a time for the scheduler, and drains its backlogs."""

    def __init__(
        self,
        store: Store,
        metrics: ServiceMetrics,
        *,
        interval: float,
        batch_size: int,
        visibility_ms: int,
        max_deliveries: int,
        is_leader: Callable[[], bool],
        stopping: Callable[[], bool],
        interrupt: Callable[[], None],
    ):
        self._store = store
        self._metrics = metrics
        self._interval = interval
        self._batch_size = batch_size
        self._visibility_ms = visibility_ms
        self._max_deliveries = max_deliveries
        self._is_leader = is_leader
        self._stopping = stopping
        self._interrupt = interrupt  # wakes the scheduler's pass loop
        self.next: dict[str, float] = {}
        """Type -> the monotonic time it next needs a look."""
        self.active: set[str] = set()
        """The types with entries in their ready lists."""
        self.backlog: set[str] = set()
        """The leader's types whose last batch was full: the drainer moves them, batch
        after batch, beside the passes."""
        self._wake = Wakeup()
        self.failing = Backoffs()
        """Each type's own backoff after a failed move."""

    def reset(self) -> None:
        """Called by the scheduler's ``run()`` before it starts :meth:`drainer` (a new
        event loop may run it)."""
        self._wake.renew()

    async def drainer(self) -> None:
        """Move the leader's backlogs: one batch per type in turn, until each is moved.

        A type with more due than one batch (a million events due in the same second)
        is drained here, beside the passes, so the pass loop keeps its own times: another
        type's event that comes due meanwhile is moved when due, not after the burst's
        batch under way (each call is one bounded script, so Redis runs the two in turn).
        """
        retrying = Retrying(first=0.1)
        while not self._stopping():
            if not self._is_leader():
                self.backlog.clear()  # a standby looks at them takeover_delay late
            if not self.backlog:
                await self._wake.wait(math.inf)
                self._wake.renew()
                continue
            try:
                for type_name in sorted(self.backlog):
                    if self._is_leader():
                        await self.move_or_log(type_name)
                retrying.reset()
            except Exception as exc:  # loops never die: log, back off, go on
                self._metrics.increment("redis_errors")
                log_retry(log, "moving a backlog", exc, retrying.delay)
                await retrying.sleep()

    async def move_or_log(self, type_name: str) -> int:
        """Move what is due for one type (unless it waits after a failure); a failure
        is this type's alone: it backs off, and the other types still move."""
        now = time.monotonic()
        if self.failing.waiting(type_name, now):
            self.next[type_name] = self.failing.until(type_name)  # looked at then
            self.backlog.discard(type_name)
            return 0
        try:
            late = await self._move(type_name)
        except Exception as exc:
            self._failed(type_name, exc)
            return 0
        if self.failing.succeeded(type_name):
            log.info("%s: moving due events again", type_name)
        return late

    def _failed(self, type_name: str, exc: Exception) -> None:
        self._metrics.increment("redis_errors", event_type=type_name)
        # this type alone waits; the others must still move
        now = time.monotonic()
        self.failing.move_failed(type_name, exc, now, refused_wait=10 * self._interval, log=log)
        self.next[type_name] = self.failing.until(type_name)
        self.backlog.discard(type_name)  # not at once again: at that time

    async def _move(self, type_name: str) -> int:
        """Move one batch of a type's due events; return how late the oldest was (ms).

        The leader hands a type whose batch was full to the drainer, and takes it back
        (wakes the pass loop for its next time) once it is moved."""
        if not self._is_leader():
            return await self.drain(type_name, self.next, self.active)
        was = type_name in self.backlog
        late = await self.drain(type_name, self.next, self.active, self.backlog)
        if type_name in self.backlog and not was:
            self._wake.set()
        elif was and type_name not in self.backlog:
            self._interrupt()  # its next time may come before the pass loop wakes
        return late

    async def drain(
        self,
        type_name: str,
        nexts: dict[str, float],
        active: set[str],
        backlog: set[str] | None = None,
    ) -> int:
        """Move one batch of one shard's due events; note in ``nexts`` when it next needs a
        look (at once when the batch was full), in ``active`` whether its ready list
        holds entries and in ``backlog`` (if given) whether the batch was full; return how
        late the oldest thing moved was (ms).

        One batch per look, not a whole backlog: a type with a million events due in the
        same second takes its turns between the other types' batches, so their events
        are moved on time while the burst drains (the leader's drainer, or the next pass,
        comes back for the rest at once).
        """
        label = type_of(type_name)
        sent = time.monotonic()
        r = await self._store.scheduling.move_due(
            type_name, self._batch_size, self._visibility_ms, self._max_deliveries
        )
        answered = time.monotonic()
        if r.moved:
            self._metrics.increment("moved", r.moved, event_type=label)
        if r.dead:
            if r.dead_groups:  # a type with delivery groups: each group's own
                for group, n in r.dead_groups.items():
                    view = self._metrics.for_group(None if group == DEFAULT_GROUP else group)
                    view.increment("dead_lettered", n, event_type=label)
            else:
                self._metrics.increment("dead_lettered", r.dead, event_type=label)
            log.error(
                "%s: %d events became dead letters after their last lease expired",
                type_name,
                r.dead,
            )
        if r.missing:
            log.warning(
                "%s: dropped %d scheduled ids that have no stored event: %s",
                type_name,
                len(r.missing),
                [m.decode("utf-8", "replace") for m in r.missing[:10]],
            )
        # Ready entries need a look now and then (a consumer may die between
        # popping one and claiming it); due times and leases are in nexts.
        if r.queued:
            active.add(type_name)
        else:
            active.discard(type_name)
        if backlog is not None:
            if r.more:
                backlog.add(type_name)
            else:
                backlog.discard(type_name)
        if r.more:
            nexts[type_name] = time.monotonic()
        elif r.next_ms is None:
            nexts.pop(type_name, None)
        else:
            # Timed from when Redis read its clock: about half-way through the round trip
            # (not when the answer arrived), and half a ms after now_ms on average (read in
            # whole ms). Timing it from the answer made every due event later by the
            # answer's trip and the truncated fraction: ~1 ms at the median on a loaded host.
            read_at = (sent + answered) / 2
            nexts[type_name] = read_at + max(0.0, r.next_ms - r.now_ms - 0.5) / 1000
        return r.late_ms
