"""A partitioned type seen as one type: the service's operations spread over its shards.

An operation on one event (enqueue, replace, cancel, a dead letter by id) goes
to the one shard its id routes to (:func:`delayq.partitions.shards.shard_for`), so it
stays one script on one slot. Operations on the whole type (dead-letter pages,
requeue or purge of all, group registration, counts) visit every shard of
every layout the type has events in. With one partition every shard list is
``[type name]``, and each call here is the single store call it always was.
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

from ..flow.dedup import Dedup
from ..storage.store import DeadRecord, ScheduledRecord, Store
from .repartition import RepartitionResult, repartition
from .shards import shard_for

__all__ = ["Router"]

_T = TypeVar("_T")

_PAGE = 500


def _at(values: Sequence[_T], indexes: list[int]) -> list[_T]:
    """The ``values`` at ``indexes``, in order. (Not a comprehension in
    :meth:`Router.enqueue`: one there makes every call, unpartitioned ones too, build a
    closure cell for each list it reads.)"""
    return [values[i] for i in indexes]


class Router:
    """Routes the service's calls for one prefix to the shards of each type."""

    def __init__(self, store: Store):
        self._store = store

    def shards_of_id(self, type_name: str, event_id: str | bytes) -> list[str]:
        """The shard an id routes to in every known layout of the type (one per layout)."""
        return [shard_for(type_name, event_id, n) for n in self._store.types.layouts(type_name)]

    def split(
        self, type_name: str, partitions: int, items: Sequence[tuple[str, bytes, int]]
    ) -> dict[str, list[int]]:
        """Indexes of ``items`` (id first) per shard, in order."""
        if partitions == 1:
            return {type_name: list(range(len(items)))}
        out: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            out.setdefault(shard_for(type_name, item[0], partitions), []).append(i)
        return out

    async def enqueue(
        self,
        type_name: str,
        partitions: int,
        items: Sequence[tuple[str, bytes, int]],
        absolute: bool,
        replace: bool | Dedup,
        keys: Sequence[str | None] | None = None,
        priorities: Sequence[int] | None = None,
    ) -> list[int]:
        """Enqueue items of one type, each to its partition; a code per item, in order.

        ``keys``: the items' flow keys (None: none); each partition rotates over its own keys.
        ``priorities``: the items' priority levels (None: all 0); each partition serves its
        own levels in order.
        """
        if partitions == 1:
            # positional: each call of a single enqueue comes this way (keywords cost more)
            return await self._store.enqueueing.enqueue(
                type_name, items, absolute, replace, keys, priorities
            )
        codes = [0] * len(items)
        for shard, indexes in self.split(type_name, partitions, items).items():
            got = await self._store.enqueueing.enqueue(
                shard,
                _at(items, indexes),
                absolute=absolute,
                replace=replace,
                keys=None if keys is None else _at(keys, indexes),
                priorities=None if priorities is None else _at(priorities, indexes),
            )
            for i, code in zip(indexes, got, strict=True):
                codes[i] = code
        return codes

    async def repartition(self, type_name: str, partitions: int, wait: float) -> RepartitionResult:
        """Move the type's events from every other layout into ``partitions`` (see
        :func:`delayq.partitions.repartition.repartition`)."""
        return await repartition(self._store, type_name, partitions, wait=wait)

    async def cancel(self, type_name: str, event_id: str, group: str | None = None) -> bool:
        """Cancel an id (for every delivery group, or ``group``) wherever a layout of the
        type routes it; True when one was removed."""
        removed = False
        for shard in self.shards_of_id(type_name, event_id):
            removed = await self._store.enqueueing.cancel(shard, event_id, group) or removed
        return removed

    async def running(self, type_name: str, event_id: str) -> list[tuple[str, str | None, bytes]]:
        """``(shard, group, claim token)`` of every lease held on the id now."""
        return [
            (shard, group, token)
            for shard in self.shards_of_id(type_name, event_id)
            for group, token in await self._store.running.running_tokens(shard, event_id)
        ]

    async def dead_letters(
        self, type_name: str, offset: int, limit: int, group: str | None
    ) -> list[DeadRecord]:
        """Dead letters of the whole type, oldest first (merged across shards)."""
        shards = self._store.types.shards(type_name)
        if len(shards) == 1:
            return await self._store.dead.dead_letters(shards[0], offset, limit, group=group)
        pages = [
            await self._store.dead.dead_letters(s, 0, offset + limit, group=group) for s in shards
        ]
        merged = heapq.merge(*pages, key=lambda r: (r.failed_at_ms, r.raw_id))
        return list(merged)[offset : offset + limit]

    async def scheduled_page(
        self, type_name: str, offset: int, limit: int, group: str | None = None
    ) -> list[ScheduledRecord]:
        """Scheduled events of the whole type by due time (merged across shards; with
        ``group``, that group's retries too)."""
        shards = self._store.types.shards(type_name)
        if len(shards) == 1:
            return await self._store.browsing.scheduled_page(shards[0], offset, limit, group=group)
        pages = [
            await self._store.browsing.scheduled_page(s, 0, offset + limit, group=group)
            for s in shards
        ]
        merged = heapq.merge(*pages, key=lambda r: (r.due_ms, r.raw_id))
        return list(merged)[offset : offset + limit]

    async def dead_count(self, type_name: str, group: str | None) -> int:
        """Dead letters of the whole type (in ``group``)."""
        return sum(
            [
                await self._store.dead.dead_count(s, group=group)
                for s in self._store.types.shards(type_name)
            ]
        )

    async def by_id(
        self,
        type_name: str,
        ids: Sequence[str],
        call: Callable[[str, list[str]], Awaitable[int]],
    ) -> int:
        """Run ``call(shard, ids)`` for the ids that route to each shard; sum the results."""
        per_shard: dict[str, list[str]] = {}
        for event_id in ids:
            for shard in self.shards_of_id(type_name, event_id):
                per_shard.setdefault(shard, []).append(event_id)
        total = 0
        for shard, shard_ids in per_shard.items():
            for i in range(0, len(shard_ids), _PAGE):
                total += await call(shard, shard_ids[i : i + _PAGE])
        return total

    async def each_shard(self, type_name: str, call: Callable[[str], Awaitable[_T]]) -> list[_T]:
        """``call(shard)`` for every shard of the type, in order."""
        return [await call(shard) for shard in self._store.types.shards(type_name)]

    async def requeue_dead(
        self, type_name: str, ids: Iterable[str] | None, ms: int, group: str | None
    ) -> int:
        """Schedule dead letters (those in ``ids``, or all) again in ``ms``; return how many."""
        if ids is not None:
            return await self.by_id(
                type_name,
                list(ids),
                lambda shard, p: self._store.dead.requeue_dead(shard, p, ms, group=group),
            )

        async def requeue_all(shard: str) -> int:
            # Only what is dead now: a requeued event that fails again must not
            # come round in this same call.
            total, seen = 0, 0
            limit = await self._store.dead.dead_count(shard, group=group)
            while seen < limit:
                page = await self._store.dead.dead_ids(shard, min(_PAGE, limit - seen), group=group)
                if not page:
                    break
                seen += len(page)
                total += await self._store.dead.requeue_dead(shard, page, ms, group=group)
            return total

        return sum(await self.each_shard(type_name, requeue_all))

    async def purge_dead(self, type_name: str, ids: Iterable[str] | None, group: str | None) -> int:
        """Delete dead letters (those in ``ids``, or all) for good; return how many."""
        if ids is not None:
            return await self.by_id(
                type_name,
                list(ids),
                lambda shard, p: self._store.dead.purge_dead(shard, p, group=group),
            )

        async def purge_all(shard: str) -> int:
            total = 0
            while page := await self._store.dead.dead_ids(shard, _PAGE, group=group):
                removed = await self._store.dead.purge_dead(shard, page, group=group)
                total += removed
                if not removed:
                    break
            return total

        return sum(await self.each_shard(type_name, purge_all))
