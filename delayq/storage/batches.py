"""Batches' store calls (docs/WORKFLOWS.md, "Batches"): a batch is opened, learns of its
members, is handed their completions, closed, swept and read.

Each call is one script on one batch shard (one slot; ``lua/batch_*.lua``): the shard's
keys by name, then each batch's own keys (``keyspace.scripts.BATCH_KEYS``). What crosses
slots (a member's enqueue and link, a completion's hand-on) is the business of
:mod:`delayq.operations.batches` and the relay (:mod:`delayq.runtime.relay`, its sweep
:mod:`delayq.runtime.batch_sweep`); the reads are :mod:`delayq.operations.batch_reads`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..keyspace.scripts import SCRIPT_KEYS, keys_for
from ..keyspace.shards import batch_shard, is_batch_shard
from .base import StoreCore
from .dependencies import _str, nudge_relay

__all__ = ["BatchRead", "BatchStore", "BatchSweep", "ShardCounts"]


@dataclass(frozen=True, slots=True)
class BatchRead:
    """What ``batch_info.lua`` read of one batch (an empty ``record``: no such batch)."""

    now_ms: int
    record: dict[str, str]
    failed: list[str]
    """Failed members' refs (``"<type> NUL <id>"``)."""
    waiting: list[str]
    """Some pending members' refs."""


@dataclass(frozen=True, slots=True)
class BatchSweep:
    """What ``batch_sweep.lua`` found due in one batch shard."""

    now_ms: int
    next_ms: int
    expired: list[str]
    """Open batches whose lease ran out."""
    unconfirmed: list[tuple[str, str]]
    """``(batch id, member ref)`` of adds not confirmed within their grace."""
    old: list[str]
    """Done batches past the retention."""
    audits: list[str]
    """Closed batches whose pending members are due to be linked again."""


@dataclass(frozen=True, slots=True)
class ShardCounts:
    """What ``batch_counts.lua`` counted in one batch shard."""

    now_ms: int
    open: int
    waiting: int
    stuck: int
    done: int
    relay_due: int
    relay_age_ms: int


