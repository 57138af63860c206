"""Views of one event type that the dashboard needs beyond the lookup API.

In-flight events with their leases, a histogram of due times, and running a
scheduled event now. Each is one read-only script (or, for ``run_now``, one
atomic script) through :class:`~delayq.store.Store`, bounded by its page size.

For a type with delivery groups each view takes ``group``: the in-flight
events of that group, and the due times of what it will get (the type's
schedule plus the group's own retries).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from .events import validate_name
from .routing import Router
from .store import Store

__all__ = [
    "DUE_RANGES",
    "DueHistogram",
    "InFlightEvent",
    "check_group_name",
    "due_histogram",
    "in_flight",
    "ready_ids",
    "run_now",
]

DUE_RANGES: tuple[tuple[str, int], ...] = (
    ("overdue", 0),
    ("next minute", 60_000),
    ("next hour", 3_600_000),
    ("next day", 86_400_000),
)
"""Labels and upper bounds (ms from now) of the due-time ranges; a last range is ``later``."""

MAX_PAGE = 1000


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


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


@dataclass(frozen=True, slots=True)
class DueHistogram:
    """How many scheduled events fall due in each range, counted at ``checked_at``."""

    counts: dict[str, int]
    """``overdue``, ``next minute``, ``next hour``, ``next day``, ``later`` -> count (each range
    excludes the earlier ones)."""
    checked_at: datetime
    """Redis's time of the count."""


def check_group_name(group: str | None) -> str | None:
    """A group name as given (``"default"`` kept), validated; None stays None."""
    return None if group is None else validate_name(group, "group name")


def _check_page(limit: int, offset: int) -> None:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be an int from 1 to {MAX_PAGE}, not {limit!r}")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, not {offset!r}")


async def in_flight(
    store: Store, type_name: str, limit: int = 100, offset: int = 0, *, group: str | None = None
) -> list[InFlightEvent]:
    """Up to ``limit`` in-flight events of a type (of delivery ``group``; the default
    group's without), earliest lease deadline first (a partitioned type's partitions
    merged)."""
    _check_page(limit, offset)
    group = check_group_name(group)
    shards = store.shards(type_name)
    if len(shards) == 1:
        now_ms, page = await store.inflight_page(shards[0], offset, limit, group=group)
    else:
        now_ms, page = 0, []
        for shard in shards:
            shard_now, part = await store.inflight_page(shard, 0, offset + limit, group=group)
            now_ms = max(now_ms, shard_now)
            page.extend(part)
        page = sorted(page, key=lambda e: (e[1], e[0]))[offset : offset + limit]
    checked = _utc(now_ms)
    return [
        InFlightEvent(raw.decode("utf-8", "replace"), attempt, _utc(deadline), checked)
        for raw, deadline, attempt in page
    ]


async def ready_ids(
    store: Store, type_name: str, limit: int = 100, offset: int = 0, *, group: str | None = None
) -> list[str]:
    """Up to ``limit`` ids waiting unclaimed in a type's ready list (of delivery ``group``;
    the default group's without), oldest push first; a partitioned type's partitions one
    after the other."""
    _check_page(limit, offset)
    group = check_group_name(group)
    shards = store.shards(type_name)
    if len(shards) == 1:
        page = await store.ready_page(shards[0], offset, limit, group=group)
    else:
        page = []
        for shard in shards:
            page.extend(await store.ready_page(shard, 0, offset + limit, group=group))
        page = page[offset : offset + limit]
    return [raw.decode("utf-8", "replace") for raw in page]


async def due_histogram(
    store: Store, type_name: str, *, group: str | None = None
) -> DueHistogram:
    """Scheduled events of a type by when they fall due (five ZCOUNTs in one script per
    partition); with ``group``, that group's retries count too."""
    group = check_group_name(group)
    now_ms, counts = 0, [0] * (len(DUE_RANGES) + 1)
    for shard in store.shards(type_name):
        bounds = [ms for _, ms in DUE_RANGES]
        shard_now, part = await store.due_histogram(shard, bounds, group=group)
        now_ms = max(now_ms, shard_now)
        counts = [a + b for a, b in zip(counts, part, strict=True)]
    labels = [label for label, _ in DUE_RANGES] + ["later"]
    return DueHistogram(dict(zip(labels, counts, strict=True)), _utc(now_ms))


async def run_now(store: Store, type_name: str, event_id: str, group: str | None) -> bool:
    """Hand a scheduled event to the consumers now, in the first layout that has it: for
    every delivery group, or ``group`` alone (see :meth:`delayq.store.Store.run_now`);
    False when it is not scheduled."""
    group = check_group_name(group)
    for shard in Router(store).shards_of_id(type_name, event_id):
        if await store.run_now(shard, event_id, group):
            return True
    return False
