"""The scheduler: moves due events of every type to their ready lists.

One scheduler per prefix is active at a time, the holder of a short-TTL lock;
the others retry the lock every ``scheduling_interval``. The lock only saves
work: each move is one atomic script, so two schedulers moving at once never
move an event twice.

The active scheduler sleeps until the earliest time any type needs a look (a
due time, a lease deadline, an orphan check), at most ``scheduling_interval``,
and wakes early when an enqueue publishes that it made an earlier due time.
Every ``scheduling_interval`` it looks at every type with events pending, and
every ten intervals at all types, so a lost wake-up only delays, never
strands, an event.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import dataclass

import anyio
import anyio.lowlevel
from redis.exceptions import ResponseError

from .events import validate_name
from .metrics import Metrics
from .store import Store, WakeupListener

__all__ = ["Scheduler", "SchedulerSettings"]

log = logging.getLogger("delayq.scheduler")

_MAX_BACKOFF = 5.0
# Every this many scheduling intervals, all known types get a look, even idle ones.
_FULL_SWEEP = 10


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """The service options the scheduler needs."""

    interval: float
    batch_size: int
    visibility_ms: int
    max_deliveries: int
    lock_ms: int
    listen_timeout: float = 5.0  # below the blocking client's socket timeout


class Scheduler:
    """The loop that moves due events; run it with :meth:`run`, end it with :meth:`stop`."""

    def __init__(self, store: Store, settings: SchedulerSettings, metrics: Metrics):
        self._store = store
        self._s = settings
        self._metrics = metrics
        self.token = uuid.uuid4().hex
        self.is_leader = False
        self._stopping = False
        self._scope: anyio.CancelScope | None = None
        self._wake: anyio.Event | None = None
        self._woken: set[str] = set()
        self._types: set[str] = set()
        self._next: dict[str, float] = {}  # type -> monotonic time it needs a look
        self._active: set[str] = set()  # types with entries in their ready lists
        self._last_sweep = -math.inf
        self._last_full = -math.inf
        self._lock_taken_at = -math.inf

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` has been called."""
        return self._stopping

    def stop(self) -> None:
        """End :meth:`run` and release the lock."""
        self._stopping = True
        if self._scope is not None:
            self._scope.cancel()

    def wake(self, type_name: str | None = None) -> None:
        """Look at ``type_name`` (or sweep all types) now rather than at the next planned time."""
        if type_name is None:
            self._last_full = -math.inf
        else:
            self._woken.add(type_name)
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Move due events until :meth:`stop`."""
        self._wake = anyio.Event()
        try:
            with anyio.CancelScope() as self._scope:
                if self._stopping:
                    return
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._listen)
                    await self._loop()
                    tg.cancel_scope.cancel()
        finally:
            if self.is_leader:
                self.is_leader = False
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    try:
                        await self._store.release_lock(self.token)
                    except Exception as exc:
                        log.debug("releasing the scheduler lock failed: %s", exc)

    async def _loop(self) -> None:
        backoff = 0.1
        while not self._stopping:
            sleep_for = self._s.interval
            try:
                if await self._hold_lock():
                    sleep_for = await self._pass()
                backoff = 0.1
            except Exception as exc:  # loops never die: log, back off, go on
                self._metrics.increment("redis_errors")
                log.warning(
                    "scheduler pass failed (%s: %s); retrying in %.2fs",
                    type(exc).__name__,
                    exc,
                    backoff,
                )
                sleep_for = backoff
                backoff = min(backoff * 2, _MAX_BACKOFF)
            assert self._wake is not None
            if sleep_for > 0 and not self._woken:
                with anyio.move_on_after(sleep_for):
                    await self._wake.wait()
            self._wake = anyio.Event()

    async def _hold_lock(self) -> bool:
        """Take the lock, or renew it once a third of its time to live has passed."""
        if self.is_leader and time.monotonic() - self._lock_taken_at < self._s.lock_ms / 3000:
            return True
        return await self._take_lock()

    async def _take_lock(self) -> bool:
        held = await self._store.take_lock(self.token, self._s.lock_ms)
        self._lock_taken_at = time.monotonic()
        if held != self.is_leader:
            log.info("scheduler %s %s the lock", self.token[:8], "took" if held else "lost")
            if held:
                self._last_full = -math.inf  # a new leader looks at everything first
        self.is_leader = held
        return held

    async def _pass(self) -> float:
        """Move what is due; return how long to sleep before the next pass.

        Types are looked at when their next due time or lease deadline comes,
        when an enqueue wakes the scheduler for them, every ``interval`` while
        their ready list holds entries, and every ``_FULL_SWEEP`` intervals in
        any case (a wake-up may have been lost).
        """
        now = time.monotonic()
        todo = {t for t, at in self._next.items() if at <= now}
        if now - self._last_full >= _FULL_SWEEP * self._s.interval:
            try:
                self._types = await self._store.known_types()
            except ResponseError as exc:
                # the type set is unreadable (a value of the wrong type written by
                # someone else): sweep the types this process already knows
                self._metrics.increment("redis_errors")
                log.error("reading the set of event types failed: %s", exc)
            self._last_full = self._last_sweep = now
            todo |= self._types
        elif now - self._last_sweep >= self._s.interval:
            self._last_sweep = now
            todo |= self._active
        todo |= self._woken
        self._types |= self._woken
        self._woken.clear()
        for type_name in sorted(todo):
            try:
                await self._move(type_name)
            except ResponseError as exc:
                # Redis refused this type's script (say, a key of the wrong type
                # written by someone else): the other types must still move.
                self._metrics.increment("redis_errors", event_type=type_name)
                log.error("%s: moving due events failed: %s; trying again later", type_name, exc)
                self._next[type_name] = time.monotonic() + 10 * self._s.interval
        now = time.monotonic()
        nearest = min(self._next.values(), default=math.inf)
        return max(0.0, min(nearest - now, self._last_sweep + self._s.interval - now))

    async def _move(self, type_name: str) -> None:
        while True:
            r = await self._store.move_due(
                type_name, self._s.batch_size, self._s.visibility_ms, self._s.max_deliveries
            )
            if r.moved:
                self._metrics.increment("moved", r.moved, event_type=type_name)
            if r.dead:
                self._metrics.increment("dead_lettered", r.dead, event_type=type_name)
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
            if not r.more or self._stopping:
                break
            # A long drain keeps the lock fresh and lets this process's consumers run.
            if time.monotonic() - self._lock_taken_at > self._s.lock_ms / 3000:
                if not await self._take_lock():
                    return
            await anyio.lowlevel.checkpoint()
        # Ready entries need a look now and then (a consumer may die between
        # popping one and claiming it); due times and leases are in _next.
        if r.queued:
            self._active.add(type_name)
        else:
            self._active.discard(type_name)
        if r.next_ms is None:
            self._next.pop(type_name, None)
        else:
            self._next[type_name] = time.monotonic() + max(0, r.next_ms - r.now_ms) / 1000

    async def _listen(self) -> None:
        """Turn wake-up messages into early passes; resubscribe after disconnects."""
        backoff = 0.1
        while True:
            listener: WakeupListener = self._store.wakeups()
            try:
                await listener.subscribe()
                self.wake()  # messages may have been missed while unsubscribed
                backoff = 0.1
                while True:
                    name = await listener.next(timeout=self._s.listen_timeout)
                    if name and self.is_leader:
                        try:
                            validate_name(name)
                        except ValueError:  # not from an enqueue: someone else published it
                            log.debug("ignoring wake-up for invalid type name %r", name)
                            continue
                        self.wake(name)
            except Exception as exc:
                log.info("wake-up subscription dropped (%s); resubscribing in %.2fs", exc, backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    await listener.aclose()
