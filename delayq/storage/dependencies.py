"""Dependencies' store calls (docs/WORKFLOWS.md, "Dependencies"): a child waits, its
parents learn of it, completions are applied, and the relay reads and clears its work.

Each call is one script on one shard (one slot); what crosses slots is the relay's
business (:mod:`delayq.runtime.relay`) and the enqueue's (:mod:`delayq.operations.dependencies`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from .base import StoreCore

__all__ = [
    "RELAY_WAKE",
    "Applied",
    "Audit",
    "Completion",
    "DependencyStore",
    "RelayWork",
    "nudge_relay",
]

_PACK = msgspec.msgpack.Encoder()


# published on the wake-up channel (type names hold no ':'): the relay looks at the shard
RELAY_WAKE = "dep:"


async def nudge_relay(store: StoreCore, shard: str) -> None:
    """Wake the relay for ``shard`` (a completion waits there); a hint only: the relay
    looks at every dependency shard each scheduling interval anyway."""
    await store.redis.publish(store.keys.wakeup_channel, RELAY_WAKE + shard)


def _str(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Completion:
    """A parent's completion to hand to some of its children (a relay member)."""

    member: bytes
    parent_id: str
    record: bytes
    lo: int
    hi: int
    children: list[tuple[str, str]]
    """``(child shard, child id)`` of children ``lo ..``, at most a call's worth."""


@dataclass(frozen=True, slots=True)
class Audit:
    """A waiting child whose parents are looked at again: those not done yet."""

    child_id: str
    parents: list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class RelayWork:
    """What ``dep_work.lua`` found due in one shard."""

    now_ms: int
    next_ms: int
    completions: list[Completion]
    audits: list[Audit]
    more: bool = False
    """The call stopped at its cap of children read: more work is due."""


@dataclass(frozen=True, slots=True)
class Applied:
    """What ``dep_apply.lua`` did."""

    released: int
    dead: int
    skipped: int
    parents: list[str]
    """Those children that are parents in turn and now have a completion to relay."""


