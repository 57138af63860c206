"""Fleet-wide flow limits and pausing: the service's operations on a type's limits HASH.

The limits are stored in Redis and enforced where events are claimed
(``lua/claim.lua``; the consumer's side is :mod:`delayq.flow.waits`), so a change
reaches every process at its next claim, within about a second. See
docs/FLOW.md.
"""

from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Literal

from ..storage.store import Store
from .keys import KeyBacklog, KeyBacklogs
from .limits import FlowLimits, Rate, check_concurrency, parse_rate

__all__ = ["KEEP", "FlowControl", "Keep"]


class Keep(enum.Enum):
    """The type of :data:`KEEP`."""

    KEEP = "keep"


KEEP: Literal[Keep.KEEP] = Keep.KEEP
"""``set_limits``' default for a limit it should leave as it is."""


class FlowControl:
    """Reads and changes the flow limits of event types (the store does the Redis side)."""

    def __init__(self, store: Store):
        self._store = store

    async def _shard(self, name: str, partitions: int) -> str:
        """The one shard whose limits govern the type; refuses partitioned types (as
        declared by the class, or as recorded in Redis: one SMEMBERS)."""
        if partitions == 1:
            await self._store.known_types()  # a process that only knows the wire name
        layouts = self._store.layouts(name)
        if partitions > 1 or max(layouts) > 1:
            raise ValueError(
                f"{name}: flow limits and pause are not supported on a partitioned type "
                "(its partitions are claimed on different cluster slots, so no one "
                "script can count them all; see docs/FLOW.md)"
            )
        return name

    async def limits(self, name: str, partitions: int, group: str | None) -> FlowLimits:
        """The limits stored for the type (group)."""
        shard = await self._shard(name, partitions)
        return FlowLimits.from_fields(await self._store.read_limits(shard, group))

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
    ) -> FlowLimits:
        """Change the given limits (``None`` removes one, :data:`KEEP` leaves it)."""
        changes: dict[str, str] = {}
        if concurrency is not KEEP:
            c = check_concurrency(concurrency)
            changes["concurrency"] = "" if c is None else str(c)
        if rate is not KEEP:
            if rate is None:
                changes.update(rate_n="", rate_ms="", burst="", tat="")
            else:
                r = parse_rate(rate)
                changes.update(rate_n=str(r.count), rate_ms=str(r.period_ms), burst=str(r.burst))
        shard = await self._shard(name, partitions)
        changes.update(self._per_key_changes(shard, per_key_concurrency, per_key_rate))
        return FlowLimits.from_fields(await self._store.change_limits(shard, changes, group))

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
                changes.update(key_rate_n=str(r.count), key_rate_ms=str(r.period_ms),
                               key_burst=str(r.burst))  # fmt: skip
                # claim.lua wakes the scheduler for a key whose next token is due
                changes.update(channel=self._store.keys.wakeup_channel, shard=shard)
        return changes

    async def set_paused(
        self, name: str, partitions: int, group: str | None, paused: bool
    ) -> FlowLimits:
        """Pause or resume the type (group); resuming wakes the waiting consumers at once."""
        shard = await self._shard(name, partitions)
        changes = {"paused": "1" if paused else ""}
        return FlowLimits.from_fields(await self._store.change_limits(shard, changes, group))

    async def key_backlog(
        self, name: str, partitions: int, group: str | None, limit: int, scan: int = 1000
    ) -> KeyBacklogs:
        """The flow keys with the most ready events (of up to ``scan`` keys with work, in
        every partition)."""
        if not 1 <= limit <= scan:
            raise ValueError(f"limit must be from 1 to {scan}, not {limit!r}")
        merged: dict[str, tuple[int, int, int]] = {}  # a key may be in several partitions
        rotating = parked = 0
        shards = [name] if partitions == 1 else self._store.shards(name)
        for shard in shards:
            r, p, found = await self._store.key_backlog(shard, group, scan)
            rotating, parked = rotating + r, parked + p
            for key, ready, running, until in found:
                a, b, c = merged.get(key, (0, 0, -1))
                merged[key] = (a + ready, b + running, max(c, until))
        rows = [
            KeyBacklog(key, ready, running,
                       None if until < 0 else datetime.fromtimestamp(until / 1000, timezone.utc))
            for key, (ready, running, until) in merged.items()
        ]  # fmt: skip
        rows.sort(key=lambda b: (-b.ready, b.key))
        return KeyBacklogs(rows[:limit], rotating, parked, len(rows))
