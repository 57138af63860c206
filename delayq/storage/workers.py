"""Worker heartbeats and the handled/failed history rings (see delayq/runtime/heartbeat.py, history.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from .base import StoreCore


class Workers:
    """Records that live processes keep in Redis about themselves."""

    def __init__(self, core: StoreCore):
        self._core = core

    async def heartbeat(self, worker_id: str, record: bytes, ttl_ms: int) -> int:
        """Write this worker's record with a TTL and index it; return Redis's time in ms."""
        keys = [self._core.keys.workers, self._core.keys.worker(worker_id)]
        return int(
            await self._core.scripts["heartbeat"](keys=keys, args=[worker_id, record, ttl_ms])
        )

    async def remove_worker(self, worker_id: str) -> bool:
        """Delete this worker's record and index entry; True when the record was there."""
        keys = [self._core.keys.workers, self._core.keys.worker(worker_id)]
        return bool(await self._core.scripts["worker_remove"](keys=keys, args=[worker_id]))

    async def worker_records(self, limit: int) -> list[bytes]:
        """Records of up to ``limit`` live workers (one ZRANGE and one MGET)."""
        ids = cast(
            list[bytes], await self._core.redis.zrange(self._core.keys.workers, 0, limit - 1)
        )
        if not ids:
            return []
        base = self._core.keys.worker("").encode()
        values = cast(list[bytes | None], await self._core.redis.mget([base + i for i in ids]))
        return [v for v in values if v]  # records that expired since the index was pruned

    async def add_history(
        self,
        items: Sequence[tuple[str, bytes]],
        *,
        minute_slots: int,
        coarse_seconds: int,
        coarse_slots: int,
        ttl_ms: int,
    ) -> None:
        """Merge ``(type name, packed aggregate)`` items into the history rings (one script)."""
        if not items:
            return
        keys = [
            key
            for name, _ in items
            for key in (
                self._core.keys.history(name, "minute"),
                self._core.keys.history(name, "coarse"),
            )
        ]
        args: list[Any] = [minute_slots, coarse_seconds, coarse_slots, ttl_ms]
        args.extend(packed for _, packed in items)
        await self._core.scripts["history_add"](keys=keys, args=args)

    async def history_ring(self, type_name: str, ring: str, slots: int) -> list[bytes | None]:
        """Every slot of one history ring (HMGET of at most ``slots`` fields)."""
        fields = [str(i) for i in range(slots)]
        return cast(
            list[bytes | None],
            await self._core.redis.hmget(self._core.keys.history(type_name, ring), fields),
        )
