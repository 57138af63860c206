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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ..service import EventService

__all__ = ["QueueDepthCollector", "TypeDepth", "read_depth"]

log = logging.getLogger("delayq.prometheus")


@dataclass(frozen=True, slots=True)
class TypeDepth:
    """The queue state of one event type at one moment."""

    scheduled: int
    """Events waiting for their due time (or for the scheduler to move them)."""
    ready: int
    """Events in the ready list, waiting for a consumer."""
    in_flight: int
    """Events claimed by a consumer whose lease runs."""
    dead: int
    """Dead letters."""
    due: int
    """Events whose due time has passed and that no handler has yet: due ones still
    scheduled, plus the ready ones."""
    oldest_overdue_seconds: float
    """How long the oldest of the ``due`` events has been due (0 when there is none)."""
    next_due_seconds: float | None
    """Time until the next scheduled event is due (negative when overdue), or None."""


async def read_depth(service: EventService) -> dict[str, TypeDepth]:
    """Read the depth of every event type used under the service's prefix.

    Cost: SMEMBERS, TIME, then one pipeline of 7 read-only commands per type
    (4 ZCARD, ZCOUNT, ZRANGE 0 0, LINDEX): O(log n) each, two round trips plus
    one for the pipeline.
    """
    # Internal stop-gap: it reads the keys through the store's client. Once the
    # service has a public per-type lookup (counts with the next due time and
    # the backlog age), this function becomes a thin call to it.
    store = service.store
    names = sorted(await store.known_types())
    if not names:
        return {}
    seconds, micros = await store.redis.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    async with store.redis.pipeline(transaction=False) as pipe:
        for name in names:
            keys = store.keys.for_type(name)
            pipe.zcard(keys.scheduled)
            pipe.zcard(keys.queued)
            pipe.zcard(keys.inflight)
            pipe.zcard(keys.dead)
            pipe.zcount(keys.scheduled, "-inf", now_ms)
            pipe.zrange(keys.scheduled, 0, 0, withscores=True)
            pipe.lindex(keys.ready, -1)
        replies = await pipe.execute()
    depth = {}
    for i, name in enumerate(names):
        scheduled, ready, in_flight, dead, due_scheduled, first, oldest_ready = replies[
            7 * i : 7 * i + 7
        ]
        oldest_ms: float = math.inf
        next_due: float | None = None
        if first:
            first_due = float(first[0][1])
            next_due = (first_due - now_ms) / 1000
            if first_due <= now_ms:
                oldest_ms = first_due
        if oldest_ready:
            # ready entries are "<due ms>:<id>", pushed left and popped right
            head = oldest_ready.split(b":", 1)[0]
            if head.isdigit():
                oldest_ms = min(oldest_ms, float(head))
        due = int(due_scheduled) + int(ready)
        depth[name] = TypeDepth(
            scheduled=int(scheduled),
            ready=int(ready),
            in_flight=int(in_flight),
            dead=int(dead),
            due=due,
            oldest_overdue_seconds=(
                max(0.0, (now_ms - oldest_ms) / 1000) if due and oldest_ms < math.inf else 0.0
            ),
            next_due_seconds=next_due,
        )
    return depth


class QueueDepthCollector(Collector):
    """A prometheus-client collector of the queue depth under one service's prefix.

    Exports, per event type: ``{ns}_queue_events{state=scheduled|ready|in_flight|dead}``,
    ``{ns}_queue_due_events`` (due, not yet handled) and
    ``{ns}_queue_oldest_overdue_seconds``; and ``{ns}_queue_up`` (1 when the last
    read worked). Await :meth:`refresh` before rendering (the ASGI app and
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
        read: Callable[[EventService], Awaitable[dict[str, TypeDepth]]] = read_depth,
    ):
        if not 0 <= cache_seconds <= 3600:
            raise ValueError(f"cache_seconds must be between 0 and 3600, not {cache_seconds!r}")
        self.service = service
        self.namespace = namespace
        self.cache_seconds = cache_seconds
        self._read = read
        self._lock = asyncio.Lock()
        self._snapshot: dict[str, TypeDepth] = {}
        self._read_at = -math.inf
        self._up = 0
        self.reads = 0
        """How many times Redis was read (a cached scrape does not count)."""

    @property
    def snapshot(self) -> dict[str, TypeDepth]:
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
                self._snapshot = await self._read(self.service)
                self._up = 1
            except Exception as exc:  # Redis away: report it, keep the last figures
                self._up = 0
                log.warning("reading the queue depth failed: %s: %s", type(exc).__name__, exc)
            finally:
                self.reads += 1
                self._read_at = time.monotonic()

    def describe(self) -> Iterator[Metric]:
        """The metric families (no samples), for the registry's duplicate check."""
        return iter(self._families({}, 0))

    def collect(self) -> Iterator[Metric]:
        """The figures of the last read."""
        return iter(self._families(self._snapshot, self._up))

    def _families(self, snapshot: dict[str, TypeDepth], up: int) -> list[Metric]:
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
        up_family = GaugeMetricFamily(
            f"{ns}_queue_up", "1 when the last read of the queue depth from Redis worked"
        )
        for name, d in sorted(snapshot.items()):
            for state in ("scheduled", "ready", "in_flight", "dead"):
                events.add_metric([name, state], getattr(d, state))
            due.add_metric([name], d.due)
            oldest.add_metric([name], d.oldest_overdue_seconds)
        up_family.add_metric([], up)
        return [events, due, oldest, up_family]
