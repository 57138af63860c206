"""Consumers' calls: pop a ready entry, claim it under a lease, then ack, renew or fail."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, cast

from ..keyspace.scripts import LEVEL_KEYS
from .base import StoreCore, log
from .dependencies import nudge_relay
from .priorities import Levels
from .records import Claimed, Throttle

# the last key of a call that needs the priority levels and not the dependencies'
_LAST_LEVEL = LEVEL_KEYS[-1]


class Deliveries:
    """One delivery's life on the consumer side, for one group of a type."""

    def __init__(self, core: StoreCore):
        self._core = core
        # (shard, group) whose claims have met a flow key: they send the flow keys' five too
        self._keyed_claims: set[tuple[str, str | None]] = set()
        # shards whose type has dependencies (an ack told): acks send their keys
        self._dependents: set[str] = set()
        # seconds a BRPOP may block at most, whatever its caller asks (see limit_block)
        self._block_at_most = math.inf
        self.levels = Levels(core)
        """The ready lists by priority level, and the views known to use levels."""

    def limit_block(self, seconds: float) -> None:
        """Make every BRPOP block ``seconds`` at most: set below the server's idle ``timeout``.

        Redis closes a connection idle for longer than its ``timeout``; a blocked client
        is exempt, but one that an enqueue has just unblocked is not, until its reply is
        written: a BRPOP that had waited longer than ``timeout`` could lose the entry it
        popped (it comes back only when its lease runs out). A BRPOP that blocks less
        than ``timeout`` never looks idle that long.
        """
        self._block_at_most = seconds

    async def pop_ready(
        self, shard: str, timeout: float, *, group: str | None = None
    ) -> tuple[bytes, int] | None:
        """Block up to ``timeout`` seconds for one ready entry of a group (BRPOP) and
        return it with its priority level: BRPOP takes the levels' lists in order, so
        the entry is the most urgent level's (lists never used do not exist and cost a
        blocked BRPOP only their names)."""
        timeout = min(timeout, self._block_at_most)
        reply = await self._core.blocking.brpop(
            self.levels.ready_lists(shard, group), timeout=timeout
        )
        if reply is None:
            return None
        return cast(bytes, reply[1]), self.levels.level_of_list(shard, group, cast(bytes, reply[0]))

    async def claim(
        self,
        shard: str,
        popped: Sequence[bytes],
        more: int,
        visibility_ms: int,
        *,
        group: str | None = None,
    ) -> tuple[int, list[Claimed]]:
        """Claim ``popped`` entries plus up to ``more`` from a group's ready list.

        Returns Redis's time in µs and the events now leased to the caller.
        """
        now_us, claimed, _ = await self.claim_limited(
            shard, popped, more, visibility_ms, group=group
        )
        return now_us, claimed

    async def claim_limited(
        self,
        shard: str,
        popped: Sequence[bytes],
        more: int,
        visibility_ms: int,
        *,
        group: str | None = None,
        level: int = 0,
    ) -> tuple[int, list[Claimed], Throttle | None]:
        """:meth:`claim`, and how the group's flow limits held it back (None: they did not).

        Entries the limits did not allow went back to the ready list, in order. ``level``:
        the priority level ``popped`` came from (:meth:`pop_ready`); once a view has shown
        a level above 0, its claims take from the most urgent non-empty level first.
        """
        # a flow key's marker ("k:<key>", claim.lua) needs the flow keys' state too (a
        # claim without it puts a marker it pops back); a type that never showed one
        # sends its keys only up to the limits
        keyed = (shard, group) in self._keyed_claims
        # one C-level search, no generator per entry (a plain id containing "\0k:" only
        # makes the claim send the five keys too: harmless)
        if not keyed and (b"\0" + b"\0".join(popped)).find(b"\0k:") >= 0:
            keyed = True
            self._keyed_claims.add((shard, group))
        # with min_replicas the claim waits for the replicas too (WAIT): a handler runs on a
        # claim the next master has. A claim the old master alone took is undone by a
        # failover, and its event runs again there (the ack finds no lease of its own)
        last = None if keyed else "limits"
        args: list[Any] = [visibility_ms, more, *popped]
        if self.levels.levelled(shard, group):
            last, args[1] = None, f"{more}/{level}"
        r = await self._core.run("claim", shard, args, group=group, last=last, durable=True)
        throttle = None
        head = r[0]
        if isinstance(head, list):
            reason = head[2].decode() if isinstance(head[2], bytes) else str(head[2])
            if reason == "levels":  # aging is set: claims must see every level's list
                self.levels.mark_levelled(shard, group)
                return await self.claim_limited(
                    shard, [], more + len(popped), visibility_ms, group=group
                )
            throttle = Throttle(int(head[1]), reason, int(head[3]), int(head[4]))
            head = head[0]
        claimed = [
            Claimed(
                raw_id=r[i],
                envelope=r[i + 1],
                attempt=int(r[i + 2]),
                due_ms=int(r[i + 3]) if r[i + 3] else None,
                token=r[i + 4],
            )
            for i in range(1, len(r), 5)
        ]
        if any(c.attempt == 0 for c in claimed):
            missing = [c.raw_id for c in claimed if c.attempt == 0]
            log.warning(
                "%s: dropped %d queued ids that have no stored event: %s",
                shard,
                len(missing),
                [m.decode("utf-8", "replace") for m in missing[:10]],
            )
            claimed = [c for c in claimed if c.attempt != 0]
        return int(head), claimed, throttle

    async def wait_for_flow(self, shard: str, timeout: float, *, group: str | None = None) -> bool:
        """Block up to ``timeout`` s for a wake-up token of a flow-limited group (an ack freed
        a slot, the limits changed); True when one came."""
        key = self._core.keys.for_shard(shard).wake(group)
        return await self._core.blocking.blpop([key], timeout=max(0.02, timeout)) is not None

    async def ack(
        self, shard: str, done: Iterable[tuple[bytes, bytes]], *, group: str | None = None
    ) -> int:
        """Settle deliveries whose handlers succeeded; stale tokens are ignored.

        The event leaves Redis with the last group that held it.
        """
        args = [x for pair in done for x in pair]
        if not args:
            return 0
        # a keyed delivery's token is "<n>|<key>": its ack frees the key's slot (the flow
        # keys' state) (one find over the joined tokens: bytes' `in` builds a TypeError per
        # call); the others send their keys only up to the dependencies'
        if shard in self._dependents:
            return await self._ack_dependents("ack", shard, args, group)
        keyed = b"".join(args[1::2]).find(b"|") >= 0
        # a view with levels: an event's level goes with it (`prio`); the dependencies'
        # keys after it only for a type that has them
        last = "prio" if keyed or self.levels.levelled(shard, group) else "dedup"
        n = int(await self._core.run("ack", shard, args, group=group, last=last, durable=True))
        if n < 0:  # the type has dependencies (nothing was done): again with their keys
            self._dependents.add(shard)
            return await self._ack_dependents("ack", shard, args, group)
        return n

    async def ack_results(
        self,
        shard: str,
        done: Iterable[tuple[bytes, bytes, bytes]],
        keep_ms: int,
        *,
        group: str | None = None,
    ) -> int:
        """:meth:`ack` for a type that keeps results: ``done`` holds (id, token, outcome
        record) triples; each record is kept ``keep_ms`` in the step that removes its event
        (ack_results.lua)."""
        args: list[Any] = [keep_ms, self._core.keys.results_channel, shard]
        args += [x for triple in done for x in triple]
        if len(args) == 3:
            return 0
        if shard in self._dependents:
            return await self._ack_dependents("ack_results", shard, args, group)
        n = int(
            await self._core.run("ack_results", shard, args, group=group, last="prio", durable=True)
        )
        if n < 0:  # as in ack
            self._dependents.add(shard)
            return await self._ack_dependents("ack_results", shard, args, group)
        return n

    async def _ack_dependents(
        self, script: str, shard: str, args: list[Any], group: str | None
    ) -> int:
        """An ack of a type with dependencies: with their keys; parents done wake the relay."""
        reply = await self._core.run(script, shard, args, group=group, durable=True)
        if isinstance(reply, list):  # parents done: their completions wait for the relay
            await nudge_relay(self._core, shard)
            return int(reply[0])
        return int(reply)

    async def renew(
        self,
        shard: str,
        leases: Iterable[tuple[bytes, bytes]],
        visibility_ms: int,
        *,
        group: str | None = None,
    ) -> list[bytes]:
        """Extend leases; return the ids whose lease was lost."""
        args = [x for pair in leases for x in pair]
        if not args:
            return []
        return list(await self._core.run("renew", shard, [visibility_ms, *args], group=group))

    async def fail(
        self,
        shard: str,
        claimed: Claimed,
        *,
        dead: bool,
        delay_ms: int,
        error: str,
        group: str | None = None,
        keep_ms: int | None = None,
    ) -> int:
        """Retry after ``delay_ms`` or dead-letter; 0 when the lease was no longer ours.

        ``keep_ms`` (a type that keeps results): a dead letter also keeps its error as the
        event's outcome that long."""
        args: list[Any] = [
            claimed.raw_id,
            claimed.token,
            "dead" if dead else "retry",
            delay_ms,
            error,
            self._core.keys.wakeup_channel,
            shard,
        ]
        if keep_ms is not None:
            args += [keep_ms, self._core.keys.results_channel]
        if not dead:
            # a view with levels: a retry due now goes to its level's list; a type with
            # results= sends its results' keys
            last = (
                _LAST_LEVEL if keep_ms is not None or self.levels.levelled(shard, group) else "krun"
            )
            return int(await self._core.run("fail", shard, args, group=group, last=last))
        # a dead letter: every key (a parent's children learn of it, see fail.lua)
        code = int(await self._core.run("fail", shard, args, group=group))
        if code == 3:  # a parent's failure waits for the relay
            await nudge_relay(self._core, shard)
            return 2
        return code
