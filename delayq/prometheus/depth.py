"""Queue depth read from Redis at scrape time: what every process of the fleet shares.

The counters of :class:`~delayq.prometheus.PrometheusMetrics` say what *this*
process did; how many events wait, and for how long, is a property of Redis.
:class:`QueueDepthCollector` reads it when Prometheus scrapes, at most once per
``cache_seconds`` however many scrapers ask.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..batches import BATCH_TYPE, BatchCounts
from ..keyspace.groups import DEFAULT_GROUP, group_name
from ..runtime.heartbeat import WorkerInfo
from ..storage.store import QueueCounts

if TYPE_CHECKING:
    from ..service import EventService

__all__ = [
    "BATCH_GAUGE_STATES",
    "QueueDepthCollector",
    "read_batches",
    "read_depth",
    "read_group_depth",
    "read_workers",
]

log = logging.getLogger("delayq.prometheus")


async def read_depth(service: EventService) -> dict[str, QueueCounts]:
    """The counts of every event type used under the service's prefix: ``service.stats()``.

    Cost: one SMEMBERS, then one read-only script call per type, pipelined
    (``counts.lua``: a fixed number of O(log n) commands inside Redis).
    """
    return await service.stats()


async def read_group_depth(
    service: EventService, type_names: list[str]
) -> dict[str, dict[str, QueueCounts]]:
    """Counts per delivery group of those of ``type_names`` that have named groups.

    Cost: one HGETALL per type (its groups), then ``service.group_stats`` for
    each type with named groups; types without groups cost nothing more.
    """
    found = await asyncio.gather(*(service.groups(name) for name in type_names))
    grouped = [name for name, groups in zip(type_names, found) if groups != [DEFAULT_GROUP]]
    counts = await asyncio.gather(*(service.group_stats(name) for name in grouped))
    return dict(zip(grouped, counts))


async def read_workers(service: EventService) -> list[WorkerInfo]:
    """The live worker processes under the prefix, from their heartbeats: ``service.workers()``.

    Cost: one ZRANGE and one MGET of the heartbeat records (a few hundred bytes each).
    """
    return await service.workers()


BATCH_GAUGE_STATES = ("open", "waiting", "stuck")
"""The states ``{ns}_batches`` counts: batches not done yet (a done batch is not a gauge)."""


async def read_batches(
    service: EventService, stuck_after: float | timedelta = timedelta(hours=1)
) -> BatchCounts:
    """The batches under the service's prefix by state, and the relay's work in the batch
    shards: ``service.batch_counts(stuck_after=...)`` (``open``, ``waiting`` and ``stuck``
    make the gauge ``{ns}_batches``; ``relay_backlog`` and ``relay_lag`` the
    ``event_type="delayq:batch"`` series of the relay gauges).

    Cost: one ``SMEMBERS`` (the batch shards in use); for a prefix that never opened a
    batch, nothing more. Otherwise one read-only ``batch_counts.lua`` per batch shard in
    use, pipelined: a few ``ZCARD``/``ZCOUNT`` each, whatever the number of batches (the
    counts have no cap).
    """
    return await service.batch_counts(stuck_after=stuck_after)


class QueueDepthCollector(Collector):
    """A prometheus-client collector of the queue depth under one service's prefix.

    Exports, per event type: ``{ns}_queue_events{state=scheduled|ready|in_flight|dead}``,
    ``{ns}_queue_due_events`` (due, not yet handled) and
    ``{ns}_queue_oldest_overdue_seconds``, ``{ns}_results_kept`` (outcomes kept, types with
    ``results=``), ``{ns}_waiting`` (events waiting for their parents, ``after=[...]``),
    ``{ns}_relay_backlog`` and ``{ns}_relay_lag_seconds`` (the dependency relay's due work
    and its oldest's age; ``event_type="delayq:batch"``: the batch shards', once the prefix
    has opened a batch); for types with named delivery groups,
    ``{ns}_queue_group_events{group=...,state=...}`` per group (``default`` for
    handlers added without a group); from the workers' heartbeats,
    ``{ns}_workers`` (live worker processes), and per type and group the
    handler slots of all of them (``{ns}_workers_concurrency``) and how many
    were busy at their last heartbeat (``{ns}_workers_busy``);
    ``{ns}_batches{state=open|waiting|stuck}`` (batches not done yet,
    :func:`read_batches`; ``batch_stuck_after``: how long a waiting batch may go with no
    member finished before it counts as stuck); and
    ``{ns}_queue_up`` (1 when the last read worked). Await :meth:`refresh` before rendering (the ASGI app and
    :func:`~delayq.prometheus.serve` do): it reads Redis at most once per
    ``cache_seconds`` and shares one read among concurrent scrapes. A failed
    read keeps the previous figures and sets ``queue_up`` to 0.
    """

    def __init__(
        self,
        service: EventService,
        *,
        namespace: str = "delayq",
        cache_seconds: float = 5.0,
        read: Callable[[EventService], Awaitable[dict[str, QueueCounts]]] = read_depth,
        read_groups: Callable[
            [EventService, list[str]], Awaitable[dict[str, dict[str, QueueCounts]]]
        ] = read_group_depth,
        read_workers: Callable[[EventService], Awaitable[list[WorkerInfo]]] = read_workers,
        read_batches: Callable[
            [EventService, float | timedelta], Awaitable[BatchCounts]
        ] = read_batches,
        batch_stuck_after: float | timedelta = timedelta(hours=1),
    ):
        if not 0 <= cache_seconds <= 3600:
            raise ValueError(f"cache_seconds must be between 0 and 3600, not {cache_seconds!r}")
        self.service = service
        self.namespace = namespace
        self.cache_seconds = cache_seconds
        self._read = read
        self._read_groups = read_groups
        self._read_workers = read_workers
        self._read_batches = read_batches
        self.batch_stuck_after = batch_stuck_after
        """A waiting batch with no member finished for this long counts as stuck."""
        self._workers: list[WorkerInfo] = []
        self._batches: BatchCounts | None = None
        self._group_snapshot: dict[str, dict[str, QueueCounts]] = {}
        self._lock = asyncio.Lock()
        self._snapshot: dict[str, QueueCounts] = {}
        self._read_at = -math.inf
        self._up = 0
        self.reads = 0
        """How many times Redis was read (a cached scrape does not count)."""

    @property
    def snapshot(self) -> dict[str, QueueCounts]:
        """The figures of the last successful read."""
        return dict(self._snapshot)

    async def refresh(self) -> None:
        """Read Redis unless the last read is younger than ``cache_seconds``."""
        if time.monotonic() - self._read_at < self.cache_seconds:
            return
        async with self._lock:
            # another scrape may have read while this one waited for the lock
            if time.monotonic() - self._read_at < self.cache_seconds:
                return
            try:
                snapshot = await self._read(self.service)
                groups = await self._read_groups(self.service, sorted(snapshot))
                self._snapshot, self._group_snapshot = snapshot, groups
                self._workers = await self._read_workers(self.service)
                self._batches = await self._read_batches(self.service, self.batch_stuck_after)
                self._up = 1
            except Exception as exc:  # Redis away: report it, keep the last figures
                self._up = 0
                log.warning("reading the queue depth failed: %s: %s", type(exc).__name__, exc)
            finally:
                self.reads += 1
                self._read_at = time.monotonic()

    def describe(self) -> Iterator[Metric]:
        """The metric families (no samples), for the registry's duplicate check."""
        return iter(self._families({}, {}, 0, [], None))

    def collect(self) -> Iterator[Metric]:
        """The figures of the last read."""
        return iter(
            self._families(
                self._snapshot, self._group_snapshot, self._up, self._workers, self._batches
            )
        )

    def _families(
        self,
        snapshot: dict[str, QueueCounts],
        group_snapshot: dict[str, dict[str, QueueCounts]],
        up: int,
        workers: list[WorkerInfo],
        batches: BatchCounts | None,
    ) -> list[Metric]:
        ns = self.namespace
        events = GaugeMetricFamily(
            f"{ns}_queue_events",
            "Events in Redis per type and state (all processes of the prefix)",
            labels=["event_type", "state"],
        )
        due = GaugeMetricFamily(
            f"{ns}_queue_due_events",
            "Events past their due time that no handler has started yet",
            labels=["event_type"],
        )
        oldest = GaugeMetricFamily(
            f"{ns}_queue_oldest_overdue_seconds",
            "How long the oldest due-but-unhandled event has been due (0: none)",
            labels=["event_type"],
        )
        kept = GaugeMetricFamily(
            f"{ns}_results_kept",
            "Outcomes of done events kept for result() (types with results=)",
            labels=["event_type"],
        )
        # a family of its own: summing queue_events by type must not count groups twice
        group_events = GaugeMetricFamily(
            f"{ns}_queue_group_events",
            "Events in Redis per type, delivery group and state, for types with named groups",
            labels=["event_type", "group", "state"],
        )
        up_family = GaugeMetricFamily(
            f"{ns}_queue_up", "1 when the last read of the queue depth from Redis worked"
        )
        # at most 10 priority levels per type: a bounded label set
        ready = GaugeMetricFamily(
            f"{ns}_ready",
            "Ready events per type and priority level (0 most urgent; docs/guides/priorities.md)",
            labels=["event_type", "priority"],
        )
        waiting = GaugeMetricFamily(
            f"{ns}_waiting",
            "Events waiting for their parents (after=[...]; docs/WORKFLOWS.md)",
            labels=["event_type"],
        )
        relay_backlog = GaugeMetricFamily(
            f"{ns}_relay_backlog",
            "Dependency relay work due and not done: completions not handed to every child, "
            "audits past their time; event_type delayq:batch: the batch shards' (their "
            "completions, and the batch sweep's due work) (docs/WORKFLOWS.md)",
            labels=["event_type"],
        )
        relay_lag = GaugeMetricFamily(
            f"{ns}_relay_lag_seconds",
            "How long the oldest of relay_backlog has been due (0 when none)",
            labels=["event_type"],
        )
        for name, d in sorted(snapshot.items()):
            waiting.add_metric([name], d.waiting)
            relay_backlog.add_metric([name], d.relay_backlog)
            relay_lag.add_metric([name], d.relay_lag)
            for state in ("scheduled", "ready", "in_flight", "dead"):
                events.add_metric([name, state], getattr(d, state))
            for level, n in sorted((d.ready_by_priority or {0: d.ready}).items()):
                ready.add_metric([name, str(level)], n)
            due.add_metric([name], d.due)
            oldest.add_metric([name], d.backlog_age)
            kept.add_metric([name], d.results_kept)
        if batches is not None and batches.shards:  # the batch shards' relay work
            relay_backlog.add_metric([BATCH_TYPE], batches.relay_backlog)
            relay_lag.add_metric([BATCH_TYPE], batches.relay_lag)
        for name, groups in sorted(group_snapshot.items()):
            for group, g in sorted(groups.items()):
                for state in ("scheduled", "ready", "in_flight", "dead"):
                    group_events.add_metric([name, group, state], getattr(g, state))
        up_family.add_metric([], up)
        alive = GaugeMetricFamily(
            f"{ns}_workers", "Live worker processes under the prefix (from their heartbeats)"
        )
        alive.add_metric([], len(workers))
        capacity = GaugeMetricFamily(
            f"{ns}_workers_concurrency",
            "Handler slots of every live worker, per type and delivery group",
            labels=["event_type", "group"],
        )
        busy = GaugeMetricFamily(
            f"{ns}_workers_busy",
            "Handlers running in every live worker at its last heartbeat (out of "
            "workers_concurrency)",
            labels=["event_type", "group"],
        )
        slots: dict[tuple[str, str], list[int]] = {}
        for w in workers:
            for label, n in w.types.items():
                # a named group's handler shows as "type:group" (type names hold no ':')
                name, _, group = label.partition(":")
                entry = slots.setdefault((name, group_name(group)), [0, 0])
                entry[0] += n
                entry[1] += w.in_flight.get(label, 0)
        for (name, group), (total, running) in sorted(slots.items()):
            capacity.add_metric([name, group], total)
            busy.add_metric([name, group], running)
        open_batches = GaugeMetricFamily(
            f"{ns}_batches",
            "Batches not done yet, by state: open (adding members), waiting (closed, members "
            "pending), stuck (docs/WORKFLOWS.md)",
            labels=["state"],
        )
        if batches is not None:
            for state in BATCH_GAUGE_STATES:
                open_batches.add_metric([state], getattr(batches, state))
        return [
            events,
            ready,
            waiting,
            relay_backlog,
            relay_lag,
            due,
            oldest,
            kept,
            group_events,
            up_family,
            alive,
            capacity,
            busy,
            open_batches,
        ]
