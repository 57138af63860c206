"""The scheduler: moves due events of every type to their ready lists.

One scheduler per prefix leads at a time, the holder of a short-TTL lock; the
others stand by. The lock only saves work: each move is one atomic script, so
two schedulers moving at once never move an event twice.

The leader sleeps until the earliest time any type needs a look (a due time,
a lease deadline, an orphan check), at most ``scheduling_interval``, and wakes
early when an enqueue publishes that it made an earlier due time. A type with
more due than one batch is handed to the leader's drainer task, which moves it
batch after batch while the passes go on, so a burst of one type never holds up
the moves of another (:mod:`delayq.runtime.mover` makes every move and runs the
drainer). Every ``scheduling_interval`` it looks at every type with events
pending, and every ten intervals at all types, so a lost wake-up only delays,
never strands, an event.

A standby watches the same times ``takeover_delay`` later. If it then finds an
event still not moved (the leader died, or its process stopped running), it
moves it itself and takes the lock from the silent leader with a
compare-and-set on the token it last saw, so a dead leader is replaced within
``takeover_delay`` instead of the lock's time to live. A leader that stops
gracefully releases the lock and publishes so on the wake-up channel, and a
standby takes it at once.

A failure reaches only what it touches: a type whose move fails backs off alone
(:mod:`delayq.runtime.mover`), and a leader that cannot reach the lock goes on
leading until its lease on it ends (:mod:`delayq.runtime.leadership`), so a cluster
node failing over delays only the types on that node, the lock's node included.

Partitioned types are not moved by the leader: their partitions are spread
over every scheduler process (see :mod:`delayq.partitions.spread`, run by this class).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from .._pacing import MAX_BACKOFF, Stoppable, Wakeup, listen, poll
from ..errors import RedisResponseError
from ..events import validate_name
from ..metrics import ServiceMetrics
from ..partitions.shards import parse_shard
from ..partitions.spread import Spread
from ..storage.dependencies import RELAY_WAKE
from ..storage.store import Store
from .leadership import Leadership
from .mover import Mover
from .relay import Relay

if TYPE_CHECKING:
    from ..operations.groups import PendingGroups

__all__ = ["Scheduler", "SchedulerSettings"]

log = logging.getLogger("delayq.scheduler")

# Every this many scheduling intervals, all known types get a look, even idle ones.
_FULL_SWEEP = 10
# Published on the wake-up channel by a leader that released the lock (see lock_release.lua).
_RELEASED = ":released"
# Published when a scheduler process leaves the membership or is evicted (see members.lua).
_MEMBERS = ":members"
# Published when a recurring schedule is written (see schedule_index.lua).
_SCHEDULES = ":schedules"


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """The service options the scheduler needs."""

    interval: float
    batch_size: int
    visibility_ms: int
    max_deliveries: int
    lock_ms: int
    takeover_delay: float = 0.5
    listen_timeout: float = 5.0  # below the blocking client's socket timeout


class Scheduler(Stoppable):
    """The loop that moves due events; run it with :meth:`run`, end it with :meth:`stop`
    (which stops the spread too; ``run`` releases the lock on its way out)."""

    def __init__(self, store: Store, settings: SchedulerSettings, metrics: ServiceMetrics):
        super().__init__()
        self._store = store
        self._s = settings
        self._metrics = metrics
        self._token = uuid.uuid4().hex
        self.pending: PendingGroups | None = None
        """The service's groups waiting for registration: registered before a move."""
        self._wake = Wakeup()
        self._woken: set[str] = set()
        self._types: set[str] = set()
        # moves types' due events; its next, active and backlog say when each needs a look
        self._mover = Mover(
            store,
            metrics,
            interval=settings.interval,
            batch_size=settings.batch_size,
            visibility_ms=settings.visibility_ms,
            max_deliveries=settings.max_deliveries,
            is_leader=lambda: self.leadership.is_leader,
            stopping=lambda: self._stopping,
            interrupt=self._interrupt,
        )
        self._last_sweep = -math.inf
        self._last_full = -math.inf
        self.leadership = Leadership(
            store,
            metrics,
            lock_ms=settings.lock_ms,
            interval=settings.interval,
            token=lambda: self._token,
            on_leading=self._leading,
        )
        """The scheduler lock as this process holds it."""
        self.on_schedules: Callable[[], None] | None = None
        """Called on a ``:schedules`` wake-up and after each (re)subscription (the firer's wake)."""
        self.relay = Relay(
            store, metrics, interval=settings.interval, is_leader=lambda: self.is_leader
        )
        """Hands parents' completions to their children (docs/WORKFLOWS.md)."""
        self.spread = Spread(
            store,
            token=self._token,
            interval=settings.interval,
            takeover_delay=settings.takeover_delay,
            member_ttl_ms=settings.lock_ms,
            drain=self._mover.drain,
            on_error=lambda: self._metrics.increment("redis_errors"),
        )

    @property
    def token(self) -> str:
        """This process's name in the scheduler lock and in the partitions' membership."""
        return self._token

    @token.setter
    def token(self, token: str) -> None:
        self._token = self.spread.token = token  # one name for both (tests choose tokens)

    @property
    def is_leader(self) -> bool:
        """True while this process holds the scheduler lock (or its lease on it)."""
        return self.leadership.is_leader

    def _stopped(self) -> None:
        self.spread.stop()  # run() releases the lock on its way out

    def wake(self, type_name: str | None = None) -> None:
        """Look at ``type_name`` (or sweep all types and partitions) now rather than at the
        next planned time."""
        if type_name is not None and "#" in type_name:
            self.spread.on_message(type_name)
            return
        if type_name is None:
            self._last_full = -math.inf
            self.spread.sweep()
        else:
            self._woken.add(type_name)
        self._interrupt()

    def _interrupt(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Move due events until :meth:`stop`."""
        self._wake.renew()
        self._mover.reset()
        try:
            with anyio.CancelScope() as self._scope:
                if self._stopping:
                    return
                async with anyio.create_task_group() as tg:
                    self.leadership.tasks = tg
                    tg.start_soon(self._listen)
                    tg.start_soon(self.spread.run)
                    tg.start_soon(self._mover.drainer)
                    tg.start_soon(self.relay.run)
                    await poll(
                        self._turn,
                        wake=self._wake,
                        stopping=lambda: self._stopping,
                        log=log,
                        what="scheduler pass",
                        on_error=lambda: self._metrics.increment("redis_errors"),
                    )
                    self.spread.stop()
                    tg.cancel_scope.cancel()
        finally:
            self.leadership.tasks = None
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await self.leadership.release()

    async def _turn(self) -> float:
        """One pass; 0 while wake-ups are pending (they stay until a pass succeeds)."""
        if await self.leadership.hold():
            sleep_for = await self._pass()
        else:
            sleep_for = await self._standby_pass()
        return 0.0 if self._woken else sleep_for

    def _leading(self) -> None:
        self._last_full = -math.inf  # a new leader looks at everything first

    async def _standby_pass(self) -> float:
        """Move what the leader left overdue by ``takeover_delay``; take over if any.

        A standby looks at a type ``takeover_delay`` after the time the leader
        should have (as learned from its own looks and from wake-ups), and at
        every type every ``_FULL_SWEEP`` intervals. It returns how long to sleep.
        """
        delay = self._s.takeover_delay
        now = time.monotonic()
        if self._woken:
            # wake-ups heard while leading, the lock lost before the pass that takes them: a
            # standby looks at those types takeover_delay from now, as at a wake-up heard
            # standing by. Left set, they kept _loop from ever sleeping: it spun without
            # awaiting, holding up the process's event loop (enqueues, handlers) for an
            # interval at a time until the next lock attempt, for as long as it stood by.
            for name in self._woken:
                self._standby_look(name, now)
            self._woken.clear()
        todo = {t for t, at in self._mover.next.items() if at + delay <= now}
        if now - self._last_full >= _FULL_SWEEP * self._s.interval:
            self._types = await self._known_types()
            self._last_full = now
            todo |= self._types
        late = 0
        for type_name in sorted(todo):
            late = max(late, await self._mover.move_or_log(type_name))
        # it looked takeover_delay after the due times: what it found still there was left
        # by the leader. The bar is half that, for a look timed from a clock read within a
        # round trip: at exactly takeover_delay, late came out 499 or 500 ms as the round
        # trips fell, and a loaded host's standbys moved everything just under the bar,
        # never taking over until the dead leader's lock expired (60 s in the fault test)
        if late >= delay * 500 and not self._stopping:
            await self.leadership.take_over(late)
            if self.is_leader:
                return 0.0
        now = time.monotonic()
        wake_at = min(
            min(self._mover.next.values(), default=math.inf) + delay,
            self.leadership.next_try(),
            self._last_full + _FULL_SWEEP * self._s.interval,
        )
        return max(0.0, wake_at - now)

    async def _known_types(self) -> set[str]:
        """The unpartitioned types (the leader's); the partitions go to the spread."""
        try:
            names = await self._store.types.known_types()
            shards = {s for name in names for s in self._store.types.shards(name)}
            self.spread.set_units({s for s in shards if "#" in s})
            return {s for s in shards if "#" not in s}
        except Exception as exc:
            # the type set is unreadable (a value of the wrong type written by someone
            # else), or its node is away: sweep the types this process already knows
            self._metrics.increment("redis_errors")
            level = logging.ERROR if isinstance(exc, RedisResponseError) else logging.WARNING
            log.log(
                level, "reading the set of event types failed (%s: %s)", type(exc).__name__, exc
            )
            return self._types

    async def _pass(self) -> float:
        """Move what is due; return how long to sleep before the next pass.

        Types are looked at when their next due time or lease deadline comes,
        when an enqueue wakes the scheduler for them, every ``interval`` while
        their ready list holds entries, and every ``_FULL_SWEEP`` intervals in
        any case (a wake-up may have been lost).
        """
        if self.pending is not None and self.pending.any:
            await self.pending.flush()  # a group added here gets every event moved from now on
        now = time.monotonic()
        todo = {t for t, at in self._mover.next.items() if at <= now}
        if now - self._last_full >= _FULL_SWEEP * self._s.interval:
            self._types = await self._known_types()
            self._last_full = self._last_sweep = now
            todo |= self._types
        elif now - self._last_sweep >= self._s.interval:
            self._last_sweep = now
            todo |= self._mover.active
        todo |= self._woken
        self._types |= self._woken
        self._woken.clear()
        for type_name in sorted(todo - self._mover.backlog):  # the drainer has the backlogs
            await self._mover.move_or_log(type_name)
        now = time.monotonic()
        nearest = min(
            (at for t, at in self._mover.next.items() if t not in self._mover.backlog),
            default=math.inf,
        )
        return max(0.0, min(nearest - now, self._last_sweep + self._s.interval - now))

    async def _listen(self) -> None:
        """Turn wake-up messages into early passes; resubscribe after disconnects."""
        await listen(
            self._store.wakeups,
            self._on_message,
            log=log,
            what="wake-up subscription",
            timeout=self._s.listen_timeout,
            # (one dropped soon after SUBSCRIBE was made again every 0.1 s, with a sweep)
            hold=MAX_BACKOFF,
            on_subscribed=self._subscribed,
        )

    def _subscribed(self) -> None:
        # the partitions' owners are those that hear wake-ups: join now; and messages
        # may have been missed while unsubscribed: look at everything
        self.spread.listening()
        self.wake()
        self.relay.wake()
        if self.on_schedules is not None:
            self.on_schedules()

    def _on_message(self, name: str) -> None:
        """A leader looks at a woken type now; a standby ``takeover_delay`` from now."""
        if name == _RELEASED:
            if not self.is_leader:
                self.leadership.released()  # the lock is free: try it at once
                self._interrupt()
            return
        if name == _MEMBERS:
            self.spread.members_changed()
            return
        if name == _SCHEDULES:
            if self.on_schedules is not None:
                self.on_schedules()
            return
        try:
            validate_name(name if "#" not in name else parse_shard(name)[0])
        except ValueError:  # not from an enqueue: the relay's (no type name has ':'), or not ours
            if name.startswith(RELAY_WAKE):
                self.relay.wake(name[len(RELAY_WAKE) :])
            else:
                log.debug("ignoring wake-up for invalid type name %r", name)
            return
        if "#" in name:
            self.spread.on_message(name)
            return
        if self.is_leader:
            self.wake(name)
        else:
            self._standby_look(name, time.monotonic())
            self._interrupt()

    def _standby_look(self, name: str, now: float) -> None:
        """A standby's answer to a wake-up for ``name``: the new due time may be soon, so
        look ``takeover_delay`` after ``now`` whether the leader moved it."""
        self._types.add(name)
        self._mover.next[name] = min(self._mover.next.get(name, math.inf), now)
