"""Flow limits in Redis: reading and changing a type's (or group's) limits HASH.

A partitioned type has one limits HASH per partition, each holding its share of
the type's limit (see :mod:`delayq.flow.limits`). When a type gains or loses a
partition layout (its partition count is being changed) the shares are split
again over every shard of the layouts in use, so the new partitions are never
without limits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from ..flow.limits import FlowLimits, split_concurrency, split_rate
from .base import StoreCore, log
from .groups import DeliveryGroups


class FlowLimitsStore:
    """The limits HASH of a type or group (``{p:T}:limits``); ``lua/claim.lua`` enforces it.

    The type registry (:class:`~delayq.storage.layouts.Layouts`) calls
    :meth:`layout_added` and :meth:`spread_limits` when a type's layouts change."""

    def __init__(self, core: StoreCore, groups: DeliveryGroups):
        self._core = core
        self._groups = groups

    async def read_limits(self, shard: str, group: str | None = None) -> dict[bytes, bytes]:
        """The stored fields of a shard's (group's) limits; empty when none is set."""
        key = self._core.keys.for_shard(shard).limits(group)
        return cast(dict[bytes, bytes], await self._core.redis.hgetall(key))

    async def change_limits(
        self, shard: str, changes: Mapping[str, str], group: str | None = None
    ) -> dict[bytes, bytes]:
        """Set fields (an empty value deletes one) in one atomic step and wake waiting
        consumers; returns the fields now stored."""
        tk = self._core.keys.for_shard(shard)
        args = [x for pair in changes.items() for x in pair]
        reply = await self._core.scripts["limits_set"](
            keys=[tk.limits(group), tk.wake(group)], args=args
        )
        return {reply[i]: reply[i + 1] for i in range(0, len(reply), 2)}

    async def change_shard_limits(
        self,
        shard_list: Sequence[str],
        changes: Sequence[Mapping[str, str]],
        group: str | None = None,
    ) -> dict[bytes, bytes]:
        """:meth:`change_limits` on each shard with its own changes (one script per
        shard: partitions live on different slots); returns the first shard's fields."""
        first: dict[bytes, bytes] = {}
        for i, (shard, change) in enumerate(zip(shard_list, changes, strict=True)):
            fields = await self.change_limits(shard, change, group)
            if i == 0:
                first = fields
        return first

    async def spread_limits(
        self, type_name: str, shard_list: Sequence[str], fields: Mapping[bytes, bytes] | None
    ) -> None:
        """Split limits again over ``shard_list`` (every shard of the type's known layouts):
        ``fields`` (a limits HASH as read) for the default group, the first shard's for its
        groups."""
        views: list[tuple[str | None, dict[bytes, bytes]]] = []
        if fields:
            views.append((None, dict(fields)))
        for name in await self._groups.groups(shard_list[0]):
            if name != "default":
                got = await self.read_limits(shard_list[0], name)
                if got:
                    views.append((name, got))
        n = len(shard_list)
        for group, stored in views:
            limits = FlowLimits.from_fields(stored)
            if limits.concurrency is not None and limits.concurrency < n:
                log.warning(
                    "%s: concurrency %d is below its %d shards (partitions of every layout "
                    "in use): each shard gets 1 until the partition count change is done",
                    type_name,
                    limits.concurrency,
                    n,
                )
            paused = "1" if limits.paused else ""
            changes = [
                {**c, **r, "paused": paused}
                for c, r in zip(
                    split_concurrency(
                        max(limits.concurrency, n) if limits.concurrency else None, n
                    ),
                    split_rate(limits.rate, n),
                    strict=True,
                )
            ]
            await self.change_shard_limits(shard_list, changes, group)

    async def layout_added(self, type_name: str, other: str, shard_list: Sequence[str]) -> None:
        """A layout of the type new to Redis: when ``other`` (the first shard of another
        layout in use) has limits or groups, split them again over ``shard_list``."""
        fields = await self.read_limits(other)
        if fields or await self._groups.groups(other):
            log.info("%s: a new partition layout: splitting its flow limits again", type_name)
            await self.spread_limits(type_name, shard_list, fields)

    async def key_backlog(
        self, shard: str, group: str | None, scan: int
    ) -> tuple[int, int, list[tuple[str, int, int, int]]]:
        """Keys in rotation, parked keys, and ``(key, ready, running, parked_until_ms)``
        for up to ``scan`` keys with work (``key_backlog.lua``; docs/FLOW.md)."""
        r = await self._core.run("key_backlog", shard, [scan], group=group)
        rows = [
            (r[i].decode("utf-8", "replace"), int(r[i + 1]), int(r[i + 2]), int(r[i + 3]))
            for i in range(2, len(r), 4)
        ]
        return int(r[0]), int(r[1]), rows
