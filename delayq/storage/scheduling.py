"""Moving scheduled events: the scheduler's lock and membership, ``move_due``, running one
event now (the dashboard's action), reading shards to migrate."""

from __future__ import annotations

from typing import Any, cast

from ..keyspace.scripts import LEVEL_KEYS
from .base import StoreCore
from .dependencies import nudge_relay
from .groups import DeliveryGroups
from .records import MoveResult


class Scheduling:
    """What the scheduler loop (and repartitioning) asks of Redis (``groups``: the moves
    and run-now reach every delivery group)."""

    def __init__(self, core: StoreCore, groups: DeliveryGroups):
        self._core = core
        self._groups = groups
        # shards whose type has dependencies (a move told): moves send their keys
        self._dependents: set[str] = set()

    async def scheduler_membership(
        self, token: str, ttl_ms: int, mode: str = "beat"
    ) -> tuple[list[str], bool]:
        """Keep ``token`` in the scheduler membership (``beat``), leave it (``leave``),
        evict another member (``evict:<token>``), or only read it (``read``).

        Returns the live members, sorted, and whether this beat added ``token`` (it was
        not a member: it joins, or comes back after an eviction or an expiry).
        """
        reply = await self._core.scripts["members"](
            keys=[self._core.keys.members],
            args=[token, ttl_ms, mode, self._core.keys.wakeup_channel],
        )
        members = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in reply[1:])
        return members, int(reply[0]) == 1

    async def take_lock(self, token: str, ttl_ms: int) -> tuple[bool, str | None]:
        """Take or renew the scheduler lock.

        Returns whether ``token`` holds it now, and otherwise the holder's token.
        """
        r = await self._core.scripts["lock_take"](
            keys=[self._core.keys.scheduler_lock], args=[token, ttl_ms]
        )
        if int(r[0]):
            return True, None
        holder = r[1] if len(r) > 1 else None
        return False, holder.decode("utf-8", "replace") if isinstance(holder, bytes) else holder

    async def steal_lock(self, holder: str, token: str, ttl_ms: int) -> bool:
        """Take the lock if ``holder`` (or nobody) still holds it; True when ``token`` holds it."""
        return bool(
            await self._core.scripts["lock_steal"](
                keys=[self._core.keys.scheduler_lock], args=[holder, token, ttl_ms]
            )
        )

    async def release_lock(self, token: str) -> bool:
        """Release the scheduler lock if ``token`` holds it, and tell the standbys so."""
        return bool(
            await self._core.scripts["lock_release"](
                keys=[self._core.keys.scheduler_lock], args=[token, self._core.keys.wakeup_channel]
            )
        )

    async def move_due(
        self, shard: str, batch: int, visibility_ms: int, max_deliveries: int
    ) -> MoveResult:
        """Move due, expired and orphaned events of one type to its ready list.

        For a type with delivery groups: to the ready list of every group.
        """
        args = [batch, visibility_ms, max_deliveries]
        # the dependencies' keys (the last ones) only for a type that has them: a lease
        # expiring on a parent's last delivery is handed to its children (move_due.lua)
        dependent = shard in self._dependents
        last = None if dependent else LEVEL_KEYS[-1]
        r = await self._groups.every_group("group_move", shard, args, ("move_due", args), last)
        if r[1] == 2 and not dependent:  # it has them after all: again, with their keys
            self._dependents.add(shard)
            return await self.move_due(shard, batch, visibility_ms, max_deliveries)
        if dependent and r[4] and not isinstance(r[4], list):  # parents' completions wait
            await nudge_relay(self._core, shard)
        next_ms = int(r[2])
        dead, dead_groups = r[4], {}
        if isinstance(dead, list):  # group_move: [group, count, ...]
            dead_groups = {
                (g.decode() if isinstance(g, bytes) else str(g)): int(n)
                for g, n in zip(dead[::2], dead[1::2])
            }
            dead = sum(dead_groups.values())
        return MoveResult(
            moved=int(r[0]),
            more=bool(int(r[1])),
            next_ms=None if next_ms < 0 else next_ms,
            now_ms=int(r[3]),
            dead=int(dead),
            dead_groups=dead_groups,
            queued=int(r[5]),
            late_ms=int(r[6]),
            missing=list(r[7:]),
        )

    async def run_now(self, shard: str, event_id: str, group: str | None = None) -> bool:
        """Move a scheduled event to the ready list now; False when it is not scheduled.

        For a type with delivery groups an event not fanned out yet is fanned out
        now, ready for ``group`` (every group when None) and due at its time for
        the others; one already fanned out runs now where ``group`` (or any group)
        has it waiting for a retry. See ``lua/group_run_now.lua``.
        """
        args = [event_id, group or ""]
        return bool(await self._groups.every_group("group_run_now", shard, args, ("run_now", args)))

    async def peek_scheduled(self, shard: str, count: int) -> list[tuple[bytes, bytes, int, int]]:
        """Up to ``count`` scheduled events of a shard, earliest first: (id, envelope, due ms,
        priority level)."""
        k = self._core.view(shard)
        reply: list[Any] = await self._core.redis.zrange(k.scheduled, 0, count - 1, withscores=True)
        if not reply:
            return []
        ids = [m for m, _ in reply]
        async with self._core.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(k.events, ids)
            pipe.hmget(self._core.keys.for_shard(shard).prio, ids)
            envelopes, levels = await pipe.execute()
        return [
            (cast(bytes, m), cast(bytes, env), int(score), int(level or 0))
            for (m, score), env, level in zip(reply, envelopes, levels, strict=True)
            if env is not None
        ]

    async def migrate_out(self, shard: str, event_id: bytes, envelope: bytes) -> bool:
        """Remove a copied event from a retired layout, if it is still that version."""
        return bool(await self._core.run("migrate_out", shard, [event_id, envelope]))

    async def has_groups(self, shard: str) -> bool:
        """True when the shard's type has named delivery groups."""
        return bool(await self._core.redis.exists(self._core.view(shard).groups))
