"""The dashboard's queue pages and their live fragments: the overview (every type, its
counts and charts), a type's page, the workers.

Each reads through the public :class:`~delayq.EventService` API, one bounded
page at a time (see docs/DASHBOARD.md, "What it costs Redis"). One event's page (and the
id search) is :mod:`.events`, the schedules' :mod:`.schedules`, the batches'
:mod:`.batches`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..flow.limits import FlowLimits
from ..keyspace.groups import DEFAULT_GROUP, labelled
from ..runtime.history import HistoryPoint, Window
from ..storage.store import QueueCounts, sum_counts
from .charts import Series, bar_chart, line_chart
from .view import DashboardView

__all__ = ["MAX_TYPES_WITH_CHARTS", "Pages", "TypeRow"]

MAX_TYPES_WITH_CHARTS = 50
"""The overview draws charts for this many types at most (the first by name)."""


@dataclass(frozen=True, slots=True)
class TypeRow:
    """One overview row: a type's counts over all its delivery groups, and what needs a look."""

    counts: QueueCounts
    """Ready, in flight and dead summed over the groups; scheduled and backlog age the
    largest group's (every group gets the type's schedule); the earliest next due time."""
    groups: int
    """How many delivery groups it has (1: only the default one)."""
    flags: list[tuple[str, str, str]] = field(default_factory=list)
    """``(kind, group, text)``: ``paused`` for a paused type or group (why its backlog
    grows), ``dead`` for a named group's dead letters, ``no-consumer`` for a group with
    ready events that no live worker handles."""

    @property
    def needs_consumer(self) -> bool:
        """A group has ready events and no live consumer."""
        return any(kind == "no-consumer" for kind, _, _ in self.flags)


def _consumer_key(name: str, group: str) -> str:
    # how heartbeats name a handler: "type", or "type:group" for a named group
    return labelled(name, group)


def type_row(name: str, per_group: Mapping[str, QueueCounts], consumers: set[str]) -> TypeRow:
    """The overview row of a type from its groups' counts (``{"default": c}`` without groups)."""
    counts = list(per_group.values())
    dues = [c.next_due_at for c in counts if c.next_due_at is not None]
    total = QueueCounts(
        scheduled=max(c.scheduled for c in counts),
        ready=sum(c.ready for c in counts),
        in_flight=sum(c.in_flight for c in counts),
        dead=sum(c.dead for c in counts),
        next_due_at=min(dues) if dues else None,
        backlog_age=max(c.backlog_age for c in counts),
        due=sum(c.due for c in counts),
        ready_by_priority=sum_counts(counts).ready_by_priority,  # summed over the groups
        # the type's own (every group's counts read the same waiting set)
        waiting=max(c.waiting for c in counts),
    )
    flags = []
    for group, c in sorted(per_group.items()):
        if c.paused:
            flags.append(("paused", group, "paused" if len(per_group) == 1 else f"{group}: paused"))
    for group, c in sorted(per_group.items(), key=lambda kv: (-kv[1].dead, kv[0])):
        if c.ready and _consumer_key(name, group) not in consumers:
            flags.append(("no-consumer", group, f"{group}: {c.ready:,} ready, no live consumer"))
        if c.dead and len(per_group) > 1:
            flags.append(("dead", group, f"{group}: {c.dead:,} dead"))
    return TypeRow(total, len(per_group), flags)