class DependencyStore:
    """The dependency scripts of one prefix (see the module docstring)."""

    def __init__(self, core: StoreCore):
        self._core = core

    async def note_dependency_shards(self, shards: Sequence[str]) -> None:
        """Record shards that take part in dependencies (the relay looks at them)."""
        await self._core.redis.sadd(self._core.keys.dependency_shards, *shards)

    async def dependency_shards(self) -> set[str]:
        """Every shard that ever took part in a dependency under the prefix."""
        return {_str(m) for m in await self._core.redis.smembers(self._core.keys.dependency_shards)}

    async def nudge_relay(self, shard: str) -> None:
        """Wake the relay for ``shard`` (see :func:`nudge_relay`)."""
        await nudge_relay(self._core, shard)

    async def dep_wait(
        self,
        shard: str,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool,
        policy: str,
        audit_ms: int,
        parents: Sequence[tuple[str, str]],
    ) -> list[int]:
        """Add waiting children (``dep_wait.lua``); a code per item: 1 added, 0 kept."""
        packed = _PACK.encode([x for pair in parents for x in pair])
        args: list[Any] = ["at" if absolute else "delay", policy, audit_ms, packed]
        for event_id, envelope, ms in items:
            args += [event_id, envelope, ms]
        return [int(c) for c in await self._core.run("dep_wait", shard, args)]

    async def dep_link(self, shard: str, links: Sequence[tuple[str, str, str]]) -> list[bytes]:
        """Link ``(parent id, child shard, child id)``; per link ``b"p"`` (pending) or the
        record to apply now (``dep_link.lua``)."""
        args = [x for triple in links for x in triple]
        reply = await self._core.run("dep_link", shard, args)
        return [r if isinstance(r, bytes) else str(r).encode() for r in reply]

    async def dep_prelink(
        self, shard: str, batch_shard: str, batch_id: str, members: Sequence[tuple[str, str]]
    ) -> list[bytes]:
        """Link batch ``batch_id`` to ``(member id, "n" or "u")`` about to be enqueued in
        ``shard``; per member ``b"e"`` (enqueue it), ``b"p"`` (pending), ``b"d"`` (done
        since an earlier add) or ``b"x"`` (ask the batch again) (``dep_prelink.lua``)."""
        args = [batch_shard, batch_id, *(x for pair in members for x in pair)]
        reply = await self._core.run("dep_prelink", shard, args)
        return [r if isinstance(r, bytes) else str(r).encode() for r in reply]

    async def dep_apply(
        self, shard: str, edges: Sequence[tuple[str, str, bytes]], keep_ms: int | None
    ) -> Applied:
        """Apply ``(child id, "<parent type> NUL <parent id>", record)`` to children of
        ``shard`` (``dep_apply.lua``; idempotent)."""
        args: list[Any] = [
            self._core.keys.wakeup_channel,
            shard,
            "" if keep_ms is None else keep_ms,
            self._core.keys.results_channel,
        ]
        for triple in edges:
            args += triple
        r = await self._core.run("dep_apply", shard, args)
        applied = Applied(int(r[0]), int(r[1]), int(r[2]), [_str(x) for x in r[3:]])
        if applied.parents:
            await nudge_relay(self._core, shard)
        return applied

    async def dep_work(
        self,
        shard: str,
        *,
        limit: int,
        per: int,
        audit_ms: int,
        audit_cap_ms: int,
        most: int | None = None,
    ) -> RelayWork:
        """The relay's due work in ``shard`` (``dep_work.lua``); ``most``: read no further
        member once that many children are read."""
        args = [limit, per, audit_ms, audit_cap_ms]
        if most is not None:
            args.append(most)
        r = await self._core.run("dep_work", shard, args)
        completions, audits = [], []
        more = False
        for item in r[2:]:
            if item[0] == b"more":
                more = True
            elif item[0] == b"c":
                kids = [(_str(item[i]), _str(item[i + 1])) for i in range(6, len(item), 2)]
                completions.append(
                    Completion(
                        item[1], _str(item[2]), bytes(item[3]), int(item[4]), int(item[5]), kids
                    )
                )
            else:
                pairs = [(_str(item[i]), _str(item[i + 1])) for i in range(2, len(item), 2)]
                audits.append(Audit(_str(item[1]), pairs))
        return RelayWork(int(r[0]), int(r[1]), completions, audits, more)

    async def dep_relayed(self, shard: str, member: bytes, upto: int) -> bool:
        """Forget children up to ``upto`` of a completion (``dep_relayed.lua``); True when
        the completion is fully handed on."""
        (done,) = await self.dep_relayed_many(shard, [(member, upto)])
        return done

    async def dep_relayed_many(self, shard: str, handed: Sequence[tuple[bytes, int]]) -> list[bool]:
        """:meth:`dep_relayed` of many completions of one shard in one call: a flag per
        ``(member, upto)``."""
        args = [x for pair in handed for x in pair]
        return [bool(x) for x in await self._core.run("dep_relayed", shard, args)]

    async def envelopes(self, shard: str, ids: Sequence[str]) -> list[bytes | None]:
        """The stored envelopes of ``ids`` in ``shard`` (None: not stored); a child's
        producer reads its parents' trace contexts from them (docs/OBSERVABILITY.md)."""
        got: list[Any] = await self._core.redis.hmget(
            self._core.keys.for_shard(shard).events, list(ids)
        )
        return [None if e is None else bytes(e) for e in got]

    async def dep_children(
        self, shard: str, parent_id: str, limit: int
    ) -> tuple[int, list[tuple[str, str]]]:
        """How many children wait for ``parent_id``'s next completion, and the first
        ``limit`` of them as ``(child shard, child id)`` (``dep_children.lua``)."""
        r = await self._core.run("dep_children", shard, [parent_id, limit])
        return int(r[0]), [(_str(r[i]), _str(r[i + 1])) for i in range(1, len(r) - 1, 2)]

    async def dep_parents(
        self, shard: str, event_id: str
    ) -> tuple[str | None, int | None, list[tuple[str, str, bytes]]]:
        """``(policy, own due ms while waiting, [(parent type, parent id, record)])`` of an
        event; ``(None, None, [])`` for one without parents."""
        r = await self._core.run("dep_parents", shard, [event_id])
        if not r[0]:
            return None, None, []
        waiting = int(float(r[1])) if r[1] else None
        parents = [
            (_str(r[i]), _str(r[i + 1]), bytes(r[i + 2]) if r[i + 2] else b"")
            for i in range(2, len(r), 3)
        ]
        return _str(r[0]), waiting, parents
