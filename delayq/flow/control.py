"""Fleet-wide flow limits and pausing: the service's operations on a type's limits HASH.

The limits are stored in Redis and enforced where events are claimed
(``lua/claim.lua``; the consumer's side is :mod:`delayq.flow.waits`), so a change
reaches every process at its next claim, within about a second. See
docs/FLOW.md.
"""

from __future__ import annotations

import enum
from typing import Literal

from ..storage.store import Store
from .limits import FlowLimits, Rate, check_concurrency, parse_rate, split_concurrency, split_rate

__all__ = ["KEEP", "FlowControl", "Keep"]


class Keep(enum.Enum):
    """The type of :data:`KEEP`."""

    KEEP = "keep"


KEEP: Literal[Keep.KEEP] = Keep.KEEP
"""``set_limits``' default for a limit it should leave as it is."""


class FlowControl:
    """Reads and changes the flow limits of event types (the store does the Redis side).

    A partitioned type's limits are split between its partitions (every shard of
    every layout in use), each partition's HASH holding its share and the
    type's figure; see :mod:`delayq.flow.limits` and docs/FLOW.md.
    """

    def __init__(self, store: Store):
        self._store = store

    async def _shards(self, name: str, partitions: int) -> list[str]:
        """Every shard whose limits govern the type: of its declared partition count and
        of every layout recorded in Redis (one SMEMBERS)."""
        await self._store.known_types()
        if partitions > 1:
            self._store.declare(name, partitions)
        return self._store.shards(name)

    async def limits(self, name: str, partitions: int, group: str | None) -> FlowLimits:
        """The limits stored for the type (group): the figures set for the whole type."""
        shard = (await self._shards(name, partitions))[0]
        return FlowLimits.from_fields(await self._store.read_limits(shard, group))

    async def set_limits(
        self,
        name: str,
        partitions: int,
        group: str | None,
        *,
        concurrency: int | Keep | None,
        rate: str | Rate | Keep | None,
    ) -> FlowLimits:
        """Change the given limits (``None`` removes one, :data:`KEEP` leaves it)."""
        shard_list = await self._shards(name, partitions)
        n = len(shard_list)
        changes: list[dict[str, str]] = [{} for _ in shard_list]
        if concurrency is not KEEP:
            for change, part in zip(changes, split_concurrency(check_concurrency(concurrency), n),
                                    strict=True):  # fmt: skip
                change.update(part)
        if rate is not KEEP:
            r = None if rate is None else parse_rate(rate)
            for change, part in zip(changes, split_rate(r, n), strict=True):
                change.update(part)
        fields = await self._store.change_shard_limits(shard_list, changes, group)
        return FlowLimits.from_fields(fields)

    async def set_paused(
        self, name: str, partitions: int, group: str | None, paused: bool
    ) -> FlowLimits:
        """Pause or resume the type (group), every partition of it; resuming wakes the
        waiting consumers at once."""
        shard_list = await self._shards(name, partitions)
        change = {"paused": "1" if paused else ""}
        fields = await self._store.change_shard_limits(shard_list, [change] * len(shard_list), group)
        return FlowLimits.from_fields(fields)
