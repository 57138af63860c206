"""``EventService``: the public API, a thin facade over the parts that do the work.

Construction has one path: :mod:`delayq.storage.connect` builds the clients (from a
URL or Sentinel; an application's own client is used as given), and
:func:`delayq.wiring.wire` builds the parts from them. Every method then does
the same two things: it turns the public arguments into the internal forms
(an event class or wire name into the wire name, ``group`` into a checked
name with ``None`` for the default group), and makes one call on one part:
:mod:`~delayq.operations.enqueueing` (enqueue, cancel), :mod:`~delayq.partitions.routing` (dead
letters, repartitioning), :mod:`~delayq.views.inspection` (lookups, counts),
:mod:`~delayq.views.browsing` (the dashboard's views), :mod:`~delayq.operations.groups`, and
:mod:`~delayq.runtime.runtime` (handlers, the loops, the lifecycle). Construction, the
lifecycle and health are here; the other methods are one mixin per concern in
:mod:`delayq.facade` (handlers and groups, flow control, enqueueing, schedules,
inspection, browsing), each method's docstring beside its code, where
``help(EventService)`` finds it.
"""

from __future__ import annotations

from typing import Any

from .facade.batches import BatchesMixin
from .facade.browsing import BrowsingMixin
from .facade.enqueueing import EnqueueMixin
from .facade.flow import FlowMixin
from .facade.handlers import HandlersMixin
from .facade.inspection import InspectionMixin
from .facade.results import ResultsMixin
from .facade.schedules import SchedulesMixin
from .operations.flow_control import FlowControl
from .options import Options
from .runtime.health import ServiceHealth
from .runtime.heartbeat import WorkerInfo
from .runtime.history import HistoryPoint
from .storage import connect
from .storage.connect import Client
from .storage.store import Store
from .views.inspection import DeadLetter
from .wiring import wire

__all__ = ["Client", "DeadLetter", "EventService", "HistoryPoint", "WorkerInfo"]


class EventService(
    HandlersMixin,
    FlowMixin,
    EnqueueMixin,
    SchedulesMixin,
    InspectionMixin,
    BrowsingMixin,
    ResultsMixin,
    BatchesMixin,
):
    """Delayed events on Redis: enqueue them, and handle them when they are due.

    ``redis`` must be a ``redis.asyncio.Redis`` created with ``decode_responses=False``;
    :meth:`from_url` builds suitable clients. Every option is a keyword argument
    (docs/guides/configuration.md lists them); bad values raise ``TypeError``/``ValueError``.

    Use ``async with service:`` or :meth:`start` / :meth:`aclose`. Enqueueing
    works without starting (a producer-only process); handlers run once started.
    """

    def __init__(self, redis: Client, **options: Any):
        self._setup(connect.Clients(redis, None), options)

    def _setup(self, clients: connect.Clients, options: dict[str, Any]) -> None:
        parts = wire(clients, options, self)
        self._options, self._store, self._router = parts.options, parts.store, parts.router
        self._types, self._groups = parts.types, parts.groups
        self._inspector, self._browser, self._enqueuer = (
            parts.inspector,
            parts.browser,
            parts.enqueuer,
        )
        self._finder = parts.finder
        self._runtime = parts.runtime
        self._flow = FlowControl(parts.store)
        self._scheduler = parts.runtime.scheduler
        self._schedules = parts.schedules
        self._results = parts.results
        self._dependencies = parts.dependencies
        self._batches = parts.batches

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **options: Any) -> EventService:
        """Connect to the Redis at ``url`` (``redis://``, ``rediss://``, ``unix://``).

        With ``cluster=True``, ``url`` names any node of a Redis Cluster and the
        other nodes are discovered from it. A ``redis+sentinel://`` URL connects
        through Sentinel, as :meth:`from_sentinel` does. Creates two clients owned (and closed) by the
        service: one for commands and scripts, one for BRPOP and pub/sub with a
        socket timeout above the block time. Both speak RESP2 and retry
        connection errors with backoff.
        """
        polling = connect.polling_of(options)
        return cls._owning(connect.url_clients(url, cluster=cluster, polling=polling), options)

    @classmethod
    def from_sentinel(
        cls,
        sentinels: list[tuple[str, int]],
        service_name: str,
        *,
        password: str | None = None,
        username: str | None = None,
        db: int = 0,
        ssl: bool = False,
        sentinel_kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> EventService:
        """Connect to the master that ``sentinels`` name ``service_name`` (Redis Sentinel).

        ``sentinels`` is a list of ``(host, port)``; ``password``/``username``,
        ``db`` and ``ssl`` are for the data servers, ``sentinel_kwargs`` (e.g.
        ``{"password": ...}``) for the sentinels. After a failover the service
        reconnects to the new master by itself. The same as
        ``from_url("redis+sentinel://host:port,host:port/service_name")``.
        """
        polling = connect.polling_of(options)
        kwargs = connect.master_kwargs(password=password, username=username, db=db, ssl=ssl)
        clients = connect.sentinel_clients(
            list(sentinels),
            service_name,
            polling=polling,
            sentinel_kwargs=sentinel_kwargs,
            **kwargs,
        )
        return cls._owning(clients, options)

    @classmethod
    def _owning(cls, clients: connect.Clients, options: dict[str, Any]) -> EventService:
        service = cls.__new__(cls)
        service._setup(clients, options)  # nothing to close on error
        return service

    @property
    def options(self) -> Options:
        """The validated options."""
        return self._options

    @property
    def store(self) -> Store:
        """The low-level queue operations (for tools such as ``delayq.spark``)."""
        return self._store

    @property
    def is_scheduler_leader(self) -> bool:
        """True while this instance's scheduler holds the lock."""
        return self._scheduler is not None and self._scheduler.is_leader

    @property
    def handled_types(self) -> list[str]:
        """Wire names of the event types this service has handlers for (in any group)."""
        return sorted({name for name, _ in self._runtime.consumers})

    @property
    def is_running(self) -> bool:
        """True from :meth:`start` until the service's tasks have ended (draining included)."""
        return self._runtime.is_running

    async def health(self, timeout: float = 2.0) -> ServiceHealth:
        """Whether the service runs, Redis answers (within ``timeout`` s) and every loop runs.

        For liveness and readiness probes: see :class:`ServiceHealth`.
        """
        return await self._runtime.health(timeout)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start the scheduler (if enabled) and a consumer per registered handler."""
        await self._runtime.start()

    async def aclose(self) -> None:
        """Stop fetching, give in-flight handlers ``shutdown_grace``, release everything.

        Events whose handlers did not finish come back when their leases expire.
        Calling it again does nothing.
        """
        await self._runtime.aclose()

    async def __aenter__(self) -> EventService:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