class BatchStore:
    """The batch scripts of one prefix (see the module docstring)."""

    def __init__(self, core: StoreCore):
        self._core = core

    def _keys(self, script: str, shard: str, batch_ids: Sequence[str]) -> list[str]:
        """The keys of a batch script: the shard's by name, then each batch's own."""
        tk = self._core.keys.for_shard(shard)
        keys = list(keys_for(SCRIPT_KEYS[script], tk.named()))
        for batch_id in batch_ids:
            keys.extend(tk.batch(batch_id))
        return keys

    async def _run(self, script: str, shard: str, batch_ids: Sequence[str], args: list[Any]) -> Any:
        keys = self._keys(script, shard, batch_ids)
        return await self._core.scripts[script](keys=keys, args=args)

    async def open(
        self,
        batch_id: str,
        *,
        name: str | None,
        lease_ms: int,
        parent: str | None,
        complete: str | None,
        success: str | None,
        children: Sequence[tuple[str, str]],
    ) -> bool:
        """Open a batch (``batch_open.lua``), linking ``children`` ``(shard, id)`` to it;
        False when it existed."""
        args: list[Any] = [
            batch_id,
            name or "",
            lease_ms,
            parent or "",
            complete or "",
            success or "",
        ]
        for pair in children:
            args += pair
        return bool(await self._run("batch_open", batch_shard(batch_id), [batch_id], args))

    async def renew(self, batch_id: str, lease_ms: int) -> bool:
        """Extend an open batch's lease; False when it is not open any more."""
        shard = batch_shard(batch_id)
        return bool(await self._run("batch_renew", shard, [batch_id], [batch_id, lease_ms]))

    async def add(
        self, batch_id: str, refs: Sequence[str], *, grace_ms: int, adder: str | None
    ) -> tuple[str, list[str]]:
        """The batch learns of members (``batch_add.lua``): ``("a", [answer per ref])``, or
        ``("x" | "d" | "c", [])`` (no such batch, done, closed to this adder)."""
        args: list[Any] = [batch_id, grace_ms, adder or "", *refs]
        reply = await self._run("batch_add", batch_shard(batch_id), [batch_id], args)
        code = _str(reply[0])
        return code, [_str(x) for x in reply[1:]]

    async def confirm(self, batch_id: str, refs: Sequence[str]) -> int:
        """Confirm members' adds (``batch_confirm.lua``)."""
        if not refs:
            return 0
        shard = batch_shard(batch_id)
        return int(await self._run("batch_confirm", shard, [batch_id], [batch_id, *refs]))

    async def apply(
        self, shard: str, completions: dict[str, list[tuple[str, bytes]]]
    ) -> tuple[int, list[str]]:
        """Hand completions to batches of one shard (``batch_apply.lua``): batch id ->
        ``[(member ref, record)]`` (an empty record drops an unconfirmed add). Returns how
        many were for batches done or gone, and the batches done now whose completion
        waits for the relay (the relay is woken for them)."""
        args: list[Any] = []
        for batch_id, items in completions.items():
            args += [batch_id, len(items)]
            for ref, record in items:
                args += [ref, record]
        reply = await self._run("batch_apply", shard, list(completions), args)
        done = [_str(x) for x in reply[1:]]
        if done:
            await nudge_relay(self._core, shard)
        return int(reply[0]), done

    async def close(self, batch_id: str, *, audit_ms: int, sweep: bool = False) -> int:
        """Close a batch (``batch_close.lua``; ``sweep``: only if its lease ran out; its
        pending members are first linked again ``audit_ms`` later): 0
        nothing changed, 1 closed, 2 closed and done, 3 done with a completion to relay
        (the relay is woken)."""
        shard = batch_shard(batch_id)
        args = [batch_id, "sweep" if sweep else "close", audit_ms]
        code = int(await self._run("batch_close", shard, [batch_id], args))
        if code == 3:
            await nudge_relay(self._core, shard)
        return code

    async def sweep(
        self,
        shard: str,
        *,
        limit: int,
        retention_ms: int,
        grace_ms: int,
        audit_ms: int,
        audit_cap_ms: int,
    ) -> BatchSweep:
        """A batch shard's due sweep work (``batch_sweep.lua``)."""
        args = [limit, retention_ms, grace_ms, audit_ms, audit_cap_ms]
        r = await self._run("batch_sweep", shard, [], args)
        lists: list[list[str]] = []  # after the two times, four lists: a length, its items
        at = 2
        for _ in range(4):
            n = int(r[at])
            lists.append([_str(x) for x in r[at + 1 : at + 1 + n]])
            at += 1 + n
        expired, entries, old, audits = lists
        unconfirmed = []
        for entry in entries:  # "<batch id> NUL <member ref>"
            batch_id, _, ref = entry.partition("\0")
            unconfirmed.append((batch_id, ref))
        return BatchSweep(int(r[0]), int(r[1]), expired, unconfirmed, old, audits)

    async def trim(self, shard: str, batch_ids: Sequence[str], retention_ms: int) -> int:
        """Remove done batches past the retention (``batch_trim.lua``)."""
        if not batch_ids:
            return 0
        args: list[Any] = [retention_ms, *batch_ids]
        return int(await self._run("batch_trim", shard, batch_ids, args))

    async def info(self, batch_id: str, *, failed: int, waiting: int) -> BatchRead:
        """One batch's record, failed refs and some pending refs (``batch_info.lua``)."""
        shard = batch_shard(batch_id)
        r = await self._run("batch_info", shard, [batch_id], [batch_id, failed, waiting])
        flat = [_str(x) for x in r[1]]
        record = dict(zip(flat[::2], flat[1::2], strict=True))
        return BatchRead(int(r[0]), record, [_str(x) for x in r[2]], [_str(x) for x in r[3]])

    async def infos(
        self, batch_ids: Sequence[str], *, failed: int, waiting: int
    ) -> list[BatchRead]:
        """:meth:`info` of many batches, pipelined."""
        calls = []
        for batch_id in batch_ids:
            keys = self._keys("batch_info", batch_shard(batch_id), [batch_id])
            calls.append((keys, [batch_id, failed, waiting]))
        out = []
        for r in await self._core.calls("batch_info", calls):
            flat = [_str(x) for x in r[1]]
            record = dict(zip(flat[::2], flat[1::2], strict=True))
            out.append(
                BatchRead(int(r[0]), record, [_str(x) for x in r[2]], [_str(x) for x in r[3]])
            )
        return out

    async def shards_in_use(self) -> list[str]:
        """The batch shards a batch was ever opened in under the prefix: one ``SMEMBERS``
        of the dependency shards (``{p}:dshards``), where a batch's shard is recorded
        before the batch is written (and where the relay finds it); empty for a prefix
        that never opened a batch."""
        raw: Any = await self._core.redis.smembers(self._core.keys.dependency_shards)
        return sorted(s for s in (_str(m) for m in raw) if is_batch_shard(s))

    async def list_ids(
        self, shards: Sequence[str], state: str, limit: int, idle_ms: int
    ) -> list[tuple[str, int]]:
        """``[(batch id, created ms)]`` of the batches in ``state`` in each of ``shards``
        (``batch_list.lua``, at most ``limit`` per shard), the shards' calls pipelined
        (on a cluster, a few at a time)."""
        calls = [(self._keys("batch_list", shard, []), [state, limit, idle_ms]) for shard in shards]
        pairs: list[tuple[str, int]] = []
        for r in await self._core.calls("batch_list", calls):
            pairs += [(_str(r[i]), int(float(r[i + 1]))) for i in range(1, len(r) - 1, 2)]
        return pairs

    async def counts(
        self, shards: Sequence[str], *, idle_ms: int, stale_ms: int, most: int
    ) -> list[ShardCounts]:
        """Each of ``shards``' batches by state and its relay work (``batch_counts.lua``),
        pipelined (on a cluster, a few at a time)."""
        calls = [
            (self._keys("batch_counts", shard, []), [idle_ms, stale_ms, most]) for shard in shards
        ]
        return [
            ShardCounts(*(int(x) for x in r[:7]))
            for r in await self._core.calls("batch_counts", calls)
        ]

    async def unconfirmed(self, batch_id: str, refs: Sequence[str]) -> set[str]:
        """Those of ``refs`` whose add is not confirmed yet (``ZMSCORE``)."""
        if not refs:
            return set()
        key = self._core.keys.for_shard(batch_shard(batch_id)).batch_unconfirmed
        scores: Any = await self._core.redis.zmscore(key, [f"{batch_id}\0{ref}" for ref in refs])
        return {ref for ref, score in zip(refs, scores, strict=True) if score is not None}

    async def members(
        self, batch_id: str, cursor: int, count: int
    ) -> tuple[int, list[tuple[str, bytes]]]:
        """One page of a batch's members (``HSCAN``): the next cursor (0: the end) and
        ``(member ref, record)`` pairs (an empty record: pending)."""
        _, members, _ = self._core.keys.for_shard(batch_shard(batch_id)).batch(batch_id)
        reply: Any = await self._core.redis.hscan(members, cursor, count=count)
        nxt, page = reply
        return int(nxt), [(_str(k), bytes(v)) for k, v in page.items()]
