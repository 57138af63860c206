"""``EventService``: options, lifecycle, the handler registry and the public API."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import anyio
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from .browsing import DueHistogram, InFlightEvent, due_histogram, in_flight
from .codec import Codec, check_context
from .consumer import Consumer, ConsumerSettings, Handler
from .events import Event, check_event_type, validate_name
from .health import ServiceHealth
from .heartbeat import Heartbeat, WorkerInfo, read_workers
from .history import HistoryPoint, HistoryRecorder, HistoryWriter, TeeMetrics, Window, read_history
from .inspection import DeadLetter, EventInfo, EventTypeRef, Inspector, ScheduledEvent
from .options import Options
from .retry import delay_seconds
from .scheduler import Scheduler, SchedulerSettings
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
        self._owned: list[Client] = []
        self._store = Store(redis, opts.prefix, blocking=blocking)
        self._codec = Codec(opts.serializer, opts.max_payload_bytes)
        # the history recorder sees every metric; the user's sink sees them unchanged
        self._history = HistoryRecorder()
        self._metrics = TeeMetrics(opts.metrics, self._history)
        self._types: dict[str, type[Event]] = {}
        self._inspector = Inspector(self._store, self._codec, self._types)
        self._running_loops: set[Consumer | Scheduler | Heartbeat | HistoryWriter] = set()
        self._consumers: dict[str, Consumer] = {}
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
        other nodes are discovered from it. Creates two clients owned (and
        closed) by the service: one for commands and scripts, one for BRPOP and
        pub/sub with a socket timeout above the block time. Both speak RESP2
        and retry connection errors with backoff.
        """
        polling = delay_seconds(options.get("polling_timeout") or 5.0, "polling_timeout")
        factory: Any = RedisCluster.from_url if cluster else Redis.from_url

        def client(socket_timeout: float) -> Client:
            return factory(  # type: ignore[no-any-return]
                url,
                protocol=2,
                decode_responses=False,
                socket_timeout=socket_timeout,
                socket_connect_timeout=5,
                socket_keepalive=True,
                retry=Retry(ExponentialBackoff(cap=1.0, base=0.02), retries=3),
                retry_on_error=[RedisConnectionError, RedisTimeoutError, ConnectionResetError],
            )

        commands = client(10.0)
        blocking = client(polling + 10.0)
        service = cls.__new__(cls)
        try:
            service._setup(commands, blocking, options)
        except BaseException:
            raise  # the clients never connected: nothing to close
        service._owned = [commands, blocking]
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

    def add_handler(self, event_type: type[Event], handler: Handler, concurrency: int = 1) -> None:
        """Handle events of ``event_type`` with ``async def handler(event)``.

        At most ``concurrency`` handlers of this type run at once in this
        process. The handler returns True or None when done; False or an
        exception means "retry later". Works before and after :meth:`start`.
        """
        name = self._register_type(event_type)
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
        if name in self._consumers:
            raise ValueError(f"{name!r} already has a handler; remove_handler() it first")
        if self._closed or (self._closing is not None and self._closing.is_set()):
            raise RuntimeError("the service is closed")
        consumer = Consumer(
            store=self._store,
            codec=self._codec,
            event_type=event_type,
            handler=handler,
            concurrency=concurrency,
            settings=self._consumer_settings,
            metrics=self._metrics,
        )
        self._consumers[name] = consumer
        if self._task_group is not None:
            self._task_group.start_soon(self._keep_running, consumer)

    async def remove_handler(self, event_type: type[Event]) -> bool:
        """Stop handling ``event_type`` once its in-flight handlers finish; False if none."""
        name = self._register_type(event_type)
        consumer = self._consumers.pop(name, None)
        if consumer is None:
            return False
        consumer.stop()
        if self._task_group is not None:
            await consumer.wait_finished()
        return True

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
        name, envelope = self._prepare(event, context)
        (code,) = await self._store.enqueue(
            name, [(event.id, envelope, ms)], absolute=absolute, replace=replace
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
        if not isinstance(when, datetime):
            raise TypeError(f"when must be a datetime, not {type(when).__name__}")
        if when.tzinfo is None or when.utcoffset() is None:
            raise ValueError("when must be timezone-aware, e.g. datetime.now(timezone.utc)")
        ms = math.ceil(when.timestamp() * 1000)
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
        by_type: dict[str, list[tuple[int, tuple[str, bytes, int]]]] = {}
        count = 0
        for index, item in enumerate(events):
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise TypeError(f"enqueue_many items are events or (event, delay): {item!r}")
                event, item_delay = item
                ms = math.ceil(delay_seconds(item_delay) * 1000)
            else:
                event, ms = item, default_ms
            name, envelope = self._prepare(event, context)
            by_type.setdefault(name, []).append((index, (event.id, envelope, ms)))
            count = index + 1
        results = [False] * count
        for name, entries in by_type.items():
            codes = await self._store.enqueue(
                name, [e for _, e in entries], absolute=False, replace=replace
            )
            self._count_codes(name, codes)
            for (index, _), code in zip(entries, codes, strict=True):
                results[index] = code != 0
        return results

    async def cancel(self, event_type: EventTypeRef, id: str) -> bool:
        """Remove a pending (scheduled, ready or in-flight) event; True when one was removed.

        ``event_type`` is the class or its wire name. Dead letters are not
        touched: use :meth:`purge_dead_letters`.
        """
        name = self._name(event_type)
        removed = await self._store.cancel(name, id)
        if removed:
            self._metrics.increment("cancelled", event_type=name)
        return removed

    # -- dead letters and stats ----------------------------------------------------

    async def dead_letters(
        self, event_type: EventTypeRef, limit: int = 100, offset: int = 0
    ) -> list[DeadLetter]:
        """Up to ``limit`` dead letters of ``event_type`` (class or wire name), oldest first."""
        if not isinstance(event_type, str):
            self._register_type(event_type)
        return await self._inspector.dead_letters(event_type, limit, offset)

    async def inspect(self, event_type: EventTypeRef, id: str) -> EventInfo:
        """Where one event is (scheduled, ready, in flight, dead, absent) and all Redis holds
        about it, read in one atomic step. ``event_type`` is the class or its wire name."""
        return await self._inspector.inspect(event_type, id)

    async def scheduled(
        self, event_type: EventTypeRef, limit: int = 100, offset: int = 0
    ) -> list[ScheduledEvent]:
        """Up to ``limit`` (≤ 1000) scheduled events from position ``offset``, earliest due
        first. Retries waiting for their backoff are scheduled events too."""
        return await self._inspector.scheduled(event_type, limit, offset)

    @staticmethod
    def _pages(ids: Iterable[str]) -> list[list[str]]:
        given = list(ids)
        return [given[i : i + _BULK_PAGE] for i in range(0, len(given), _BULK_PAGE)]

    async def requeue_dead_letters(
        self,
        event_type: EventTypeRef,
        ids: Iterable[str] | None = None,
        delay: float | timedelta = 0,
    ) -> int:
        """Schedule dead letters (all, or those in ``ids``) again after ``delay``; return how many.

        Their attempt counts start over. ``event_type`` is the class or its wire name.
        """
        name = self._name(event_type)
        ms = math.ceil(delay_seconds(delay) * 1000)
        if ids is not None:
            return sum([await self._store.requeue_dead(name, p, ms) for p in self._pages(ids)])
        # Only what is dead now: a requeued event that fails again must not
        # come round in this same call.
        total, seen = 0, 0
        limit = (await self.stats_for(event_type)).dead
        while seen < limit:
            page = await self._store.dead_ids(name, min(_BULK_PAGE, limit - seen))
            if not page:
                break
            seen += len(page)
            total += await self._store.requeue_dead(name, page, ms)
        return total

    async def purge_dead_letters(
        self, event_type: EventTypeRef, ids: Iterable[str] | None = None
    ) -> int:
        """Delete dead letters (all, or those in ``ids``) for good; return how many."""
        name = self._name(event_type)
        if ids is not None:
            return sum([await self._store.purge_dead(name, p) for p in self._pages(ids)])
        total = 0
        while page := await self._store.dead_ids(name, _BULK_PAGE):
            removed = await self._store.purge_dead(name, page)
            total += removed
            if not removed:
                break
        return total

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

    # -- browsing --------------------------------------------------------------------

    async def in_flight(
        self, event_type: EventTypeRef, limit: int = 100, offset: int = 0
    ) -> list[InFlightEvent]:
        """Up to ``limit`` in-flight events (class or wire name), earliest lease deadline first."""
        return await in_flight(self._store, self._name(event_type), limit, offset)

    async def due_histogram(self, event_type: EventTypeRef) -> DueHistogram:
        """How many scheduled events fall due: overdue, next minute, hour, day, later."""
        return await due_histogram(self._store, self._name(event_type))

    async def run_now(self, event_type: EventTypeRef, id: str) -> bool:
        """Hand a scheduled event to the consumers now; False when it is not scheduled.

        Its attempt count and last error are kept (a retry waiting for its backoff
        runs now as that retry).
        """
        return await self._store.run_now(self._name(event_type), id)

    # -- workers and history ----------------------------------------------------------

    def _snapshot(self) -> dict[str, tuple[int, int]]:
        return {n: (c.concurrency, c.running_handlers) for n, c in self._consumers.items()}

    @property
    def worker_id(self) -> str | None:
        """This process's id in :meth:`workers` (None when ``heartbeat_interval=0``)."""
        return None if self._heartbeat is None else self._heartbeat.worker_id

    async def workers(self, limit: int = 1000) -> list[WorkerInfo]:
        """The live worker processes under the prefix, from their heartbeats (oldest first)."""
        return await read_workers(self._store, limit)

    async def history(
        self, event_type: EventTypeRef, window: Window = "hour"
    ) -> list[HistoryPoint]:
        """Handled, failed and lateness of a type (class or wire name) per minute
        (``window="hour"``: 60 points) or per 20 minutes (``"day"``: 72 points),
        summed over every worker, oldest first."""
        return await read_history(self._store, self._name(event_type), window)

    @property
    def handled_types(self) -> list[str]:
        """Wire names of the event types this service has handlers for."""
        return sorted(self._consumers)

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
        for name, consumer in self._consumers.items():
            loops[f"consumer:{name}"] = consumer in self._running_loops
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
        for client in self._owned:
            await client.aclose()

    async def __aenter__(self) -> EventService:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
