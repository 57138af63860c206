"""``EventService``'s flow control: fleet-wide limits, pause and resume, the flow keys'
backlog (:mod:`~delayq.operations.flow_control`; docs/FLOW.md)."""

from __future__ import annotations

from datetime import timedelta

from ..flow.control import KEEP, Keep
from ..flow.keys import KeyBacklogs
from ..flow.limits import FlowLimits, Rate
from ..operations.groups import check_group
from ..views.inspection import EventTypeRef
from .parts import ServiceParts

__all__ = ["FlowMixin"]


class FlowMixin(ServiceParts):
    """Flow limits of a type or group, pausing and resuming it, its flow keys' backlog."""

    async def set_limits(
        self,
        event_type: EventTypeRef,
        *,
        concurrency: int | Keep | None = KEEP,
        rate: str | Rate | Keep | None = KEEP,
        per_key_concurrency: int | Keep | None = KEEP,
        per_key_rate: str | Rate | Keep | None = KEEP,
        group: str | None = None,
        priority_aging: timedelta | Keep | None = KEEP,
    ) -> FlowLimits:
        """Store fleet-wide flow limits of ``event_type`` (or of one delivery ``group``).

        ``concurrency``: handlers in flight across every process (live leases,
        so a crashed worker's slots come back when its leases expire).
        ``rate``: handler starts per period across every process, e.g.
        ``"100/s"``, ``"6000/min"``, ``"5/10s"``, ``"100/s burst 20"`` (the
        bucket: starts allowed at once after an idle spell; default 100 ms
        worth, at least 1) or a :class:`~delayq.flow.limits.Rate`. ``None`` removes
        a limit; a limit not given is left as it is. Every process obeys the
        change within about a second; ``add_handler``'s ``concurrency`` still
        bounds each process. Returns the limits now stored. Raises
        ``ValueError`` for a bad value. On a partitioned type each partition
        enforces a share of the limit, the shares adding up to it (so
        ``concurrency`` must be at least the partition count; see
        docs/FLOW.md, "Partitioned types"). ``per_key_concurrency`` and
        ``per_key_rate`` are the same limits for each flow key separately
        (``enqueue_*(..., key=...)``; events without a key share one):
        ``per_key_concurrency=1`` runs each key's events one at a time, in the
        order they became ready. Per-key limits on a partitioned type raise
        ``ValueError`` (a key's events are spread over the partitions).
        ``priority_aging`` (a timedelta): priority levels' anti-starvation; a ready event
        waiting for ``t`` is claimed as level ``max(0, level - t // priority_aging)``,
        ties going to the earlier due time (docs/guides/priorities.md). None: strict
        priority (the default).
        """
        name, partitions = self._flow_type(event_type)
        return await self._flow.set_limits(
            name,
            partitions,
            check_group(group),
            concurrency=concurrency,
            rate=rate,
            per_key_concurrency=per_key_concurrency,
            per_key_rate=per_key_rate,
            priority_aging=priority_aging,
        )

    async def limits(self, event_type: EventTypeRef, *, group: str | None = None) -> FlowLimits:
        """The flow limits stored for ``event_type`` (or one delivery ``group``), paused
        state included; all None/False when none is set."""
        name, partitions = self._flow_type(event_type)
        return await self._flow.limits(name, partitions, check_group(group))

    async def pause(self, event_type: EventTypeRef, group: str | None = None) -> None:
        """Start no new handler of ``event_type`` (or of ``group``) in any process.

        Events are still accepted, scheduled and made ready; running handlers
        finish. Once this returns no claim succeeds, so the only handlers that
        start afterwards are those of events already claimed. Durable (stored
        in Redis) until :meth:`resume`.
        """
        name, partitions = self._flow_type(event_type)
        await self._flow.set_paused(name, partitions, check_group(group), True)

    async def resume(self, event_type: EventTypeRef, group: str | None = None) -> None:
        """Undo :meth:`pause`: waiting consumers are woken at once (within a second at most)."""
        name, partitions = self._flow_type(event_type)
        await self._flow.set_paused(name, partitions, check_group(group), False)

    async def key_backlog(
        self, event_type: EventTypeRef, *, group: str | None = None, limit: int = 10
    ) -> KeyBacklogs:
        """The flow keys of ``event_type`` (or one delivery ``group``) with the most ready
        events, at most ``limit`` (docs/FLOW.md, "Flow keys"): per key its ready events,
        running deliveries and whether a per-key limit holds it back. Looks at up to
        1,000 keys with work (``KeyBacklogs.scanned``); read-only."""
        name = self._types.name(event_type)
        cls = self._types.cls_of(name)
        partitions = 1 if cls is None else cls.event_partitions
        return await self._flow.key_backlog(name, partitions, check_group(group), limit)

    def _flow_type(self, event_type: EventTypeRef) -> tuple[str, int]:
        name = self._types.name(event_type)
        cls = self._types.cls_of(name)
        return name, 1 if cls is None else cls.event_partitions
