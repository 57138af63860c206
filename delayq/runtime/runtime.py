"""Running a service: its loops, their supervision, and closing it.

The loops are the scheduler (if enabled), one consumer per handler (and
group), the heartbeat and the history writer. :class:`Runtime` owns them:
it starts them in one task group under one supervisor task, restarts a loop
that crashes, reports which run (``health()``), and on close stops them in
order (consumers drain, then the reporters write their last records), then
closes the store and the clients the service owns. No task outlives it.

(Over 400 lines: one job, the loops' lifetime, which now includes the cancel listener
and the clock moves of the testing kit.)
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio

from .._pacing import MAX_RESTART, Retrying
from ..codec import Codec
from ..events import Event
from ..metrics import ServiceMetrics
from ..observer import Observer
from ..operations.batches import Batches
from ..operations.groups import PendingGroups
from ..options import Options
from ..retry import Backoff
from ..schedules.firing import ScheduleFirer
from ..storage.store import Store
from .cancels import CancelSignals
from .consumer import Consumer, ConsumerSettings, Handler
from .health import ServiceHealth
from .heartbeat import RUNNING_SHOWN, Heartbeat
from .history import HistoryRecorder, HistoryWriter
from .middleware import Pipeline
from .scheduler import Scheduler, SchedulerSettings

if TYPE_CHECKING:
    from ..storage.sentinel import SentinelWatch

__all__ = ["Runtime"]

# the logger the service's lifecycle has always logged to (users' logging config names it)
log = logging.getLogger("delayq.service")

_Loop = Consumer | Scheduler | Heartbeat | HistoryWriter | ScheduleFirer | CancelSignals


class Runtime:
    """The loops of one :class:`~delayq.EventService` and their lifecycle."""

    def __init__(
        self,
        store: Store,
        options: Options,
        *,
        pending: PendingGroups,
        codec: Codec,
        observer: Observer,
        metrics: ServiceMetrics,
        history: HistoryRecorder | None,
        polling_timeout: float,
        owned: list[Any],
        watch: SentinelWatch | None,
        outbox: Callable[[], AbstractAsyncContextManager[Any]] | None,
    ):
        opts = self._options = options
        self._store = store
        self._codec = codec
        self._observer = observer
        self._metrics = metrics
        self._history = history  # the recorder the consumers count lateness into
        self.pipeline = Pipeline()  # the middleware around every handler run (service.use)
        self._owned = owned  # clients the service made (from_url), closed last
        self._watch = watch  # the Sentinel failover watch of a from_sentinel service
        self._outbox = outbox  # the outbox relay run beside the loops, if any
        # (type name, group; None for the default group) -> its consumer here
        self.consumers: dict[tuple[str, str | None], Consumer] = {}
        self.pending = pending
        """Named groups added while running, registered before the next enqueue or move."""
        self._running_loops: set[_Loop] = set()
        self._consumer_settings = ConsumerSettings(
            visibility_ms=opts.visibility_ms,
            polling_timeout=polling_timeout,
            retry_attempts=opts.retry_attempts,
            retry_backoff=opts.retry_backoff,
            handler_timeout=opts.handler_timeout,
            shutdown_grace=opts.shutdown_grace,
        )
        self.scheduler: Scheduler | None = None
        """The scheduler loop (None with ``enable_scheduling=False``)."""
        if opts.enable_scheduling:
            self.scheduler = Scheduler(
                store,
                SchedulerSettings(
                    interval=opts.scheduling_interval,
                    batch_size=opts.scheduling_batch_size,
                    visibility_ms=opts.visibility_ms,
                    max_deliveries=1 + opts.retry_attempts,
                    lock_ms=opts.lock_ms,
                    takeover_delay=opts.takeover_delay,
                    listen_timeout=polling_timeout,
                ),
                metrics,
            )
            self.scheduler.pending = self.pending
        self.firer: ScheduleFirer | None = None
        """The recurring schedules' firing loop (runs wherever the scheduler runs)."""
        if self.scheduler is not None:
            scheduler = self.scheduler
            self.firer = ScheduleFirer(
                store,
                metrics,
                is_leader=lambda: scheduler.is_leader,
                takeover_delay=opts.takeover_delay,
                sweep=10 * opts.scheduling_interval,
                observer=observer,
            )
            scheduler.on_schedules = self.firer.wake
        self.heartbeat: Heartbeat | None = None
        """The heartbeat loop (None with ``heartbeat_interval=0``)."""
        if opts.heartbeat_interval:
            self.heartbeat = Heartbeat(store, opts.heartbeat_interval, self._snapshot)
        self._history_writer: HistoryWriter | None = None
        if history is not None:
            self._history_writer = HistoryWriter(store, history, opts.history_interval)
        # started with the first consumer: cancel() of a running event reaches its handler
        self._cancels = CancelSignals(store, self._cancel_run)
        self._supervisor: asyncio.Task[None] | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._closing: asyncio.Event | None = None
        self._closed = False
        self.batches: Batches | None = None
        """The batch engine (set by the wiring): consumers give members and callbacks
        ``current_delivery().batch`` from it."""

    # -- consumers -------------------------------------------------------------------

    def add_consumer(
        self,
        name: str,
        event_type: type[Event],
        handler: Handler,
        concurrency: int,
        group: str | None,
        retry_attempts: int | None,
        retry_backoff: Backoff | None,
        timeout: float | timedelta | None = None,
    ) -> None:
        """Check and add a handler's consumer (``group`` checked, None: the default group);
        start it at once if the service runs."""
        settings = self._consumer_settings.overridden(retry_attempts, retry_backoff, timeout)
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
        if (name, group) in self.consumers:
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
            metrics=self._metrics.for_group(group),
            observer=self._observer,
            group=group,
            on_registered=None if group is None else lambda: self.pending.discard(name, group),
            history=self._history,
            pipeline=self.pipeline,
            batches=self.batches,
        )
        self.consumers[name, group] = consumer
        self._metrics.for_group(group).handler_added(name, concurrency)
        if self._task_group is not None:
            if group is not None:  # registered before this process's next enqueue or move
                self.pending.add(name, group, consumer.max_deliveries)
            self._task_group.start_soon(self._keep_running, consumer)
            self._listen_for_cancels(self._task_group)

    def _listen_for_cancels(self, tg: anyio.abc.TaskGroup) -> None:
        """Start the cancel channel's listener (once, and only in a process with handlers)."""
        if not self._cancels.started:
            self._cancels.started = True
            tg.start_soon(self._keep_running, self._cancels)

    def _cancel_run(
        self, shard: str, type_name: str, group: str | None, raw_id: bytes, token: bytes
    ) -> bool:
        consumer = self.consumers.get((type_name, group))
        lease = (shard, raw_id, token)
        return consumer is not None and consumer.cancel_run(
            lease, "its event was cancelled", cancelled=True
        )

    async def remove_consumer(self, name: str, group: str | None) -> bool:
        """Stop a consumer and, while the service runs, wait for its handlers; False if none."""
        consumer = self.consumers.pop((name, group), None)
        if consumer is None:
            return False
        if group is not None:
            self.pending.discard(name, group)
        consumer.stop()
        if self._task_group is not None:
            await consumer.wait_finished()
        self._metrics.for_group(group).handler_removed(name)
        return True

    def _snapshot(self) -> dict[str, tuple[int, int, list[tuple[str, int]]]]:
        # a named group's consumer shows as "type:group" (type names hold no ':')
        return {
            name if group is None else f"{name}:{group}": (
                c.concurrency,
                c.running_handlers,
                c.running_since(RUNNING_SHOWN),
            )
            for (name, group), c in self.consumers.items()
        }

    def clock_moved(self) -> None:
        """Look at everything now (``delayq.testing.advance`` moved the store's clock): the
        scheduler sweeps every type, the firer reads the schedules, waits for flow limits
        end. Each loop's sleep was computed from the clock before the move."""
        if self.scheduler is not None:
            self.scheduler.wake()
        if self.firer is not None:
            self.firer.wake()
        for consumer in self.consumers.values():
            consumer.flow_waits.wake()

    # -- state -----------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """True from :meth:`start` until the tasks have ended (draining included)."""
        return self._supervisor is not None and not self._supervisor.done()

    async def health(self, timeout: float) -> ServiceHealth:
        """Whether the service runs, Redis answers (within ``timeout`` s) and every loop runs."""
        redis_error: str | None = None
        try:
            with anyio.fail_after(timeout):
                await self._store.browsing.server_time_ms()
        except TimeoutError:
            redis_error = f"no answer within {timeout}s"
        except Exception as exc:
            redis_error = f"{type(exc).__name__}: {exc}"
        loops: dict[str, bool] = {}
        if self.scheduler is not None:
            # the schedules' firer runs beside the scheduler and is reported with it
            loops["scheduler"] = self.scheduler in self._running_loops and (
                self.firer is None or self.firer in self._running_loops
            )
        for consumer in self.consumers.values():
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
        """Start the loops (and the outbox relay) under a supervisor task."""
        if self._closed:
            raise RuntimeError("a closed EventService cannot be started again")
        if self._supervisor is not None:
            return
        # refuses data in a format this delayq does not read (a rolling deploy across a
        # format change: docs/versioning.md), before any loop touches it
        await self._store.format.check_format()
        policy = await self._store.browsing.eviction_policy()
        if policy is None:  # managed services and ACL users often may not run CONFIG
            log.info(
                "cannot read Redis's maxmemory-policy (CONFIG GET refused): make sure it is "
                "'noeviction', or Redis may evict queue keys under memory pressure"
            )
        elif policy != "noeviction":
            log.warning(
                "Redis maxmemory-policy is %r: under memory pressure Redis may evict queue "
                "keys and lose events; set it to 'noeviction'",
                policy,
            )
        if self.consumers:
            await self._block_under_idle_timeout()
            # the partition counts in use (a count being changed has two), so that
            # the consumers serve every layout their type has events in
            try:
                await self._store.types.known_types()
            except Exception as exc:  # the scheduler's sweeps read them again
                log.warning("reading the event types failed: %s", exc)
        for (name, group), consumer in self.consumers.items():
            if group is not None:  # as for a handler added while running (see PendingGroups)
                self.pending.add(name, group, consumer.max_deliveries)
        self._closing = asyncio.Event()
        started = asyncio.get_running_loop().create_future()
        self._supervisor = asyncio.create_task(self._supervise(started), name="delayq-service")
        await asyncio.wait([started, self._supervisor], return_when=asyncio.FIRST_COMPLETED)
        if self._supervisor.done():
            self._supervisor.result()  # raise what stopped it

    async def _block_under_idle_timeout(self) -> None:
        """Keep the consumers' BRPOPs shorter than Redis's idle ``timeout`` (see
        ``Deliveries.limit_block``: past it, an entry popped just then could wait for its lease)."""
        idle = await self._store.browsing.idle_timeout()
        block = self._consumer_settings.polling_timeout
        if idle and idle > 0 and block > idle - 0.5:
            at_most = max(0.05, idle - 0.5)
            self._store.deliveries.limit_block(at_most)
            log.info(
                "Redis closes connections idle for %d s (its timeout): consumers block "
                "%.2f s at a time instead of %.2f s",
                idle,
                at_most,
                block,
            )

    async def _supervise(self, started: asyncio.Future[None]) -> None:
        assert self._closing is not None
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                if self.scheduler is not None:
                    tg.start_soon(self._keep_running, self.scheduler)
                if self.firer is not None:
                    tg.start_soon(self._keep_running, self.firer)
                for consumer in self.consumers.values():
                    tg.start_soon(self._keep_running, consumer)
                if self.consumers:
                    self._listen_for_cancels(tg)
                for reporter in (self.heartbeat, self._history_writer):
                    if reporter is not None:
                        tg.start_soon(self._keep_running, reporter)
                async with contextlib.AsyncExitStack() as beside:
                    if self._outbox is not None:
                        # relays stop (finishing their batch) before the loops do
                        await beside.enter_async_context(self._outbox())
                    started.set_result(None)
                    await self._closing.wait()
                consumers = list(self.consumers.values())
                for consumer in consumers:
                    consumer.stop()
                if self.scheduler is not None:
                    self.scheduler.stop()
                if self.firer is not None:
                    self.firer.stop()
                # the last history flush and the heartbeat's removal come after the
                # consumers' last acks
                with anyio.move_on_after(self._options.shutdown_grace * 2 + 5):
                    for consumer in consumers:
                        await consumer.wait_finished()
                self._cancels.stop()
                for reporter in (self.heartbeat, self._history_writer):
                    if reporter is not None:
                        reporter.stop()
        finally:
            self._task_group = None
            if not started.done():
                started.set_result(None)

    async def _keep_running(self, loop: _Loop) -> None:
        """Run a loop; should a bug make it raise, log and start it again."""
        retrying = Retrying(first=0.5, most=MAX_RESTART)
        while True:
            self._running_loops.add(loop)  # what health() reports
            try:
                await loop.run()
                return
            except Exception:
                if loop.stopping:
                    return
                self._running_loops.discard(loop)
                log.exception(
                    "%s crashed; restarting it in %.1fs", type(loop).__name__, retrying.delay
                )
                await retrying.sleep()
            finally:
                self._running_loops.discard(loop)

    async def aclose(self) -> None:
        """Stop the loops (handlers get ``shutdown_grace``), close the store and the clients."""
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
