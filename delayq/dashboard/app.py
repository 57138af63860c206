"""The dashboard's Starlette app: its shared state (:class:`Dashboard`) and :func:`create_app`.

Pages and live fragments are in :mod:`.pages` (the queues'), :mod:`.events` (one event's),
:mod:`.schedules` and :mod:`.batches`, the POST actions in
:mod:`.actions`, how values are shown in :mod:`.format`, and the CSRF and
Origin checks and security headers in :mod:`.security`. Pages read through the
public :class:`~delayq.EventService` API only, one bounded page at a time.
Actions are POSTs checked for a CSRF token and refused in read-only mode.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any, NoReturn
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..events import validate_name
from ..keyspace.groups import DEFAULT_GROUP, stored_group
from ..service import EventService
from . import format as fmt
from .actions import Actions
from .batches import BatchesPage
from .events import EventPage
from .pages import Pages
from .schedules import SchedulesPage
from .security import AuthHook, Csrf, SecurityMiddleware, normalise_origin

__all__ = ["Dashboard", "create_app"]

MAX_OFFSET = 1_000_000_000
"""The largest list offset a page accepts (beyond: 400)."""
MAX_MERGED_OFFSET = 10_000
"""The largest offset of a list merged from several sorted sets (a partitioned type's
partitions, or a group's retries and the type's schedule): each read takes
``offset + page`` entries of every set, so deeper pages would read whole sets."""


class Dashboard:
    """State and helpers of one dashboard app, shared by its pages and actions."""

    def __init__(
        self,
        service: EventService,
        *,
        read_only: bool,
        refresh_seconds: float,
        page_size: int,
        csrf: Csrf,
        title: str,
    ):
        self.service = service
        self.read_only = read_only
        self.refresh_seconds = refresh_seconds
        self.page_size = page_size
        self.title = title
        self.csrf = csrf
        self.env = Environment(
            loader=PackageLoader("delayq.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
            finalize=fmt.finalize,
        )
        self.env.filters["time"] = fmt.fmt_time
        self.env.filters["ms_time"] = fmt.fmt_ms_time
        self.env.filters["seconds"] = fmt.fmt_seconds
        self.env.filters["pretty_json"] = fmt.pretty_json
        self.env.filters["field"] = fmt.field

    @property
    def max_fields(self) -> int:
        """The most form fields a POST may have: a whole page of selected ids and a few more."""
        return self.page_size + 20

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
            relative=lambda when: fmt.relative(when, now),
            **context,
        )
        response = HTMLResponse(html, status_code=status_code)
        response.headers["Cache-Control"] = "no-store"
        if new_cookie is not None:
            self.csrf.set_cookie(request, response, new_cookie)
        return response

    def message(
        self, request: Request, status_code: int, heading: str, message: str, **context: Any
    ) -> HTMLResponse:
        """A page that says one thing (a refusal, a result, a missing type)."""
        return self.render(
            request,
            "message.html",
            status_code=status_code,
            heading=heading,
            message=message,
            **context,
        )

    @staticmethod
    def bad_request(detail: str) -> NoReturn:
        """Answer 400 with ``detail``."""
        raise HTTPException(400, detail)

    def type_name(self, value: str | None) -> str:
        """An event type's wire name from a query or form (400 when it is not a valid one)."""
        try:
            return validate_name(value or "")
        except (TypeError, ValueError) as exc:
            self.bad_request(f"bad event type name: {exc}")

    async def known_type(self, request: Request, value: str | None) -> str | HTMLResponse:
        """The type's name when the prefix has it, else a 404 page saying it does not exist."""
        name = self.type_name(value)
        if name in await self.service.store.types.known_types():
            return name
        return self.message(
            request,
            404,
            "No such event type",
            f"No event type {name!r} exists under the prefix "
            f"{self.service.options.prefix!r}: nothing was ever enqueued for it.",
            missing_type=True,
        )

    @staticmethod
    def group_name(value: object) -> str:
        """A delivery group name from a query or form ("default" when absent)."""
        if value is None or value == "":
            return DEFAULT_GROUP
        try:
            return validate_name(str(value), "group name")
        except (TypeError, ValueError) as exc:
            raise HTTPException(400, f"bad group name: {exc}") from exc

    @staticmethod
    def group_arg(group: str) -> str | None:
        """The ``group=`` argument of the service's calls (None for the default group)."""
        return stored_group(group)

    def offset(self, request: Request, name: str, *, merged: bool = False) -> int:
        """A list offset from the query: 0 when absent or not a number, 400 when too large
        (``merged``: the list is merged from several sets, see :data:`MAX_MERGED_OFFSET`)."""
        raw = request.query_params.get(name, "")
        try:
            value = int(raw) if raw else 0
        except ValueError:
            return 0
        most = MAX_MERGED_OFFSET if merged else MAX_OFFSET
        if value > most:
            why = " for a type with partitions or delivery groups" if merged else ""
            self.bad_request(f"{name} must be at most {most:,}{why}")
        return max(0, value)


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
    public_origin: str | None = None,
    trust_forwarded: bool = False,
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
    ``public_origin`` (``"https://ops.example.com"``) is the origin browsers see
    when a reverse proxy serves the dashboard: a POST's ``Origin`` must match it.
    Without it, ``trust_forwarded=True`` takes the origin from the proxy's
    ``X-Forwarded-Proto`` and ``X-Forwarded-Host``, and otherwise it is the
    request's own scheme and ``Host`` (see docs/DASHBOARD.md, "Behind a reverse proxy").
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
    origin = None
    if public_origin is not None:
        origin = normalise_origin(public_origin)
        if origin is None:
            raise ValueError(
                f"public_origin must be an origin such as 'https://ops.example.com', "
                f"not {public_origin!r}"
            )
    if secret is None:
        key = secrets.token_bytes(32)
    else:
        key = secret.encode() if isinstance(secret, str) else bytes(secret)
    dash = Dashboard(
        service,
        read_only=read_only,
        refresh_seconds=refresh_seconds,
        page_size=page_size,
        csrf=Csrf(key, public_origin=origin, trust_forwarded=trust_forwarded),
        title=title,
    )
    pages = Pages(dash)
    actions = Actions(dash)
    schedules = SchedulesPage(dash)
    batches = BatchesPage(dash)
    events = EventPage(dash)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if owned is not None:
                await owned.aclose()

    async def not_found(request: Request, exc: Exception) -> Response:
        return dash.message(request, 404, "Not found", "No such page.")

    routes = [
        Route("/", pages.overview, name="overview"),
        Route("/live/overview", pages.overview_live, name="overview_live"),
        Route("/type", pages.type_page, name="type"),
        Route("/live/type", pages.type_live, name="type_live"),
        Route("/event", events.page, name="event"),
        Route("/workers", pages.workers_page, name="workers"),
        Route("/schedules", schedules.page, name="schedules"),
        Route("/batches", batches.list_page, name="batches"),
        Route("/batch", batches.batch_page, name="batch"),
        Route("/live/batch", batches.batch_live, name="batch_live"),
        Route("/actions/schedule", schedules.action, methods=["POST"], name="schedule_action"),
        Route("/actions/dead", actions.dead, methods=["POST"], name="dead_action"),
        Route("/actions/event", actions.event, methods=["POST"], name="event_action"),
        Route("/actions/flow", actions.flow, methods=["POST"], name="flow_action"),
        Mount("/static", StaticFiles(packages=[("delayq.dashboard", "static")]), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SecurityMiddleware, auth=auth)],
        exception_handlers={404: not_found},
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.dashboard = dash
    return app
