"""The scheduler's work for partitioned types, spread over every scheduler process.

Unpartitioned types are moved by the one leader of the prefix (see
:mod:`delayq.runtime.scheduler`). The partitions of partitioned types are not: each
partition (shard) has an owner, chosen by rendezvous hashing over the live
scheduler processes, so the moving of one hot type's due events is shared by
all processes, and each partition's scripts run on its own cluster node.

Membership is a sorted set ``{prefix}:schedulers`` (token -> heartbeat
deadline), refreshed by each process once per ``scheduling_interval``
(``members.lua``); it exists only while the prefix has a partitioned type, so
a prefix without one costs exactly what it did. Ownership only spreads work:
every move is one atomic script, so two processes that disagree on an owner for
a moment just both look at a partition, never move an event twice.

A process moves the partitions it owns as the leader moves types (at due times,
on wake-ups, at every sweep). For the partitions it does not own it behaves as
a standby does for the leader: it looks ``takeover_delay`` after each due time
or lease deadline. If it then finds events still there (at least half ``takeover_delay`` overdue)
the owner has stopped moving (killed, or its event loop stalled): it has just
moved them itself, and it evicts the owner from the membership, which publishes
``:members`` so every process recomputes the owners at once (unless it looked
``takeover_delay / 2`` late itself: then the owner most likely stalled with
it, and its next look on time decides). A dead process's partitions are
therefore late by about ``takeover_delay``, not by the membership's time to
live. A process that stops gracefully leaves the
membership (and publishes the same message).

A failure on one cluster node delays only what lives there. Each partition's move
runs as its own task and fails and backs off on its own (0.1 s doubling, at most
:data:`~delayq._pacing.Backoffs` ``cap`` 0.5 s, so a partition whose node failed over
resumes within about half a second of the promotion), while the other partitions
keep their times; a move that hangs holds up only its partition. The membership
lives on the ``{prefix}`` node: while a beat fails, a process keeps the members it
last read and moves the partitions it owned under them **until its lease on them
ends** (its entry's time to live, counted from when its last good beat was sent:
the others forget it no earlier). Past that it owns nothing and looks at every
partition as a non-owner does, ``takeover_delay`` late, until a beat goes through.
Moving is atomic and idempotent, so the overlap this allows (another process
taking the partitions over while this one still moves them) moves nothing twice.

(Over 400 lines: one job, moving the partitions, whose membership, per-partition
moves and planning share one state: who owns what and when each partition is due;
split apart, each half would read and write the other's.)

A process joins only once its wake-up subscription is up: an enqueue publishes
a wake-up only when it brings a partition's next due time forward, so an owner
that missed one would not look at that partition until its next full sweep,
while the others would move its events ``takeover_delay`` late and evict it.
Joining (a beat that adds the caller publishes ``:members`` too, so the others
hear of it at once), coming back after an eviction, and every (re)subscribe
make the process look at every partition at once.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable

import anyio
import anyio.abc

from .._pacing import Backoffs, Wakeup, poll
from ..storage.store import Store

__all__ = ["Spread", "owner_of"]

log = logging.getLogger("delayq.spread")

_FULL_SWEEP = 10

Drain = Callable[[str, dict[str, float], set[str]], Awaitable[int]]


def owner_of(shard: str, members: Iterable[str]) -> str | None:
    """The member that owns ``shard``: highest hash of ``member/shard`` (rendezvous hashing).

    When a member leaves, only its own shards change owner.
    """
    best: str | None = None
    best_score = -1
    for member in members:
        # a real mix, not CRC-32: CRC is affine, so two members' CRCs would
        # compare alike for most shards
        score = int.from_bytes(
            hashlib.blake2b(f"{member}/{shard}".encode(), digest_size=8).digest(), "big"
        )
        if score > best_score or (score == best_score and best is not None and member < best):
            best, best_score = member, score
    return best


class Spread:
    """Moves the due events of partitioned types; owned and run by the :class:`Scheduler`."""

    def __init__(
        self,
        store: Store,
        *,
        token: str,
        interval: float,
        takeover_delay: float,
        member_ttl_ms: int,
        drain: Drain,
        on_error: Callable[[], None],
    ):
        self._store = store
        self.token = token
        self._interval = interval
        self._delay = takeover_delay
        self._ttl_ms = member_ttl_ms
        self._drain = drain
        self._on_error = on_error
        self._stopping = False
        self._units: set[str] = set()
        self.members: list[str] = []
        self._owners: dict[str, str | None] = {}
        self._next: dict[str, float] = {}
        self._active: set[str] = set()
        self._woken: set[str] = set()
        self._last_beat = -math.inf
        self._last_sweep = -math.inf
        self._last_full = -math.inf
        self._joined = False
        self._heard = False  # the scheduler's wake-up subscription has been up
        self._wake_at = math.inf  # when the last pass planned the next one
        self._wake = Wakeup(armed=True)
        self._moving: set[str] = set()  # partitions with a move under way (a task each)
        self._moves: anyio.abc.TaskGroup | None = None
        self._failing = Backoffs()  # per partition, and "" for the membership
        self._lease_end = -math.inf  # when the members forget this process (monotonic)
        self._evict: dict[str, int] = {}  # owners found silent by the moves, ms overdue
        self._in_membership = False  # its task (beat, evictions) is under way

    # -- what the scheduler tells it ---------------------------------------------

    def set_units(self, units: set[str]) -> None:
        """The partition shards that exist under the prefix (from the scheduler's sweeps)."""
        if units - self._units:
            self._last_full = -math.inf
            self._interrupt()
        self._units = set(units)

    def on_message(self, shard: str) -> None:
        """An enqueue made an earlier due time in ``shard``."""
        if shard not in self._units:
            self._units.add(shard)
        # noted as due now (the owner looks at once, the others ``takeover_delay``
        # later), so that a pass that fails before reaching it does not forget it
        self._next[shard] = min(self._next.get(shard, math.inf), time.monotonic())
        if self.mine(shard):
            self._woken.add(shard)
        self._interrupt()

    def listening(self) -> None:
        """The scheduler's wake-up subscription is up: the process may join."""
        self._heard = True
        self._interrupt()

    def sweep(self) -> None:
        """Look at every partition at the next pass (wake-ups may have been missed)."""
        self._last_full = -math.inf
        self._interrupt()

    def members_changed(self) -> None:
        """Someone joined or left: read the membership at once."""
        self._last_beat = -math.inf
        self._interrupt()

    def stop(self) -> None:
        """End :meth:`run` (it leaves the membership on the way out)."""
        self._stopping = True
        self._interrupt()

    def _interrupt(self) -> None:
        self._wake.set()

    # -- ownership -----------------------------------------------------------------

    def owned(self) -> set[str]:
        """The shards this process moves as their owner."""
        return {u for u in self._units if self.mine(u)}

    def mine(self, shard: str) -> bool:
        """True when this process owns ``shard`` (or knows of no other process); nothing
        is its own once its lease has ended without a beat getting through."""
        if not self.members:
            return True
        if self._joined and time.monotonic() >= self._lease_end:
            return False
        owner = self._owners.get(shard)
        if owner is None:
            owner = self._owners[shard] = owner_of(shard, self.members)
        return owner == self.token

    def _set_members(self, members: list[str]) -> None:
        if self.token not in members and not self._stopping:
            members = sorted([*members, self.token])
        if members != self.members:
            log.info(
                "scheduler %s: %d scheduler processes share the partitions",
                self.token[:8],
                len(members),
            )
            self.members = members
            self._owners = {}
            self._last_full = -math.inf  # new owners look at their partitions now

    # -- the loop --------------------------------------------------------------------

    async def run(self) -> None:
        """Move partitions until :meth:`stop`."""
        try:
            async with anyio.create_task_group() as self._moves:
                await self._loop()
                self._moves.cancel_scope.cancel()
        finally:
            self._moves = None
            self._moving.clear()
            self._in_membership = False
            if self._joined:
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    try:
                        await self._store.scheduling.scheduler_membership(
                            self.token, self._ttl_ms, "leave"
                        )
                    except Exception as exc:
                        log.debug("leaving the scheduler membership failed: %s", exc)

    async def _loop(self) -> None:
        # without a subscription after this long, join anyway: pub/sub only makes
        # moves faster, the timed looks and sweeps are what guarantee them
        join_by = time.monotonic() + _FULL_SWEEP * self._interval
        await poll(
            lambda: self._turn(join_by),
            wake=self._wake,
            stopping=lambda: self._stopping,
            log=log,
            what="moving partitions",
            on_error=self._on_error,
        )

    async def _turn(self, join_by: float) -> float:
        """One pass; how long to wait before the next (0 while wake-ups are pending)."""
        if not self._units:
            self._woken.clear()  # (wake-ups for shards of a layout gone since)
            return math.inf  # no partitioned type: no command at all
        if not (self._heard or self._joined or await self._alone(join_by)):
            return self._interval  # or until the subscription is up
        await self._membership()
        sleep_for = await self._pass()
        return 0.0 if self._woken and self._joined else sleep_for

    async def _alone(self, join_by: float) -> bool:
        """Whether to join before the wake-up subscription is up: when no other process
        moves the partitions, or after ``join_by`` (pub/sub only makes moves faster)."""
        if time.monotonic() >= join_by:
            log.warning(
                "scheduler %s: no wake-up subscription yet; joining the partitions' owners anyway",
                self.token[:8],
            )
            return True
        members, _ = await self._store.scheduling.scheduler_membership(
            self.token, self._ttl_ms, "read"
        )
        return not members

    def _next_beat(self) -> float:
        return max(self._last_beat + self._interval, self._failing.until(""))

    async def _membership(self) -> None:
        """Evict the owners found silent and beat once per ``interval``: awaited until the
        process has joined, then a task of its own, so that a call to the ``{prefix}``
        node that fails slowly holds up no partition's move."""
        if self._in_membership or (not self._evict and time.monotonic() < self._next_beat()):
            return
        if not self._joined:
            await self._keep_membership()
            return
        assert self._moves is not None
        self._in_membership = True
        self._moves.start_soon(self._membership_task)

    async def _membership_task(self) -> None:
        try:
            await self._evict_silent()
            await self._keep_membership()
        finally:
            self._in_membership = False
            self._interrupt()

    async def _keep_membership(self) -> None:
        """Beat once per ``interval``. A failed beat (the ``{prefix}`` node is away) does
        not stop the moves: the last membership read holds until this process's lease
        ends (see the module's docstring); the beat is tried again on its own backoff."""
        now = time.monotonic()
        if now < self._next_beat():
            return
        try:
            await self._beat()
        except Exception as exc:
            if not self._joined:
                raise  # no membership read yet: nothing to go on with
            self._on_error()
            wait = self._failing.failed("", now)
            left = self._lease_end - now
            if left > 0:
                log.warning(
                    "scheduler %s: the membership is out of reach (%s: %s); moving "
                    "the partitions it owned for %.1fs more, trying again in %.2fs",
                    self.token[:8],
                    type(exc).__name__,
                    exc,
                    left,
                    wait,
                )
            else:
                log.warning(
                    "scheduler %s: the membership is out of reach (%s: %s) past "
                    "this process's lease: it moves partitions only as a standby, "
                    "trying again in %.2fs",
                    self.token[:8],
                    type(exc).__name__,
                    exc,
                    wait,
                )
            return
        if self._failing.succeeded(""):
            log.info("scheduler %s: the membership is back", self.token[:8])

    async def _beat(self) -> None:
        sent = time.monotonic()
        members, added = await self._store.scheduling.scheduler_membership(self.token, self._ttl_ms)
        if added:
            # joined, or back after an eviction or an expiry: what this process knew of
            # its partitions' due times may be stale (that is why it was evicted)
            if self._joined:
                log.info("scheduler %s: back among the partitions' owners", self.token[:8])
            self._last_full = -math.inf
        if time.monotonic() >= self._lease_end:
            self._owners = {}  # (owners cached while nothing was its own)
            self._last_full = -math.inf
        self._lease_end = sent + self._ttl_ms / 1000  # Redis set the deadline after `sent`
        self._set_members(members)
        self._joined = True
        self._last_beat = time.monotonic()

    async def _pass(self) -> float:
        """Start a move for every partition that needs a look (its own task; see
        :meth:`_move`); return how long to sleep. A move that ends wakes the loop."""
        now = time.monotonic()
        delay = self._delay
        behind = max(0.0, now - self._wake_at)  # this process's own stall before the pass
        todo: set[str] = set()
        for unit, at in self._next.items():
            if at + (0 if self.mine(unit) else delay) <= now:
                todo.add(unit)
        if now - self._last_full >= _FULL_SWEEP * self._interval:
            self._last_full = self._last_sweep = now
            todo |= self._units
        elif now - self._last_sweep >= self._interval:
            self._last_sweep = now
            todo |= {u for u in self._active if self.mine(u)}
        todo |= self._woken
        self._woken.clear()
        assert self._moves is not None
        for unit in sorted(todo - self._moving):
            if self._stopping:
                break
            if self._failing.waiting(unit, now):
                self._next[unit] = min(self._next.get(unit, math.inf), now)  # at its retry
                continue
            self._moving.add(unit)
            self._moves.start_soon(self._move, unit, behind)
        if self._evict:
            await self._membership()
        now = time.monotonic()
        wake_at = min(
            (
                max(at + (0 if self.mine(u) else delay), self._failing.until(u))
                for u, at in self._next.items()
                if u not in self._moving
            ),
            default=math.inf,
        )
        beat_at = math.inf if self._in_membership else self._next_beat()  # (its task wakes)
        wake_at = min(wake_at, beat_at, self._last_full + _FULL_SWEEP * self._interval)
        if any(self.mine(u) for u in self._active):
            wake_at = min(wake_at, self._last_sweep + self._interval)
        self._wake_at = wake_at
        return max(0.0, wake_at - now)

    async def _move(self, unit: str, behind: float) -> None:
        """One partition's move, as a task of its own: a partition whose node fails (or
        hangs) backs off alone while the others keep moving."""
        try:
            late = await self._drain(unit, self._next, self._active)
        except Exception as exc:
            self._move_failed(unit, exc)
        else:
            # a partition this process could not move either was left overdue by its
            # node, not by its owner: no eviction for that
            was_failing = self._failing.succeeded(unit)
            if was_failing:
                log.info("%s: moving due events again", unit)
            owner = None if self.mine(unit) else self._owners.get(unit)
            # half the delay it looked after: see Scheduler._standby_pass
            if owner is not None and late >= self._delay * 500 and not was_failing:
                if behind < self._delay / 2:
                    self._evict[owner] = max(self._evict.get(owner, 0), late)
                else:
                    # this process looked late itself (its loop or the machine stalled):
                    # the owner may have stalled with it, so this is no proof it died;
                    # the next look, if on time, decides
                    log.info(
                        "scheduler %s: moved partitions that %s left %d ms overdue, "
                        "looking %d ms late itself; not evicting it",
                        self.token[:8],
                        owner[:8],
                        late,
                        behind * 1000,
                    )
        finally:
            self._moving.discard(unit)
            self._interrupt()

    def _move_failed(self, unit: str, exc: Exception) -> None:
        self._on_error()
        now = time.monotonic()
        # this partition alone waits; the others must still move
        self._failing.move_failed(
            unit, exc, now, refused_wait=_FULL_SWEEP * self._interval, log=log
        )
        self._next[unit] = min(self._next.get(unit, math.inf), now)  # looked at on retry

    async def _evict_silent(self) -> None:
        """Evict the owners whose partitions the moves found overdue (each publishes
        ``:members``); one that fails (the membership's node is away) is let go: its
        partitions were moved anyway, and the next overdue look tries again."""
        evict, self._evict = self._evict, {}
        for owner, late in evict.items():
            log.warning(
                "scheduler %s: moved partitions that %s left %d ms overdue; taking them over",
                self.token[:8],
                owner[:8],
                late,
            )
            try:
                members, _ = await self._store.scheduling.scheduler_membership(
                    self.token, self._ttl_ms, f"evict:{owner}"
                )
            except Exception as exc:
                self._on_error()
                log.info("scheduler %s: evicting %s failed (%s)", self.token[:8], owner[:8], exc)
                continue
            self._set_members(members)
            self._last_beat = time.monotonic()
