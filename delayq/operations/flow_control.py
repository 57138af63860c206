"""Fleet-wide flow limits and pausing: the service's operations on a type's limits HASH.

The limits are stored in Redis and enforced where events are claimed
(``lua/claim.lua``; the consumer's side is :mod:`delayq.runtime.flow_waits`), so a change
reaches every process at its next claim, within about a second. See
docs/FLOW.md.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from ..flow.control import KEEP, Keep
from ..flow.keys import KeyBacklog, KeyBacklogs
from ..flow.limits import (
    FlowLimits,
    Rate,
    aging_ms,
    check_concurrency,
    parse_rate,
    split_concurrency,
    split_rate,
)
from ..storage.store import Store

__all__ = ["FlowControl"]


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
        await self._store.types.known_types()
        if partitions > 1:
            self._store.types.declare(name, partitions)
        return self._store.types.shards(name)

    async def limits(self, name: str, partitions: int, group: str | None) -> FlowLimits:
        """The limits stored for the type (group): the figures set for the whole type."""
        shard = (await self._shards(name, partitions))[0]
        return FlowLimits.from_fields(await self._store.limits.read_limits(shard, group))

    async def set_limits(
        self,
        name: str,
        partitions: int,
        group: str | None,
        *,
        concurrency: int | Keep | None,
        rate: str | Rate | Keep | None,
        per_key_concurrency: int | Keep | None = KEEP,
        per_key_rate: str | Rate | Keep | None = KEEP,
        priority_aging: timedelta | Keep | None = KEEP,
    ) -> FlowLimits:
        """Change the given limits (``None`` removes one, :data:`KEEP` leaves it)."""
        shard_list = await self._shards(name, partitions)
        n = len(shard_list)
        changes: list[dict[str, str]] = [{} for _ in shard_list]
        if concurrency is not KEEP:
            for change, part in zip(
                changes, split_concurrency(check_concurrency(concurrency), n), strict=True
            ):
                change.update(part)
        if rate is not KEEP:
            r = None if rate is None else parse_rate(rate)
            for change, part in zip(changes, split_rate(r, n), strict=True):
                change.update(part)
        setting_per_key = any(v not in (KEEP, None) for v in (per_key_concurrency, per_key_rate))
        if n > 1 and setting_per_key:
            # a key's events spread over the partitions by id: no share of a per-key
            # limit would hold for the key as a whole
            raise ValueError(
                f"{name}: per-key limits are not supported on a partitioned type (a key's "
                "events are spread over its partitions; see docs/FLOW.md)"
            )
        aging = None
        if priority_aging is not KEEP:  # every partition ages its levels alike
            aging = "" if priority_aging is None else str(aging_ms(priority_aging))
        for shard, change in zip(shard_list, changes, strict=True):
            change.update(self._per_key_changes(shard, per_key_concurrency, per_key_rate))
            if aging is not None:
                change["aging"] = aging
        fields = await self._store.limits.change_shard_limits(shard_list, changes, group)
        return FlowLimits.from_fields(fields)

    def _per_key_changes(
        self, shard: str, concurrency: int | Keep | None, rate: str | Rate | Keep | None
    ) -> dict[str, str]:
        """The fields of the per-key limits (docs/FLOW.md, "Flow keys")."""
        changes: dict[str, str] = {}
        if concurrency is not KEEP:
            c = check_concurrency(concurrency)
            changes["key_concurrency"] = "" if c is None else str(c)
        if rate is not KEEP:
            if rate is None:
                changes.update(key_rate_n="", key_rate_ms="", key_burst="", channel="", shard="")
            else:
                r = parse_rate(rate)
                changes.update(
                    key_rate_n=str(r.count), key_rate_ms=str(r.period_ms), key_burst=str(r.burst)
                )
                # claim.lua wakes the scheduler for a key whose next token is due
                changes.update(channel=self._store.keys.wakeup_channel, shard=shard)
        return changes

    async def set_paused(
        self, name: str, partitions: int, group: str | None, paused: bool
    ) -> FlowLimits:
        """Pause or resume the type (group), every partition of it; resuming wakes the
        waiting consumers at once."""
        shard_list = await self._shards(name, partitions)
        change = {"paused": "1" if paused else ""}
        fields = await self._store.limits.change_shard_limits(
            shard_list, [change] * len(shard_list), group
        )
        return FlowLimits.from_fields(fields)

    async def key_backlog(
        self, name: str, partitions: int, group: str | None, limit: int, scan: int = 1000
    ) -> KeyBacklogs:
        """The flow keys with the most ready events (of up to ``scan`` keys with work, in
        every partition)."""
        if not 1 <= limit <= scan:
            raise ValueError(f"limit must be from 1 to {scan}, not {limit!r}")
        merged: dict[str, tuple[int, int, int]] = {}  # a key may be in several partitions
        rotating = parked = 0
        shards = [name] if partitions == 1 else self._store.types.shards(name)
        for shard in shards:
            r, p, found = await self._store.limits.key_backlog(shard, group, scan)
            rotating, parked = rotating + r, parked + p
            for key, ready, running, until in found:
                a, b, c = merged.get(key, (0, 0, -1))
                merged[key] = (a + ready, b + running, max(c, until))
        rows = [
            KeyBacklog(
                key,
                ready,
                running,
                None if until < 0 else datetime.fromtimestamp(until / 1000, timezone.utc),
            )
            for key, (ready, running, until) in merged.items()
        ]
        rows.sort(key=lambda b: (-b.ready, b.key))
        return KeyBacklogs(rows[:limit], rotating, parked, len(rows))
