"""Dead letters: list them, count them, schedule them again or delete them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from .base import StoreCore
from .dependencies import nudge_relay
from .records import DeadRecord, _int


class DeadLetters:
    """The dead letters of one group of a type."""

    def __init__(self, core: StoreCore):
        self._core = core

    async def dead_letters(
        self, shard: str, offset: int, limit: int, *, group: str | None = None
    ) -> list[DeadRecord]:
        """Dead letters of one type (and group), oldest first."""
        r = await self._core.run("dead_list", shard, [offset, limit], group=group)
        return [
            DeadRecord(
                raw_id=r[i],
                failed_at_ms=int(float(r[i + 1])),
                envelope=r[i + 2] or None,
                attempts=_int(r[i + 3]),
                error=(r[i + 4] or b"").decode("utf-8", "replace"),
            )
            for i in range(0, len(r), 5)
        ]

    async def dead_ids(self, shard: str, count: int, *, group: str | None = None) -> list[bytes]:
        """The ``count`` oldest dead-letter ids."""
        key = self._core.view(shard, group).dead
        return cast(list[bytes], await self._core.redis.zrange(key, 0, count - 1))

    async def dead_count(self, shard: str, *, group: str | None = None) -> int:
        """How many dead letters a group of the type has."""
        return int(await self._core.redis.zcard(self._core.view(shard, group).dead))

    async def requeue_dead(
        self,
        shard: str,
        ids: Sequence[str | bytes],
        delay_ms: int,
        *,
        group: str | None = None,
    ) -> int:
        """Schedule dead letters again after ``delay_ms`` (for their group alone); return how many."""
        if not ids:
            return 0
        args = [delay_ms, self._core.keys.wakeup_channel, shard, *ids]
        return int(await self._core.run("dead_requeue", shard, args, group=group))

    async def purge_dead(
        self, shard: str, ids: Sequence[str | bytes], *, group: str | None = None
    ) -> int:
        """Delete dead letters; return how many."""
        if not ids:
            return 0
        reply = await self._core.run("dead_purge", shard, list(ids), group=group)
        if isinstance(reply, list):  # parents' failures wait for the relay
            await nudge_relay(self._core, shard)
            return int(reply[0])
        return int(reply)
