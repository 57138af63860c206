"""``EventService``'s lookups, dead letters, counts and repartitioning
(:mod:`~delayq.views.inspection`, :mod:`~delayq.partitions.routing`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from ..durations import delay_ms
from ..events import Event
from ..operations.groups import check_group, check_view
from ..partitions.repartition import RepartitionResult
from ..storage.store import QueueCounts
from ..views.inspection import DeadLetter, EventInfo, EventTypeRef, ScheduledEvent, check_page
from .parts import ServiceParts

__all__ = ["InspectionMixin"]


class InspectionMixin(ServiceParts):
    """Looking events up, dead letters (list, requeue, purge), counts, repartitioning."""

    async def dead_letters(
        self,
        event_type: EventTypeRef,
        limit: int = 100,
        offset: int = 0,
        *,
        group: str | None = None,
    ) -> list[DeadLetter]:
        """Up to ``limit`` dead letters of ``event_type`` (class or wire name; in ``group``),
        oldest first."""
        name = self._types.name(event_type)
        return await self._inspector.dead_letters(name, limit, offset, group=check_group(group))

    async def inspect(self, event_type: EventTypeRef, id: str) -> EventInfo:
        """Where one event is (scheduled, ready, in flight, dead, absent) and all Redis holds
        about it, read in one atomic step. ``event_type`` is the class or its wire name."""
        name = self._types.name(event_type)
        return await self._inspector.inspect(name, id)

    async def children(
        self, event_type: EventTypeRef, id: str, *, limit: int = 50
    ) -> tuple[int, list[tuple[str, str]]]:
        """The events waiting for the next completion of one event (enqueued with
        ``after=[(event_type, id)]``; docs/WORKFLOWS.md, "Dependencies"): how many, and the
        first ``limit`` as ``(type name, id)`` in the order they were linked. A child is
        listed from when it is linked until the event's completion is handed to it."""
        name = self._types.name(event_type)
        if not isinstance(id, str) or not id:
            raise ValueError(f"event id must be a non-empty str, not {id!r}")
        check_page(limit, 0)
        return await self._inspector.children(name, id, limit)

    async def scheduled(
        self,
        event_type: EventTypeRef,
        limit: int = 100,
        offset: int = 0,
        *,
        group: str | None = None,
    ) -> list[ScheduledEvent]:
        """Up to ``limit`` (≤ 1000) scheduled events from position ``offset``, earliest due
        first. Retries waiting for their backoff are scheduled events too. With ``group``
        (``"default"`` included), the type's schedule and that group's retries."""
        name = self._types.name(event_type)
        return await self._inspector.scheduled(name, limit, offset, group=check_view(group))

    async def requeue_dead_letters(
        self,
        event_type: EventTypeRef,
        ids: Iterable[str] | None = None,
        delay: float | timedelta = 0,
        *,
        group: str | None = None,
    ) -> int:
        """Schedule dead letters (all, or those in ``ids``) again after ``delay``; return how many.

        Their attempt counts start over. ``event_type`` is the class or its wire name.
        With ``group``, that group's dead letters, delivered again to that group alone.
        """
        name = self._types.name(event_type)
        return await self._router.requeue_dead(name, ids, delay_ms(delay), check_group(group))

    async def purge_dead_letters(
        self,
        event_type: EventTypeRef,
        ids: Iterable[str] | None = None,
        *,
        group: str | None = None,
    ) -> int:
        """Delete dead letters (all, or those in ``ids``; of ``group``) for good; return how many.

        ``event_type`` is the class or its wire name. An event leaves Redis with the last
        group that held it.
        """
        name = self._types.name(event_type)
        return await self._router.purge_dead(name, ids, check_group(group))

    async def stats(self) -> dict[str, QueueCounts]:
        """Counts per event type name, for every type that has been used under the prefix.

        Each :class:`QueueCounts` also has the next due time and the backlog's age; the
        cost is one read-only script call per type, all in one pipeline.
        """
        return await self._inspector.stats()

    async def stats_for(self, event_type: EventTypeRef) -> QueueCounts:
        """Counts of one event type (class or wire name)."""
        name = self._types.name(event_type)
        return (await self._inspector.stats([name]))[name]

    async def repartition(
        self, event_type: type[Event], *, wait: float = 30.0
    ) -> RepartitionResult:
        """Move ``event_type``'s events from every other partition count into its declared one.

        Run it once every process runs the new ``partitions=N`` (see
        docs/guides/scaling.md, "Changing the partition count"). Scheduled events move at
        once; ready and running ones of the old layout are handled where they
        are, and passes repeat for up to ``wait`` seconds until the old layout
        is empty and retired. Safe to run again (it finishes the job).
        """
        name = self._types.register(event_type)
        return await self._router.repartition(name, event_type.event_partitions, wait)
