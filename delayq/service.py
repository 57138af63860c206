"""``EventService``: options, lifecycle, the handler registry and the public API."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import anyio
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from . import connect
from .browsing import DueHistogram, InFlightEvent, due_histogram, in_flight, run_now
from .codec import Codec, check_context
from .consumer import Consumer, ConsumerSettings, Handler
from .events import Event, check_event_type, find_event_type, validate_name
from .groups import GroupMetrics, Groups, check_group, group_settings
from .health import ServiceHealth
from .heartbeat import Heartbeat, WorkerInfo, read_workers
from .history import HistoryPoint, HistoryRecorder, HistoryWriter, TeeMetrics, Window, read_history
from .inspection import DeadLetter, EventInfo, EventTypeRef, Inspector, ScheduledEvent
from .observer import Observer
from .options import Options
from .repartition import RepartitionResult, repartition
from .retry import Backoff, delay_seconds, due_unix_ms
from .routing import Router
from .scheduler import Scheduler, SchedulerSettings
from .sentinel import SentinelWatch
from .store import QueueCounts, Store

__all__ = ["Client", "DeadLetter", "EventService", "HistoryPoint", "WorkerInfo"]

Client = Redis | RedisCluster
"""The redis.asyncio clients delayq works with: a single Redis or a Redis Cluster."""

log = logging.getLogger("delayq.service")

_BULK_PAGE = 500


def _connection_kwargs(client: Client) -> dict[str, Any]:
    if isinstance(client, RedisCluster):
        return client.connection_kwargs
    return client.connection_pool.connection_kwargs


class EventService:
    """Delayed events on Redis: enqueue them, and handle them when they are due.

    ``redis`` must be a ``redis.asyncio.Redis`` created with ``decode_responses=False``;
    :meth:`from_url` builds suitable clients. Every option is a keyword argument
    (see the README for defaults); bad values raise ``TypeError``/``ValueError``.

    Use ``async with service:`` or :meth:`start` / :meth:`aclose`. Enqueueing
    works without starting (a producer-only process); handlers run once started.
    """

    def __init__(self, redis: Client, **options: Any):
        self._setup(redis, None, options)

    def _setup(self, redis: Client, blocking: Client | None, options: dict[str, Any]) -> None:
        self._options = Options.build(**options)
        opts = self._options
        if not isinstance(redis, (Redis, RedisCluster)):
            raise TypeError(
                f"redis must be a redis.asyncio Redis or RedisCluster, not {type(redis).__name__}"
            )
        if _connection_kwargs(redis).get("decode_responses"):
            raise ValueError("delayq needs a Redis client with decode_responses=False")
        self._redis = redis
        self._owned: list[Any] = []
        self._watch: SentinelWatch | None = None
        self._store = Store(
            redis,
            opts.prefix,
            blocking=blocking,
            min_replicas=opts.min_replicas,
            replica_timeout_ms=opts.replica_timeout_ms,
        )
        self._router = Router(self._store)
        self._layouts_read: set[str] = set()  # type names whose layouts were read from Redis
        self._codec = Codec(opts.serializer, opts.max_payload_bytes)
        # the history recorder sees every metric; the user's sink sees them unchanged
        self._history = HistoryRecorder()
        self._metrics = TeeMetrics(opts.metrics, self._history)
        self._observer = Observer(self._metrics, opts.tracing)
        self._types: dict[str, type[Event]] = {}
        # (type name, group; None for the default group) -> its consumer here
        self._consumers: dict[tuple[str, str | None], Consumer] = {}
        self._groups = Groups(self._store, 1 + opts.retry_attempts)
        self._inspector = Inspector(self._store, self._codec, self._types)
        self._running_loops: set[Consumer | Scheduler | Heartbeat | HistoryWriter] = set()
        self._consumer_settings = ConsumerSettings(
            visibility_ms=opts.visibility_ms,
            polling_timeout=self._block_time(blocking or redis),
            retry_attempts=opts.retry_attempts,
            retry_backoff=opts.retry_backoff,
            handler_timeout=opts.handler_timeout,
            shutdown_grace=opts.shutdown_grace,
        )
        self._scheduler: Scheduler | None = None
        if opts.enable_scheduling:
            self._scheduler = Scheduler(
                self._store,
                SchedulerSettings(
                    interval=opts.scheduling_interval,
                    batch_size=opts.scheduling_batch_size,
                    visibility_ms=opts.visibility_ms,
                    max_deliveries=1 + opts.retry_attempts,
                    lock_ms=opts.lock_ms,
                    takeover_delay=opts.takeover_delay,
                    listen_timeout=self._consumer_settings.polling_timeout,
                ),
                self._metrics,
            )
        self._heartbeat: Heartbeat | None = None
        if opts.heartbeat_interval:
            self._heartbeat = Heartbeat(self._store, opts.heartbeat_interval, self._snapshot)
        self._history_writer: HistoryWriter | None = None
        if opts.history_interval:
            self._history_writer = HistoryWriter(
                self._store, self._history, opts.history_interval
            )
        self._supervisor: asyncio.Task[None] | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._closing: asyncio.Event | None = None
        self._closed = False

    def _block_time(self, redis: Client) -> float:
        # BRPOP must return before the client's socket timeout fires, or every
        # idle wait would look like a broken connection.
        block = self._options.polling_timeout
        socket_timeout = _connection_kwargs(redis).get("socket_timeout")
        if socket_timeout:
            block = min(block, max(0.05, socket_timeout - 1, socket_timeout / 2))
        return block

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **options: Any) -> EventService:
        """Connect to the Redis at ``url`` (``redis://``, ``rediss://``, ``unix://``).

        With ``cluster=True``, ``url`` names any node of a Redis Cluster and the
        other nodes are discovered from it. A ``redis+sentinel://`` URL goes to
        :meth:`from_sentinel`. Creates two clients owned (and closed) by the
        service: one for commands and scripts, one for BRPOP and pub/sub with a
        socket timeout above the block time. Both speak RESP2 and retry
        connection errors with backoff.
        """
        polling = delay_seconds(options.get("polling_timeout") or 5.0, "polling_timeout")
        if url.split("://", 1)[0] in connect.SENTINEL_SCHEMES:
            if cluster:
                raise ValueError("a redis+sentinel:// URL cannot be used with cluster=True")
            sentinels, name, kwargs = connect.parse_sentinel_url(url)
            return cls.from_sentinel(sentinels, name, **kwargs, **options)
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
        polling = delay_seconds(options.get("polling_timeout") or 5.0, "polling_timeout")
        kwargs: dict[str, Any] = {"db": db}
        if password is not None:
            kwargs["password"] = password
        if username is not None:
            kwargs["username"] = username
        if ssl:
            kwargs["ssl"] = True
        clients = connect.sentinel_clients(
            list(sentinels), service_name, polling=polling, sentinel_kwargs=sentinel_kwargs,
            **kwargs,
        )  # fmt: skip
        return cls._owning(clients, options)

    @classmethod
    def _owning(cls, clients: connect.Clients, options: dict[str, Any]) -> EventService:
        service = cls.__new__(cls)
        service._setup(clients.commands, clients.blocking, options)  # nothing to close on error
        service._owned = clients.owned
        service._watch = clients.watch
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

    # -- types and handlers ------------------------------------------------------

    def _register_type(self, event_type: Any) -> str:
        name = check_event_type(event_type).event_name
        known = self._types.get(name)
        if known is None:
            self._types[name] = event_type
            self._store.declare(name, event_type.event_partitions)
        elif known is not event_type:
            raise ValueError(
                f"event type name {name!r} is used by both {known.__module__}."
                f"{known.__qualname__} and {event_type.__module__}.{event_type.__qualname__}"
            )
        return name

    def _name(self, event_type: EventTypeRef) -> str:
        """The wire name of a class (registering it) or of a name given as a str."""
        if isinstance(event_type, str):
            return validate_name(event_type)
        return self._register_type(event_type)

    def add_handler(
        self,
        event_type: type[Event],
        handler: Handler,
        concurrency: int = 1,
        *,
        group: str | None = None,
        retry_attempts: int | None = None,
        retry_backoff: Backoff | None = None,
    ) -> None:
        """Handle events of ``event_type`` with ``async def handler(event)``.

        At most ``concurrency`` handlers of this type (and group) run at once
        in this process. The handler returns True or None when done; False or
        an exception means "retry later". Works before and after :meth:`start`.

        ``group`` names a delivery group: every group registered for the type
        gets each event once, with its own retries and dead letters (see the
        README, "Delivery groups"). The group is registered in Redis when its
        consumer starts. Without ``group`` the handler joins the default
        group. ``retry_attempts`` and ``retry_backoff`` override the service's
        options for this group's deliveries.
        """
        name = self._register_type(event_type)
        group = check_group(group)
        settings = group_settings(self._consumer_settings, retry_attempts, retry_backoff)
        if not callable(handler) or not (
            inspect.iscoroutinefunction(handler)
            or inspect.iscoroutinefunction(getattr(handler, "__call__", None))  # noqa: B004
        ):
            raise TypeError(f"handler for {name!r} must be an async function, got {handler!r}")
        if (
            not isinstance(concurrency, int)
            or isinstance(concurrency, bool)
            or not (1 <= concurrency <= 10_000)
        ):
            raise ValueError(f"concurrency must be an int from 1 to 10000, not {concurrency!r}")
        if (name, group) in self._consumers:
            raise ValueError(
                f"{name!r} already has a handler"
                + ("" if group is None else f" in group {group!r}")
                + "; remove_handler() it first"
            )
        if self._closed or (self._closing is not None and self._closing.is_set()):
            raise RuntimeError("the service is closed")
        consumer = Consumer(
            store=self._store,
            codec=self._codec,
            event_type=event_type,
            handler=handler,
            concurrency=concurrency,
            settings=settings,
            metrics=self._metrics if group is None else GroupMetrics(self._metrics, group),
            group=group,
            observer=self._observer,
        )
        self._consumers[name, group] = consumer
        if self._task_group is not None:
            self._task_group.start_soon(self._keep_running, consumer)

    async def remove_handler(self, event_type: type[Event], *, group: str | None = None) -> bool:
        """Stop handling ``event_type`` (in ``group``) once its in-flight handlers finish.

        False if there was no such handler. The group stays registered: its
        events wait for it (see :meth:`remove_group`).
        """
        name = self._register_type(event_type)
        consumer = self._consumers.pop((name, check_group(group)), None)
        if consumer is None:
            return False
        consumer.stop()
        if self._task_group is not None:
            await consumer.wait_finished()
        return True

    # -- delivery groups -------------------------------------------------------------

    async def register_group(
        self, event_type: type[Event], group: str, *, retry_attempts: int | None = None
    ) -> bool:
        """Register a delivery group of ``event_type`` in Redis; True when it is new.

        From the scheduler's next move on, every event of the type that becomes
        due is delivered to this group too, even while no process handles it
        (its events wait in its ready list). ``add_handler(..., group=...)``
        registers its group by itself; this is for registering one ahead of
        its handlers. ``retry_attempts`` (default: the service's) sets how many
        times a lease of this group may expire before the event becomes the
        group's dead letter. Registering the first named group registers the
        default group with it (remove it if no handler uses it).
        """
        name = self._register_type(event_type)
        checked = check_group(group)
        return await self._groups.register(name, checked or "default", retry_attempts)

    async def remove_group(self, event_type: type[Event], group: str) -> bool:
        """Drop a delivery group: its pending deliveries, retries and dead letters.

        Events no other group holds are deleted. This process's handler for
        the group is stopped; stop the group's handlers in other processes
        first, or they register it again when they start. Returns False when
        the group was not registered; raises ``ValueError`` for the type's
        last group.
        """
        name = self._register_type(event_type)
        checked = check_group(group)
        consumer = self._consumers.pop((name, checked), None)
        if consumer is not None:
            consumer.stop()
            if self._task_group is not None:
                await consumer.wait_finished()
        return await self._groups.remove(name, checked or "default")

    async def groups(self, event_type: EventTypeRef) -> list[str]:
        """The delivery groups registered for ``event_type`` (class or wire name;
        ``["default"]`` if none is named)."""
        return await self._groups.names(self._name(event_type))

    async def group_stats(self, event_type: EventTypeRef) -> dict[str, QueueCounts]:
        """Counts per delivery group of ``event_type`` (class or wire name).

        A group's ``scheduled`` counts the type's events not yet due (each will
        reach every group) plus the group's own retries waiting.
        """
        return await self._groups.counts(self._name(event_type))

    # -- enqueueing ----------------------------------------------------------------

    def _prepare(self, event: Any, context: Mapping[str, str] | None) -> tuple[str, bytes]:
        if not isinstance(event, Event):
            raise TypeError(f"expected an instance of a delayq.Event subclass, got {event!r}")
        if not isinstance(event.id, str):
            raise TypeError(f"event id must be a str, not {type(event.id).__name__}")
        if not event.id:
            raise ValueError(f"event id must not be empty: {event!r}")
        name = self._register_type(type(event))
        return name, self._codec.encode(event, context)

    async def _enqueue_one(
        self, event: Event, ms: int, *, absolute: bool, context: Any, replace: bool
    ) -> bool:
        with self._observer.sending(event, context) as stored_context:
            name, envelope = self._prepare(event, stored_context)
            shard = self._router.shard(name, event.id, type(event).event_partitions)
            (code,) = await self._store.enqueue(
                shard, [(event.id, envelope, ms)], absolute=absolute, replace=replace
            )
        self._count_codes(name, [code])
        return code != 0

    def _count_codes(self, name: str, codes: list[int]) -> None:
        for code, metric in ((1, "enqueued"), (0, "kept"), (2, "replaced")):
            n = codes.count(code)
            if n:
                self._metrics.increment(metric, n, event_type=name)

    async def enqueue_with_delay(
        self,
        event: Event,
        delay: float | timedelta = 0,
        *,
        context: Mapping[str, str] | None = None,
        replace: bool = False,
    ) -> bool:
        """Handle ``event`` once ``delay`` (a timedelta or seconds, >= 0) has passed.

        The due time is counted on Redis's clock. Returns True when scheduled.
        When an event of the same type and id exists, it is kept and False is
        returned, unless ``replace=True`` swaps its payload, context and due
        time in one step (and returns True).
        """
        ms = math.ceil(delay_seconds(delay) * 1000)
        return await self._enqueue_one(event, ms, absolute=False, context=context, replace=replace)

    async def enqueue_at(
        self,
        event: Event,
        when: datetime,
        *,
        context: Mapping[str, str] | None = None,
        replace: bool = False,
    ) -> bool:
        """Handle ``event`` at ``when`` (a timezone-aware datetime); past times mean now."""
        ms = due_unix_ms(when)
        return await self._enqueue_one(event, ms, absolute=True, context=context, replace=replace)

    async def enqueue_many(
        self,
        events: Iterable[Event | tuple[Event, float | timedelta]],
        delay: float | timedelta = 0,
        *,
        context: Mapping[str, str] | None = None,
        replace: bool = False,
    ) -> list[bool]:
        """Enqueue many events in pipelined batches; one result per event, in order.

        Items are events (due after ``delay``) or ``(event, delay)`` pairs. All
        items are validated before anything is written.
        """
        default_ms = math.ceil(delay_seconds(delay) * 1000)
        check_context(context)
        items = list(events)
        names = [] if self._observer.tracing is None else self._type_names(items)
        with self._observer.sending_many(names, len(items), context) as stored_context:
            return await self._enqueue_items(items, default_ms, stored_context, replace)

    def _type_names(self, items: list[Any]) -> list[str]:
        return [getattr(type(i[0] if isinstance(i, tuple) else i), "event_name", "") for i in items]

    async def _enqueue_items(
        self,
        items: list[Event | tuple[Event, float | timedelta]],
        default_ms: int,
        context: Mapping[str, str] | None,
        replace: bool,
    ) -> list[bool]:
        by_type: dict[str, list[tuple[int, tuple[str, bytes, int]]]] = {}
        partitions: dict[str, int] = {}
        count = 0
        for index, item in enumerate(items):
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise TypeError(f"enqueue_many items are events or (event, delay): {item!r}")
                event, item_delay = item
                ms = math.ceil(delay_seconds(item_delay) * 1000)
            else:
                event, ms = item, default_ms
            name, envelope = self._prepare(event, context)
            partitions[name] = type(event).event_partitions
            by_type.setdefault(name, []).append((index, (event.id, envelope, ms)))
            count = index + 1
        results = [False] * count
        for name, entries in by_type.items():
            codes = await self._router.enqueue(
                name, partitions[name], [e for _, e in entries], absolute=False, replace=replace
            )
            self._count_codes(name, codes)
            for (index, _), code in zip(entries, codes, strict=True):
                results[index] = code != 0
        return results

    async def enqueue_envelopes(
        self,
        event_type: str,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool = False,
        replace: bool = False,
    ) -> list[int]:
        """Enqueue events already encoded into envelopes; one code per item, in order.

        For tools that encode elsewhere and send later, such as the transactional
        outbox of :mod:`delayq.postgres`: ``event_type`` is a wire name, and each
        item is ``(id, envelope, ms)`` with an envelope made by
        :class:`delayq.codec.Codec` and ``ms`` a delay in ms or, with
        ``absolute=True``, a unix time in ms. The same script, dedup and
        ``replace`` rule as every enqueue apply. Codes: 1 added, 0 kept (the id
        existed), 2 replaced. Envelopes are not decoded here: one that does not
        decode becomes a dead letter when it is delivered.
        """
        validate_name(event_type)
        checked = []
        for item in items:
            if not (
                isinstance(item, tuple)
                and len(item) == 3
                and isinstance(item[0], str)
                and item[0]
                and isinstance(item[1], bytes)
                and isinstance(item[2], int)
                and not isinstance(item[2], bool)
            ):
                raise TypeError(f"items are (id: str, envelope: bytes, ms: int), not {item!r}")
            if not absolute and item[2] < 0:
                raise ValueError(f"a delay in ms must be >= 0: {item!r}")
            checked.append(item)
        if not checked:
            return []
        codes = await self._router.enqueue(
            event_type,
            await self._partitions_of(event_type),
            checked,
            absolute=absolute,
            replace=replace,
        )
        self._count_codes(event_type, codes)
        return codes

    async def _partitions_of(self, name: str) -> int:
        """The partition count of a type known by name: its class's, when the class is
        defined in this process, else the largest layout recorded in Redis."""
        cls = self._types.get(name) or find_event_type(name)
        if cls is not None:
            return cls.event_partitions
        if name not in self._layouts_read:
            self._layouts_read.add(name)
            await self._store.known_types()  # refreshes the layouts
        return self._store.layouts(name)[0]

    async def cancel(self, event_type: EventTypeRef, id: str) -> bool:
        """Remove a pending (scheduled, ready or in-flight) event; True when one was removed.

        ``event_type`` is the class or its wire name. Dead letters are not
        touched: use :meth:`purge_dead_letters`.
        """
        name = self._name(event_type)
        removed = await self._router.cancel(name, id)
        if removed:
            self._metrics.increment("cancelled", event_type=name)
        return removed

    # -- dead letters and stats ----------------------------------------------------

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
        if not isinstance(event_type, str):
            self._register_type(event_type)
        return await self._inspector.dead_letters(
            event_type, limit, offset, group=check_group(group)
        )

    async def inspect(self, event_type: EventTypeRef, id: str) -> EventInfo:
        """Where one event is (scheduled, ready, in flight, dead, absent) and all Redis holds
        about it, read in one atomic step. ``event_type`` is the class or its wire name."""
        return await self._inspector.inspect(event_type, id)

    async def scheduled(
        self, event_type: EventTypeRef, limit: int = 100, offset: int = 0, *,
        group: str | None = None,
    ) -> list[ScheduledEvent]:
        """Up to ``limit`` (≤ 1000) scheduled events from position ``offset``, earliest due
        first. Retries waiting for their backoff are scheduled events too. With ``group``
        (``"default"`` included), the type's schedule and that group's retries."""
        return await self._inspector.scheduled(event_type, limit, offset, group=group)

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
        name = self._name(event_type)
        group = check_group(group)
        ms = math.ceil(delay_seconds(delay) * 1000)
        if ids is not None:
            return await self._router.by_id(
                name,
                list(ids),
                lambda shard, p: self._store.requeue_dead(shard, p, ms, group=group),
            )

        async def requeue_all(shard: str) -> int:
            # Only what is dead now: a requeued event that fails again must not
            # come round in this same call.
            total, seen = 0, 0
            limit = await self._store.dead_count(shard, group=group)
            while seen < limit:
                page = await self._store.dead_ids(shard, min(_BULK_PAGE, limit - seen), group=group)
                if not page:
                    break
                seen += len(page)
                total += await self._store.requeue_dead(shard, page, ms, group=group)
            return total

        return sum(await self._router.each_shard(name, requeue_all))

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
        name = self._name(event_type)
        group = check_group(group)
        if ids is not None:
            return await self._router.by_id(
                name, list(ids), lambda shard, p: self._store.purge_dead(shard, p, group=group)
            )

        async def purge_all(shard: str) -> int:
            total = 0
            while page := await self._store.dead_ids(shard, _BULK_PAGE, group=group):
                removed = await self._store.purge_dead(shard, page, group=group)
                total += removed
                if not removed:
                    break
            return total

        return sum(await self._router.each_shard(name, purge_all))

    async def stats(self) -> dict[str, QueueCounts]:
        """Counts per event type name, for every type that has been used under the prefix.

        Each :class:`QueueCounts` also has the next due time and the backlog's age; the
        cost is one read-only script call per type, all in one pipeline.
        """
        names = await self._store.known_types()
        return await self._store.counts(names)

    async def stats_for(self, event_type: EventTypeRef) -> QueueCounts:
        """Counts of one event type (class or wire name)."""
        name = self._name(event_type)
        return (await self._store.counts([name]))[name]

    async def repartition(
        self, event_type: type[Event], *, wait: float = 30.0
    ) -> RepartitionResult:
        """Move ``event_type``'s events from every other partition count into its declared one.

        Run it once every process runs the new ``partitions=N`` (see the
        README, "Changing the partition count"). Scheduled events move at
        once; ready and running ones of the old layout are handled where they
        are, and passes repeat for up to ``wait`` seconds until the old layout
        is empty and retired. Safe to run again (it finishes the job).
        """
        name = self._register_type(event_type)
        return await repartition(self._store, name, event_type.event_partitions, wait=wait)

    # -- browsing --------------------------------------------------------------------

    async def in_flight(
        self, event_type: EventTypeRef, limit: int = 100, offset: int = 0, *,
        group: str | None = None,
    ) -> list[InFlightEvent]:
        """Up to ``limit`` in-flight events (class or wire name; of delivery ``group``, the
        default group's without), earliest lease deadline first."""
        return await in_flight(self._store, self._name(event_type), limit, offset, group=group)

    async def due_histogram(
        self, event_type: EventTypeRef, *, group: str | None = None
    ) -> DueHistogram:
        """How many scheduled events fall due: overdue, next minute, hour, day, later.
        With ``group``, that delivery group's retries count too."""
        return await due_histogram(self._store, self._name(event_type), group=group)

    async def run_now(self, event_type: EventTypeRef, id: str, *, group: str | None = None) -> bool:
        """Hand a scheduled event to the consumers now; False when it is not scheduled.

        Its attempt count and last error are kept (a retry waiting for its backoff
        runs now as that retry). For a type with delivery groups: without ``group``
        every group runs it now; with ``group`` that group alone, the others getting
        it at its due time (see README, "Delivery groups").
        """
        name = self._name(event_type)
        return await run_now(self._store, self._router.shards_of_id(name, id), id, group)

    # -- workers and history ----------------------------------------------------------

    def _snapshot(self) -> dict[str, tuple[int, int]]:
        # a named group's consumer shows as "type:group" (type names hold no ':')
        return {
            name if group is None else f"{name}:{group}": (c.concurrency, c.running_handlers)
            for (name, group), c in self._consumers.items()
        }

    @property
    def worker_id(self) -> str | None:
        """This process's id in :meth:`workers` (None when ``heartbeat_interval=0``)."""
        return None if self._heartbeat is None else self._heartbeat.worker_id

    async def workers(self, limit: int = 1000) -> list[WorkerInfo]:
        """The live worker processes under the prefix, from their heartbeats (oldest first)."""
        return await read_workers(self._store, limit)

    async def history(
        self, event_type: EventTypeRef, window: Window = "hour", *, group: str | None = None
    ) -> list[HistoryPoint]:
        """Handled, failed and lateness of a type (class or wire name; of delivery ``group``,
        the default group's without) per minute (``window="hour"``: 60 points) or per 20
        minutes (``"day"``: 72 points), summed over every worker, oldest first."""
        return await read_history(self._store, self._name(event_type), window, group=group)

    @property
    def handled_types(self) -> list[str]:
        """Wire names of the event types this service has handlers for (in any group)."""
        return sorted({name for name, _ in self._consumers})

    @property
    def is_running(self) -> bool:
        """True from :meth:`start` until the service's tasks have ended (draining included)."""
        return self._supervisor is not None and not self._supervisor.done()

    async def health(self, timeout: float = 2.0) -> ServiceHealth:
        """Whether the service runs, Redis answers (within ``timeout`` s) and every loop runs.

        For liveness and readiness probes: see :class:`ServiceHealth`.
        """
        redis_error: str | None = None
        try:
            with anyio.fail_after(timeout):
                await self._store.server_time_ms()
        except TimeoutError:
            redis_error = f"no answer within {timeout}s"
        except Exception as exc:
            redis_error = f"{type(exc).__name__}: {exc}"
        loops: dict[str, bool] = {}
        if self._scheduler is not None:
            loops["scheduler"] = self._scheduler in self._running_loops
        for consumer in self._consumers.values():
            loops[f"consumer:{consumer.label}"] = consumer in self._running_loops
        started = self.is_running
        return ServiceHealth(
            started=started,
            accepting=started and self._closing is not None and not self._closing.is_set(),
            redis_ok=redis_error is None,
            redis_error=redis_error,
            loops=loops,
        )

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start the scheduler (if enabled) and a consumer per registered handler."""
        if self._closed:
            raise RuntimeError("a closed EventService cannot be started again")
        if self._supervisor is not None:
            return
        policy = await self._store.eviction_policy()
        if policy is not None and policy != "noeviction":
            log.warning(
                "Redis maxmemory-policy is %r: under memory pressure Redis may evict queue "
                "keys and lose events; set it to 'noeviction'",
                policy,
            )
        if self._consumers:
            # the partition counts in use (a count being changed has two), so that
            # the consumers serve every layout their type has events in
            try:
                await self._store.known_types()
            except Exception as exc:  # the scheduler's sweeps read them again
                log.warning("reading the event types failed: %s", exc)
        self._closing = asyncio.Event()
        started = asyncio.get_running_loop().create_future()
        self._supervisor = asyncio.create_task(self._supervise(started), name="delayq-service")
        await asyncio.wait([started, self._supervisor], return_when=asyncio.FIRST_COMPLETED)
        if self._supervisor.done():
            self._supervisor.result()  # raise what stopped it

    async def _supervise(self, started: asyncio.Future[None]) -> None:
        assert self._closing is not None
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                if self._scheduler is not None:
                    tg.start_soon(self._keep_running, self._scheduler)
                for consumer in self._consumers.values():
                    tg.start_soon(self._keep_running, consumer)
                for reporter in (self._heartbeat, self._history_writer):
                    if reporter is not None:
                        tg.start_soon(self._keep_running, reporter)
                async with contextlib.AsyncExitStack() as beside:
                    if self._options.outbox is not None:
                        # relays stop (finishing their batch) before the loops do
                        await beside.enter_async_context(self._options.outbox(self))
                    started.set_result(None)
                    await self._closing.wait()
                consumers = list(self._consumers.values())
                for consumer in consumers:
                    consumer.stop()
                if self._scheduler is not None:
                    self._scheduler.stop()
                # the last history flush and the heartbeat's removal come after the
                # consumers' last acks
                with anyio.move_on_after(self._options.shutdown_grace * 2 + 5):
                    for consumer in consumers:
                        await consumer.wait_finished()
                for reporter in (self._heartbeat, self._history_writer):
                    if reporter is not None:
                        reporter.stop()
        finally:
            self._task_group = None
            if not started.done():
                started.set_result(None)

    async def _keep_running(
        self, loop: Consumer | Scheduler | Heartbeat | HistoryWriter
    ) -> None:
        """Run a loop; should a bug make it raise, log and start it again."""
        delay = 0.5
        while True:
            self._running_loops.add(loop)  # what health() reports
            try:
                await loop.run()
                return
            except Exception:
                if loop.stopping:
                    return
                self._running_loops.discard(loop)
                log.exception("%s crashed; restarting it in %.1fs", type(loop).__name__, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, 30.0)
            finally:
                self._running_loops.discard(loop)

    async def aclose(self) -> None:
        """Stop fetching, give in-flight handlers ``shutdown_grace``, release everything.

        Events whose handlers did not finish come back when their leases expire.
        Calling it again does nothing.
        """
        if self._closed:
            return
        self._closed = True
        if self._closing is not None:
            self._closing.set()
        task = self._supervisor
        if task is not None:
            deadline = time.monotonic() + self._options.shutdown_grace * 2 + 10
            while not task.done():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    # redis-py can swallow a cancel inside wait_for: cancel until it ends
                    task.cancel()
                    remaining = 1.0
                await asyncio.wait([task], timeout=remaining)
            if not task.cancelled() and task.exception() is not None:
                log.error("the service's tasks ended with an error", exc_info=task.exception())
        await self._store.aclose()
        if self._watch is not None:
            await self._watch.aclose()
        for client in self._owned:
            await client.aclose()

    async def __aenter__(self) -> EventService:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
