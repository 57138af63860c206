"""``EventService``'s views for the dashboard and the CLI: in-flight and ready events,
searches, run-now, workers and history (:mod:`~delayq.views.browsing`,
:mod:`~delayq.views.searching`)."""

from __future__ import annotations

from ..operations.groups import check_group, check_view
from ..runtime.heartbeat import WorkerInfo
from ..runtime.history import HistoryPoint, Window
from ..views.browsing import DueHistogram, InFlightEvent
from ..views.inspection import EventTypeRef
from ..views.searching import DeadLetterSearch, IdSearch, ReadyEvent
from .parts import ServiceParts

__all__ = ["BrowsingMixin"]


class BrowsingMixin(ServiceParts):
    """The dashboard's and the CLI's views: in flight, ready, due times, searches, workers, history."""

    async def in_flight(
        self,
        event_type: EventTypeRef,
        limit: int = 100,
        offset: int = 0,
        *,
        group: str | None = None,
    ) -> list[InFlightEvent]:
        """Up to ``limit`` in-flight events (class or wire name; of delivery ``group``, the
        default group's without), earliest lease deadline first."""
        name = self._types.name(event_type)
        return await self._browser.in_flight(name, limit, offset, check_group(group))

    async def due_histogram(
        self, event_type: EventTypeRef, *, group: str | None = None
    ) -> DueHistogram:
        """How many scheduled events fall due: overdue, next minute, hour, day, later.
        With ``group``, that delivery group's retries count too."""
        name = self._types.name(event_type)
        return await self._browser.due_histogram(name, check_view(group))

    async def run_now(self, event_type: EventTypeRef, id: str, *, group: str | None = None) -> bool:
        """Hand a scheduled event to the consumers now; False when it is not scheduled.

        Its attempt count and last error are kept (a retry waiting for its backoff
        runs now as that retry). For a type with delivery groups: without ``group``
        every group runs it now; with ``group`` that group alone, the others getting
        it at its due time (see docs/guides/groups.md).
        """
        name = self._types.name(event_type)
        return await self._browser.run_now(name, id, check_view(group))

    async def ready(
        self,
        event_type: EventTypeRef,
        limit: int = 100,
        offset: int = 0,
        *,
        group: str | None = None,
    ) -> list[ReadyEvent]:
        """Up to ``limit`` (≤ 1000) ready events (due, not claimed yet) from position
        ``offset``, in the order consumers get them; of delivery ``group`` (the default
        group's without). Cancel one with :meth:`cancel`."""
        name = self._types.name(event_type)
        return await self._finder.ready(name, limit, offset, check_group(group))

    async def find_ids(self, event_type: EventTypeRef, prefix: str, limit: int = 20) -> IdSearch:
        """Ids of the type's events (in any state and delivery group) that start with
        ``prefix``: at most ``limit``, and whether the search was complete (it looks at
        about 5,000 ids per state and group at most: ZSCAN with MATCH, COUNT 100)."""
        return await self._finder.find_ids(self._types.name(event_type), prefix, limit)

    async def find_dead_letters(
        self,
        event_type: EventTypeRef,
        text: str,
        limit: int = 100,
        offset: int = 0,
        *,
        scan: int = 1000,
        group: str | None = None,
    ) -> DeadLetterSearch:
        """Dead letters (of ``group``) whose last error contains ``text`` (ASCII case
        ignored), among the ``scan`` (≤ 5000) oldest from position ``offset``; the result
        says where to continue (``next_offset``) and whether it reached the end."""
        name = self._types.name(event_type)
        return await self._finder.find_dead_letters(
            name, text, limit, offset, scan, check_group(group)
        )

    # -- workers and history ----------------------------------------------------------

    @property
    def worker_id(self) -> str | None:
        """This process's id in :meth:`workers` (None when ``heartbeat_interval=0``)."""
        heartbeat = self._runtime.heartbeat
        return None if heartbeat is None else heartbeat.worker_id

    async def workers(self, limit: int = 1000) -> list[WorkerInfo]:
        """The live worker processes under the prefix, from their heartbeats (oldest first)."""
        return await self._browser.workers(limit)

    async def history(
        self, event_type: EventTypeRef, window: Window = "hour", *, group: str | None = None
    ) -> list[HistoryPoint]:
        """Handled, failed and lateness of a type (class or wire name; of delivery ``group``,
        the default group's without) per minute (``window="hour"``: 60 points) or per 20
        minutes (``"day"``: 72 points), summed over every worker, oldest first."""
        name = self._types.name(event_type)
        return await self._browser.history(name, window, check_group(group))
