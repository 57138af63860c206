"""Delivery groups in Redis: the registry, and running a script for every group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..keyspace.scripts import SCRIPT_KEYS
from .base import StoreCore
from .records import _int

_STALE = b"stale"


class DeliveryGroups:
    """The group registry of a type, and the calls that must reach every group
    (:meth:`every_group`, which enqueueing, scheduling and browsing are given)."""

    def __init__(self, core: StoreCore):
        self._core = core
        # shard -> its delivery groups as last seen; absent: no groups (or not
        # looked yet). Scripts that need every group's keys say when it is stale.
        self._seen: dict[str, tuple[str, ...]] = {}

    def _remember_groups(self, shard: str, names: Sequence[Any]) -> tuple[str, ...] | None:
        groups = tuple(sorted(n.decode() if isinstance(n, bytes) else str(n) for n in names))
        if groups:
            self._seen[shard] = groups
            return groups
        self._seen.pop(shard, None)
        return None

    def _group_call(
        self, script: str, shard: str, groups: Sequence[str]
    ) -> tuple[list[str], list[Any]]:
        """Keys and leading arguments of a script in ``keyspace.scripts.GROUPED`` for
        ``groups`` (see ``TypeKeys.group_call``)."""
        keys = self._core.keys.for_shard(shard).group_call(script, SCRIPT_KEYS[script], groups)
        return keys, [len(groups), *groups]

    async def every_group(
        self,
        script: str,
        shard: str,
        args: Sequence[Any],
        ungrouped: tuple[str, Sequence[Any]] | None = None,
        last: str | None = None,
    ) -> Any:
        """Run ``script`` with the keys of every registered group of the type.

        While the type is not known to have groups, ``ungrouped`` (a per-type
        script and its arguments) runs instead; it answers ``stale`` if the
        type has groups after all. A group registered or removed by another
        process makes the script answer ``stale`` with the registered groups:
        the call is made again with those, so the move never misses a group.
        ``last``: the ``ungrouped`` script's keys are sent up to that name.
        """
        groups = self._seen.get(shard)
        if groups is None and ungrouped is None:
            groups = self._remember_groups(
                shard, await self._core.redis.hkeys(self._core.view(shard).groups)
            )
            if groups is None:
                return None
        for _ in range(20):
            if groups is None:
                assert ungrouped is not None
                reply = await self._core.run(ungrouped[0], shard, ungrouped[1], last=last)
            else:
                keys, lead = self._group_call(script, shard, groups)
                reply = await self._core.scripts[script](keys=keys, args=[*lead, *args])
            if not (isinstance(reply, list) and reply and reply[0] == _STALE):
                return reply
            groups = self._remember_groups(shard, reply[1:])
            if groups is None and ungrouped is None:
                return None
        raise RuntimeError(f"{shard}: its delivery groups keep changing; try again")

    async def register_group(self, shard: str, group: str, max_deliveries: int) -> bool:
        """Register a delivery group of the type; True when it is new."""
        return bool(await self._core.run("group_register", shard, [group, max_deliveries]))

    async def remove_group(self, shard: str, group: str, batch: int = 500) -> int:
        """Drop a group and its pending deliveries (in bounded steps).

        Returns 1 removed, 0 no such group, -1 refused (the type's last group).
        """
        self._seen.pop(shard, None)
        keys, lead = self._group_call("group_remove", shard, [group])
        first = "1"
        while True:
            code = int(
                await self._core.scripts["group_remove"](keys=keys, args=[*lead, batch, first])
            )
            if code != 2:
                return code
            first = "0"

    async def groups(self, shard: str) -> dict[str, int]:
        """The type's registered groups and their max deliveries (empty: no named group)."""
        reply = await self._core.redis.hgetall(self._core.view(shard).groups)
        return {(k.decode() if isinstance(k, bytes) else k): _int(v) for k, v in reply.items()}
