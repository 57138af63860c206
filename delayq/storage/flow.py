"""Flow limits in Redis: reading and changing a type's (or group's) limits HASH."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from .base import StoreBase


class FlowLimitsStore(StoreBase):
    """The limits HASH of a type or group (``{p:T}:limits``); ``lua/claim.lua`` enforces it."""

    async def read_limits(self, type_name: str, group: str | None = None) -> dict[bytes, bytes]:
        """The stored fields of a shard's (group's) limits; empty when none is set."""
        key = self.keys.for_shard(type_name).limits(group)
        return cast(dict[bytes, bytes], await self.redis.hgetall(key))

    async def change_limits(
        self, type_name: str, changes: Mapping[str, str], group: str | None = None
    ) -> dict[bytes, bytes]:
        """Set fields (an empty value deletes one) in one atomic step and wake waiting
        consumers; returns the fields now stored."""
        tk = self.keys.for_shard(type_name)
        args = [x for pair in changes.items() for x in pair]
        reply = await self._scripts["limits_set"](
            keys=[tk.limits(group), tk.wake(group)], args=args
        )
        return {reply[i]: reply[i + 1] for i in range(0, len(reply), 2)}

    async def key_backlog(
        self, type_name: str, group: str | None, scan: int
    ) -> tuple[int, int, list[tuple[str, int, int, int]]]:
        """Keys in rotation, parked keys, and ``(key, ready, running, parked_until_ms)``
        for up to ``scan`` keys with work (``key_backlog.lua``; docs/FLOW.md)."""
        r = await self._run("key_backlog", type_name, [scan], group=group)
        rows = [
            (r[i].decode("utf-8", "replace"), int(r[i + 1]), int(r[i + 2]), int(r[i + 3]))
            for i in range(2, len(r), 4)
        ]
        return int(r[0]), int(r[1]), rows
