"""The dashboard's Starlette app: pages and live fragments (actions: :mod:`.actions`).

Pages read through the public :class:`~delayq.EventService` API only, one
bounded page at a time. Actions are POSTs checked for a CSRF token and refused
in read-only mode.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..events import validate_name
from ..history import HistoryPoint, Window
from ..keys import DEFAULT_GROUP
from ..limits import FlowLimits
from ..service import EventService
from .actions import Actions
from .charts import Series, bar_chart, line_chart
from .security import AuthHook, Csrf, SecurityMiddleware

__all__ = ["create_app"]

_MAX_TYPES_WITH_CHARTS = 50


def _fmt_time(when: datetime | None) -> str:
    return "–" if when is None else when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = abs(seconds)
    if s < 1:
        text = f"{s * 1000:.0f} ms"
    elif s < 120:
        text = f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    elif s < 7200:
        text = f"{s / 60:.0f} min"
    elif s < 172800:
        text = f"{s / 3600:.1f} h"
    else:
        text = f"{s / 86400:.1f} d"
    return text


def _relative(when: datetime | None, now: datetime) -> str:
    if when is None:
        return ""
    delta = (when - now).total_seconds()
    if abs(delta) < 0.5:
        return "now"
    return f"in {_fmt_seconds(delta)}" if delta > 0 else f"{_fmt_seconds(delta)} ago"


def _pretty_json(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return repr(value)


def _int_param(request: Request, name: str, default: int = 0) -> int:
    try:
        return max(0, int(request.query_params.get(name, default)))
    except ValueError:
        return default


class Dashboard:
    """State and handlers of one dashboard app."""

    def __init__(
        self,
        service: EventService,
        *,
        read_only: bool,
        refresh_seconds: float,
        page_size: int,
        secret: bytes,
        title: str,
    ):
        self.service = service
        self.read_only = read_only
        self.refresh_seconds = refresh_seconds
        self.page_size = page_size
        self.title = title
        self.csrf = Csrf(secret)
        self.env = Environment(
            loader=PackageLoader("delayq.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["time"] = _fmt_time
        self.env.filters["seconds"] = _fmt_seconds
        self.env.filters["pretty_json"] = _pretty_json

    # -- rendering -----------------------------------------------------------

    def render(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        """Render a template with the common context; sets the CSRF cookie when new."""
        token, new_cookie = self.csrf.token(request)
        root = request.scope.get("root_path", "").rstrip("/")
        now = datetime.now(timezone.utc)

        def url(path: str, **params: Any) -> str:
            query = urlencode({k: v for k, v in params.items() if v is not None and v != ""})
            return f"{root}{path}" + (f"?{query}" if query else "")

        html = self.env.get_template(template).render(
            request=request,
            url=url,
            csrf=token,
            read_only=self.read_only,
            refresh=self.refresh_seconds,
            title=self.title,
            prefix=self.service.options.prefix,
            now=now,
            relative=lambda when: _relative(when, now),
            **context,
        )
        response = HTMLResponse(html, status_code=status_code)
        response.headers["Cache-Control"] = "no-store"
        if new_cookie is not None:
            self.csrf.set_cookie(request, response, new_cookie)
        return response

    def type_name(self, request: Request, value: str | None) -> str:
        """An event type's wire name from a query or form (400 when it is not a valid one)."""
        try:
            return validate_name(value or "")
        except (TypeError, ValueError) as exc:
            from starlette.exceptions import HTTPException

            raise HTTPException(400, f"bad event type name: {exc}") from exc

    @staticmethod
    def group_name(value: object) -> str:
        """A delivery group name from a query or form ("default" when absent)."""
        if value is None or value == "":
            return DEFAULT_GROUP
        try:
            return validate_name(str(value), "group name")
        except (TypeError, ValueError) as exc:
            from starlette.exceptions import HTTPException

            raise HTTPException(400, f"bad group name: {exc}") from exc

    @staticmethod
    def group_arg(group: str) -> str | None:
        """The ``group=`` argument of the service's dead-letter calls."""
        return None if group == DEFAULT_GROUP else group

    # -- data ----------------------------------------------------------------

    async def _history_charts(
        self, names: Sequence[str], window: str, group: str | None = None
    ) -> dict[str, Any]:
        win: Window = "day" if window == "day" else "hour"
        shown = list(names)[:_MAX_TYPES_WITH_CHARTS]
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
        p50 = [p.lateness_p50 for p in points]
        p99 = [p.lateness_p99 for p in points]
        return {
            "throughput": line_chart(
                [
                    Series("handled/min", "ok", handled, bars=True),
                    Series("failed/min", "bad", failed, bars=True),
                ],
                title="handled and failed per minute",
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
        }

    async def _overview_context(self, request: Request) -> dict[str, Any]:
        window = "day" if request.query_params.get("window") == "day" else "hour"
        stats = await self.service.stats()
        names = sorted(stats)
        charts, groups = await asyncio.gather(
            self._history_charts(names, window),
            asyncio.gather(*(self.service.groups(n) for n in names)),
        )
        group_counts = dict(zip(names, (len(g) for g in groups), strict=True))
        return {
            "stats": stats,
            "names": names,
            "charts": charts,
            "window": window,
            "group_counts": group_counts,
            "any_groups": any(g != [DEFAULT_GROUP] for g in groups),
            # their charts are the default group's (the type page shows each group's)
            "grouped": {n for n, g in zip(names, groups, strict=True) if g != [DEFAULT_GROUP]},
        }

    async def _type_context(self, request: Request, name: str) -> dict[str, Any]:
        """The live part of a type page, for the selected delivery group.

        A type without named groups reads exactly what it always did. With
        groups, the summary, histogram, upcoming list and in-flight list are the
        selected group's (``group_stats``, and ``group=`` on the views: the
        type's schedule plus that group's retries, its ready and in-flight sets).
        """
        size = self.page_size
        offset = _int_param(request, "offset")
        in_offset = _int_param(request, "in_offset")
        group = self.group_name(request.query_params.get("group"))
        group_stats = await self.service.group_stats(name)
        grouped = list(group_stats) != [DEFAULT_GROUP]
        # the group the views read: None (the type's keys, as always) without named groups
        view = group if grouped else self.group_arg(group)
        histogram, upcoming, in_flight = await asyncio.gather(
            self.service.due_histogram(name, group=view),
            self.service.scheduled(name, limit=size, offset=offset, group=view),
            self.service.in_flight(name, limit=size, offset=in_offset, group=view),
        )
        bars = [(label, n) for label, n in histogram.counts.items()]
        return {
            "name": name,
            "counts": group_stats.get(group if grouped else DEFAULT_GROUP),
            # only a type with a named group gets the per-group table and selector
            "group_stats": group_stats if grouped else {},
            "group": group,
            # links name the group only when it is not the default
            "group_param": self.group_arg(group),
            "histogram": bar_chart(bars, title="scheduled events by due time"),
            "upcoming": upcoming,
            "in_flight": in_flight,
            "offset": offset,
            "in_offset": in_offset,
            "size": size,
            "checked_at": histogram.checked_at,
        }

    # -- pages ---------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        """Every event type: counts, backlog age, history charts."""
        return self.render(request, "overview.html", **await self._overview_context(request))

    async def overview_live(self, request: Request) -> Response:
        """The overview's body, for live refresh."""
        return self.render(request, "_overview_body.html", **await self._overview_context(request))

    async def type_page(self, request: Request) -> Response:
        """One type: due histogram, upcoming, in flight, dead letters, charts."""
        name = self.type_name(request, request.query_params.get("name"))
        context = await self._type_context(request, name)
        group_arg = context["group_param"]
        dead_offset = _int_param(request, "dead_offset")
        window = "day" if request.query_params.get("window") == "day" else "hour"
        dead, charts = await asyncio.gather(
            self.service.dead_letters(
                name, limit=self.page_size, offset=dead_offset, group=group_arg
            ),
            # a named group's history is its own (kept under "type:group")
            self._history_charts([name], window, group_arg),
        )
        counts = context["counts"]
        try:
            limits: FlowLimits | None = await self.service.limits(name, group=group_arg)
        except ValueError:  # a partitioned type has no flow limits
            limits = None
        return self.render(
            request,
            "type.html",
            limits=limits,
            dead=dead,
            dead_offset=dead_offset,
            dead_total=counts.dead if counts is not None else 0,
            charts=charts[name],
            window=window,
            **context,
        )

    async def type_live(self, request: Request) -> Response:
        """The live part of a type page."""
        name = self.type_name(request, request.query_params.get("name"))
        return self.render(request, "_type_live.html", **await self._type_context(request, name))

    async def event_page(self, request: Request) -> Response:
        """One event by type and id; without a type, every type is searched."""
        event_id = request.query_params.get("id", "").strip()
        type_value = request.query_params.get("type", "").strip()
        stats = await self.service.stats()
        names = sorted(stats)
        if not event_id:
            return self.render(request, "search.html", names=names, found=[], event_id="",
                               type_name=type_value, searched=False)  # fmt: skip
        if type_value:
            candidates = [self.type_name(request, type_value)]
        else:
            candidates = names
        infos = await asyncio.gather(*(self.service.inspect(n, event_id) for n in candidates))
        found = [i for i in infos if i.state != "absent"]
        if len(found) == 1:
            info = found[0]
            # per group: which actions apply (run now: scheduled; requeue/purge: dead)
            any_scheduled = info.state == "scheduled" or any(
                g.state == "scheduled" for g in info.groups.values()
            )
            return self.render(request, "event.html", info=info, any_scheduled=any_scheduled)
        return self.render(
            request,
            "search.html",
            status_code=404 if not found else 200,
            names=names,
            found=found,
            event_id=event_id,
            type_name=type_value,
            searched=True,
        )

    async def workers_page(self, request: Request) -> Response:
        """Live worker processes, from their heartbeats."""
        workers = await self.service.workers()
        return self.render(request, "workers.html", workers=workers)

    async def not_found(self, request: Request, exc: Exception) -> Response:
        """404 page."""
        return self.render(request, "message.html", status_code=404, heading="Not found",
                           message="No such page.")  # fmt: skip


def create_app(
    redis: str | EventService,
    prefix: str | None = None,
    *,
    read_only: bool = False,
    auth: AuthHook | None = None,
    refresh_seconds: float = 5.0,
    page_size: int = 25,
    secret: str | bytes | None = None,
    title: str = "delayq",
) -> Starlette:
    """The dashboard as a Starlette app (mount it, or serve it with uvicorn).

    ``redis`` is a Redis URL (the app then owns an unstarted
    :class:`~delayq.EventService` for ``prefix``, default ``"delayq"``, closed
    when the app shuts down) or an existing service (its prefix is used).
    ``read_only`` hides and refuses every action. ``auth(request)`` is called for
    every request (see :data:`~delayq.dashboard.security.AuthHook`).
    ``refresh_seconds`` is how often the overview and type pages refresh
    themselves (0: never), ``page_size`` the rows per list page (1..1000).
    ``secret`` signs CSRF tokens (default: random per app; set it when several
    processes serve the same dashboard behind a load balancer).
    """
    owned: EventService | None = None
    if isinstance(redis, EventService):
        service = redis
        if prefix is not None and prefix != service.options.prefix:
            raise ValueError(
                f"prefix {prefix!r} differs from the service's {service.options.prefix!r}"
            )
    elif isinstance(redis, str):
        service = owned = EventService.from_url(
            redis,
            prefix=prefix or "delayq",
            enable_scheduling=False,
            heartbeat_interval=0,
            history_interval=0,
        )
    else:
        raise TypeError(f"redis must be a Redis URL or an EventService, not {redis!r}")
    if not isinstance(page_size, int) or not 1 <= page_size <= 1000:
        raise ValueError(f"page_size must be an int from 1 to 1000, not {page_size!r}")
    if refresh_seconds < 0:
        raise ValueError("refresh_seconds must be >= 0")
    if secret is None:
        key = secrets.token_bytes(32)
    else:
        key = secret.encode() if isinstance(secret, str) else bytes(secret)
    dash = Dashboard(
        service,
        read_only=read_only,
        refresh_seconds=refresh_seconds,
        page_size=page_size,
        secret=key,
        title=title,
    )

    actions = Actions(dash)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if owned is not None:
                await owned.aclose()

    routes = [
        Route("/", dash.overview, name="overview"),
        Route("/live/overview", dash.overview_live, name="overview_live"),
        Route("/type", dash.type_page, name="type"),
        Route("/live/type", dash.type_live, name="type_live"),
        Route("/event", dash.event_page, name="event"),
        Route("/workers", dash.workers_page, name="workers"),
        Route("/actions/dead", actions.dead, methods=["POST"], name="dead_action"),
        Route("/actions/event", actions.event, methods=["POST"], name="event_action"),
        Route("/actions/flow", actions.flow, methods=["POST"], name="flow_action"),
        Mount("/static", StaticFiles(packages=[("delayq.dashboard", "static")]), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SecurityMiddleware, auth=auth)],
        exception_handlers={404: dash.not_found},
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.dashboard = dash
    return app