class Pages:
    """The GET handlers of one :class:`~delayq.dashboard.app.Dashboard`."""

    def __init__(self, dash: DashboardView):
        self.dash = dash
        self.service = dash.service

    # -- charts ----------------------------------------------------------------

    async def _history_charts(
        self, names: Sequence[str], window: str, group: str | None = None
    ) -> dict[str, Any]:
        win: Window = "day" if window == "day" else "hour"
        shown = list(names)[:MAX_TYPES_WITH_CHARTS]
        histories = await asyncio.gather(
            *(self.service.history(n, win, group=group) for n in shown)
        )
        return {n: self._charts(points, win) for n, points in zip(shown, histories, strict=True)}

    @staticmethod
    def _charts(points: list[HistoryPoint], window: str) -> dict[str, Any]:
        labels = [p.start.strftime("%H:%M") for p in points]
        start = "−1 h" if window == "hour" else "−24 h"
        handled = [p.handled_per_minute for p in points]
        failed = [p.failed_per_minute for p in points]
        cancelled = [p.cancelled_per_minute for p in points]
        p50 = [p.lateness_p50 for p in points]
        p99 = [p.lateness_p99 for p in points]
        return {
            "throughput": line_chart(
                [
                    Series("handled/min", "ok", handled, bars=True),
                    Series("failed/min", "bad", failed, bars=True),
                    Series("cancelled/min", "cancelled", cancelled, bars=True),
                ],
                title="handled, failed and cancelled per minute",
                start_label=start,
                point_labels=labels,
            ),
            "lateness": line_chart(
                [Series("p50", "p50", p50), Series("p99", "p99", p99)],
                title="lateness p50 and p99",
                unit=" s",
                start_label=start,
                point_labels=labels,
            ),
            "handled": sum(p.handled for p in points),
            "failed": sum(p.failed for p in points),
            "cancelled": sum(p.cancelled for p in points),
        }

    # -- overview --------------------------------------------------------------

    async def _overview_context(self, request: Request) -> dict[str, Any]:
        window = "day" if request.query_params.get("window") == "day" else "hour"
        stats = await self.service.stats()
        names = sorted(stats)
        charts, groups, workers = await asyncio.gather(
            self._history_charts(names, window),
            asyncio.gather(*(self.service.groups(n) for n in names)),
            self.service.workers(),
        )
        grouped = [n for n, g in zip(names, groups, strict=True) if g != [DEFAULT_GROUP]]
        per_group = dict(
            zip(
                grouped,
                await asyncio.gather(*(self.service.group_stats(n) for n in grouped)),
                strict=True,
            )
        )
        consumers = {key for w in workers for key in w.types}
        rows = {
            n: type_row(n, per_group.get(n) or {DEFAULT_GROUP: stats[n]}, consumers) for n in names
        }
        return {
            "names": names,
            "rows": rows,
            "charts": charts,
            "window": window,
            "any_groups": bool(grouped),
            # their charts are the default group's (the type page shows each group's)
            "grouped": set(grouped),
            "max_charts": MAX_TYPES_WITH_CHARTS,
        }

    async def overview(self, request: Request) -> Response:
        """Every event type: counts over its groups, what needs a look, history charts."""
        return self.dash.render(request, "overview.html", **await self._overview_context(request))

    async def overview_live(self, request: Request) -> Response:
        """The overview's body, for live refresh."""
        context = await self._overview_context(request)
        return self.dash.render(request, "_overview_body.html", **context)

    # -- type ------------------------------------------------------------------

    async def _type_context(self, request: Request, name: str) -> dict[str, Any]:
        """The live part of a type page, for the selected delivery group.

        A type without named groups reads exactly what it always did. With
        groups, the summary, histogram and lists are the selected group's
        (``group_stats``, and ``group=`` on the views: the type's schedule plus
        that group's retries, its ready and in-flight sets).
        """
        dash = self.dash
        size = dash.page_size
        group = dash.group_name(request.query_params.get("group"))
        group_stats = await self.service.group_stats(name)
        grouped = list(group_stats) != [DEFAULT_GROUP]
        # lists read from several sets at once take offset + page of each: bounded deeper
        partitioned = len(self.service.store.types.shards(name)) > 1
        offset = dash.offset(request, "offset", merged=partitioned or grouped)
        r_offset = dash.offset(request, "r_offset", merged=partitioned)
        in_offset = dash.offset(request, "in_offset", merged=partitioned)
        # the group the views read: None (the type's keys, as always) without named groups
        view = group if grouped else dash.group_arg(group)
        histogram, upcoming, ready, in_flight, workers = await asyncio.gather(
            self.service.due_histogram(name, group=view),
            self.service.scheduled(name, limit=size, offset=offset, group=view),
            self.service.ready(name, limit=size, offset=r_offset, group=view),
            self.service.in_flight(name, limit=size, offset=in_offset, group=view),
            self.service.workers(),
        )
        running = self._running(workers, _consumer_key(name, group))
        bars = [(label, n) for label, n in histogram.counts.items()]
        return {
            "name": name,
            "counts": group_stats.get(group if grouped else DEFAULT_GROUP),
            # only a type with a named group gets the per-group table and selector
            "group_stats": group_stats if grouped else {},
            "group": group,
            # links name the group only when it is not the default
            "group_param": dash.group_arg(group),
            "histogram": bar_chart(bars, title="scheduled events by due time"),
            "upcoming": upcoming,
            "ready": ready,
            "in_flight": in_flight,
            "running": running,
            "offset": offset,
            "r_offset": r_offset,
            "in_offset": in_offset,
            "size": size,
            "checked_at": histogram.checked_at,
        }

    @staticmethod
    def _running(workers: Sequence[Any], key: str) -> dict[str, tuple[str, datetime]]:
        """Event id -> (worker ``host:pid``, handler start) from the workers' heartbeats."""
        found: dict[str, tuple[str, datetime]] = {}
        for w in workers:
            for event_id, started in w.running.get(key, ()):
                found[event_id] = (f"{w.host}:{w.pid}", started)
        return found

    async def type_page(self, request: Request) -> Response:
        """One type: due histogram, upcoming, ready, in flight, dead letters, charts."""
        dash = self.dash
        dash.group_name(request.query_params.get("group"))  # a malformed one: 400 first
        name = await dash.known_type(request, request.query_params.get("name"))
        if isinstance(name, Response):
            return name
        context = await self._type_context(request, name)
        group_arg = context["group_param"]
        dead_offset = dash.offset(
            request, "dead_offset", merged=len(self.service.store.types.shards(name)) > 1
        )
        error = request.query_params.get("error", "").strip()[:200]
        window = "day" if request.query_params.get("window") == "day" else "hour"
        search = None
        if error:
            search, charts = await asyncio.gather(
                self.service.find_dead_letters(
                    name, error, limit=dash.page_size, offset=dead_offset, group=group_arg
                ),
                self._history_charts([name], window, group_arg),
            )
            dead = search.items
        else:
            dead, charts = await asyncio.gather(
                self.service.dead_letters(
                    name, limit=dash.page_size, offset=dead_offset, group=group_arg
                ),
                # a named group's history is its own (kept under "type:group")
                self._history_charts([name], window, group_arg),
            )
        counts = context["counts"]
        try:
            limits: FlowLimits | None = await dash.service.limits(name, group=group_arg)
        except ValueError:  # an unreadable group name: no flow card
            limits = None
        # flow keys: the biggest per-key backlogs (empty for a type without keys)
        backlog = await dash.service.key_backlog(name, group=group_arg, limit=10)
        return dash.render(
            request,
            "type.html",
            limits=limits,
            key_backlog=backlog,
            dead=dead,
            dead_offset=dead_offset,
            dead_total=counts.dead if counts is not None else 0,
            error=error,
            search=search,
            charts=charts[name],
            window=window,
            **context,
        )

    async def type_live(self, request: Request) -> Response:
        """The live part of a type page."""
        self.dash.group_name(request.query_params.get("group"))  # a malformed one: 400 first
        name = await self.dash.known_type(request, request.query_params.get("name"))
        if isinstance(name, Response):
            return name
        context = await self._type_context(request, name)
        return self.dash.render(request, "_type_live.html", **context)

    # -- workers ---------------------------------------------------------------

    async def workers_page(self, request: Request) -> Response:
        """Live worker processes, from their heartbeats."""
        workers = await self.service.workers()
        return self.dash.render(request, "workers.html", workers=workers)
