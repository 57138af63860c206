"""What the dashboard shows beyond the lookups of :mod:`delayq.views.inspection`.

In-flight events with their leases, a histogram of due times, running a
scheduled event now, the live workers and the handled/failed history. Each
is one script (or one read) per shard through :class:`~delayq.storage.store.Store`,
bounded by its page size; :class:`Browser` holds them for the service.

For a type with delivery groups each view takes ``group``: the in-flight
events of that group, and the due times of what it will get (the type's
schedule plus the group's own retries).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..partitions.routing import Router
from ..runtime.heartbeat import WorkerInfo, read_workers
from ..runtime.history import HistoryPoint, Window, read_history
from ..storage.store import Store
from .records import RunProgress, check_page, merged_page, utc

__all__ = ["DUE_RANGES", "Browser", "DueHistogram", "InFlightEvent"]

DUE_RANGES: tuple[tuple[str, int], ...] = (
    ("overdue", 0),
    ("next minute", 60_000),
    ("next hour", 3_600_000),
    ("next day", 86_400_000),
)
"""Labels and upper bounds (ms from now) of the due-time ranges; a last range is ``later``."""


@dataclass(frozen=True, slots=True)
class InFlightEvent:
    """An event a consumer has claimed and whose handler runs (or whose lease is running out)."""

    id: str
    """The event id."""
    attempt: int
    """Which delivery this is (1 = first)."""
    lease_deadline: datetime
    """When the lease runs out unless the handler's process renews it (UTC, Redis's clock)."""
    checked_at: datetime
    """Redis's time of the read."""
    progress: RunProgress | None = None
    """What its handler last reported with ``Delivery.progress``, if anything."""


@dataclass(frozen=True, slots=True)
class DueHistogram:
    """How many scheduled events fall due in each range, counted at ``checked_at``."""

    counts: dict[str, int]
    """``overdue``, ``next minute``, ``next hour``, ``next day``, ``later`` -> count (each range
    excludes the earlier ones)."""
    checked_at: datetime
    """Redis's time of the count."""


class Browser:
    """The dashboard's views for :class:`~delayq.EventService` (its methods delegate here)."""

    def __init__(self, store: Store, router: Router):
        self._store = store
        self._router = router

    async def in_flight(
        self, type_name: str, limit: int, offset: int, group: str | None
    ) -> list[InFlightEvent]:
        """Up to ``limit`` in-flight events of a type (of delivery ``group``; None: the
        default group), earliest lease deadline first (a partitioned type's partitions
        merged)."""
        check_page(limit, offset)
        store = self._store
        shards = store.types.shards(type_name)
        now_ms, page = await merged_page(
            shards,
            lambda shard, at, count: store.browsing.inflight_page(shard, at, count, group=group),
            offset,
            limit,
            key=lambda e: (e[1], e[0]),
        )
        checked = utc(now_ms)
        ids = [raw for raw, _, _ in page]
        reported: dict[bytes, bytes] = {}
        for shard in shards if ids else []:
            reported.update(await store.running.progress_many(shard, group, ids))
        return [
            InFlightEvent(
                raw.decode("utf-8", "replace"),
                attempt,
                utc(deadline),
                checked,
                RunProgress.decode(reported[raw]) if raw in reported else None,
            )
            for raw, deadline, attempt in page
        ]

    async def due_histogram(self, type_name: str, group: str | None) -> DueHistogram:
        """Scheduled events of a type by when they fall due (five ZCOUNTs in one script per
        partition); with ``group``, that group's retries count too."""
        now_ms, counts = 0, [0] * (len(DUE_RANGES) + 1)
        bounds = [ms for _, ms in DUE_RANGES]
        for shard in self._store.types.shards(type_name):
            shard_now, part = await self._store.browsing.due_histogram(shard, bounds, group=group)
            now_ms = max(now_ms, shard_now)
            counts = [a + b for a, b in zip(counts, part, strict=True)]
        labels = [label for label, _ in DUE_RANGES] + ["later"]
        return DueHistogram(dict(zip(labels, counts, strict=True)), utc(now_ms))

    async def run_now(self, type_name: str, event_id: str, group: str | None) -> bool:
        """Hand a scheduled event to the consumers now, in the first layout that has it: for
        every delivery group, or ``group`` alone (see :meth:`delayq.storage.scheduling.Scheduling.run_now`);
        False when it is not scheduled."""
        for shard in self._router.shards_of_id(type_name, event_id):
            if await self._store.scheduling.run_now(shard, event_id, group):
                return True
        return False

    async def workers(self, limit: int) -> list[WorkerInfo]:
        """The live worker processes under the prefix, from their heartbeats (oldest first)."""
        return await read_workers(self._store, limit)

    async def history(
        self, type_name: str, window: Window, group: str | None
    ) -> list[HistoryPoint]:
        """Handled, failed and lateness of a type (of delivery ``group``) per period."""
        return await read_history(self._store, type_name, window, group=group)
