"""One consumer per event type: BRPOP, bounded concurrency, handler, ack or retry.

A consumer only pops when a handler slot is free. A partitioned type has one
fetcher per partition (shard), each blocking in BRPOP on its own connection
(BRPOP cannot span cluster slots); they share the type's handler slots, so
``concurrency`` holds across partitions, and each claim takes at most its
share of the free slots, so busy partitions are served alike. After a BRPOP wakes it, one
``claim`` script call leases that entry and drains up to the remaining free
slots from the ready list, at most ``CLAIM_MAX`` per call (the next claims follow at
once while slots are free and entries wait). What becomes of a delivery after its handler (the
batched acks, failures, lease renewal) is :mod:`delayq.runtime.settlement`'s job; the
handler tasks are :mod:`delayq.runtime.handler_tasks`'. The fetching (BRPOP,
claims) is a :class:`~delayq.runtime.fetching.Fetcher` the consumer owns, over the
:class:`~delayq.runtime.fetching.Slots` it shares with the handler tasks; the options are in
:mod:`delayq.runtime.consumer_settings`.

(Over 400 lines: one job, a delivery from claim to outcome, with the optional timeout,
middleware, parents' outcomes, batch handle (``current_delivery().batch`` of a batch's
member or callback) and kept-result steps beside the plain path they must not slow.)
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio

from ..batches import BATCH_TYPE, Batch
from ..codec import Codec
from ..context import (
    AFTER_KEY,
    BATCH_KEY,
    TIMEOUT_KEY,
    Delivery,
    Parent,
    _progress_sink,
    _set_delivery,
    with_parents,
)
from ..errors import DecodeError
from ..events import Event
from ..keyspace.groups import group_name
from ..metrics import ServiceMetrics
from ..observer import CANCELLED, TIMEOUT_PREFIX, Observer
from ..operations.batches import Batches
from ..results import decode_parent, encode_value, returned_value
from ..storage.store import Claimed, Store, token_flow_key
from .consumer_settings import ConsumerSettings
from .fetching import CLAIM_MAX as CLAIM_MAX  # the claim bound, imported from here
from .fetching import Fetcher, Slots
from .flow_waits import FlowWaits
from .handler_tasks import HandlerTasks, cancel_unless_shielded
from .history import CANCELLED_COLUMN, LATENESS_BOUNDS_MS, LATENESS_ROW_START, HistoryRecorder
from .middleware import Chain, Pipeline
from .progress import ProgressWriter, encode_progress
from .settlement import Lease, Settlement, delivery_fields

__all__ = ["Consumer", "ConsumerSettings", "Handler"]

log = logging.getLogger("delayq.consumer")

Handler = Callable[[Any], Awaitable[Any]]

_RETURNED_FALSE = "ReturnedFalse: the handler returned False"


class Consumer:
    """Fetches ready events of one type and runs ``handler`` on at most ``concurrency`` at once."""

    def __init__(
        self,
        *,
        store: Store,
        codec: Codec,
        event_type: type[Event],
        handler: Handler,
        concurrency: int,
        settings: ConsumerSettings,
        metrics: ServiceMetrics,
        observer: Observer,
        group: str | None = None,
        on_registered: Callable[[], None] | None = None,
        history: HistoryRecorder | None = None,
        pipeline: Pipeline | None = None,
        batches: Batches | None = None,
    ):
        self.event_type = event_type
        self.type_name = event_type.event_name
        # None: the default group (the type's own keys, no registration)
        self.group = group
        self.label = self.type_name if group is None else f"{self.type_name}[{group}]"
        self._group_name = group_name(group)  # as a Delivery names it
        self.handler = handler
        self.concurrency = concurrency
        # the service's middleware (shared, only ever added to) and this handler wrapped
        # in the first n of them
        self._pipeline = Pipeline() if pipeline is None else pipeline
        self._middleware = self._pipeline.items  # the same list, read per event
        self._chain: tuple[int, Chain] | None = None
        self._store = store
        self._codec = codec
        # batches' members and callbacks read current_delivery().batch from it
        self._batches = batches
        self._s = settings
        # the service's metrics as this consumer's group reports them
        self._metrics = metrics
        # times handler runs and opens their spans (shared with the service)
        self._observer = observer
        # What runs per event is bound here, once: a feature that is off costs
        # nothing per event. The history's lateness buckets are counted straight
        # into the recorder's row, so the observer reports to the user's sink alone.
        self._reports = metrics.reports
        # the observer's hooks bound to this consumer's type and view, None when they
        # would report to nothing
        self._hooks = (
            observer.bind(self.type_name, metrics.sink_only())
            if metrics.reports or observer.tracing is not None
            else None
        )
        self._late_row = (
            None if history is None else history.lateness_row(metrics.label(self.type_name))
        )
        self._stopping = False
        self._fetch_scope: anyio.CancelScope | None = None
        # the handler slots, shared by the fetch loops and the handler tasks
        self._slots = Slots(concurrency)
        # progress reports of running handlers (made at the first report)
        self._progress: ProgressWriter | None = None
        self._helpers: anyio.abc.TaskGroup | None = None
        # leases, acks and failures of the deliveries, from claim to the end
        self._settlement = Settlement(
            store=store,
            metrics=metrics,
            type_name=self.type_name,
            label=self.label,
            group=group,
            visibility_ms=settings.visibility_ms,
            retry_backoff=settings.retry_backoff,
            shutdown_grace=settings.shutdown_grace,
            keep_results_ms=event_type.event_results_ms,
        )
        self._settlement.on_lost = self._leases_lost
        # a type with results= keeps each handler's return value (see _keep)
        self._keeps = event_type.event_results_ms is not None
        self._handlers = HandlerTasks(self.label)
        self._flow = FlowWaits(store, metrics, self.type_name, group)
        self._fetcher = Fetcher(
            store=store,
            metrics=metrics,
            settings=settings,
            type_name=self.type_name,
            group=group,
            label=self.label,
            slots=self._slots,
            settlement=self._settlement,
            flow=self._flow,
            handle=self._handle,
            on_registered=on_registered,
        )
        # asyncio's Event needs no running loop to be created: add_handler may run before one
        self._finished = asyncio.Event()

    @property
    def running_handlers(self) -> int:
        """Handlers running right now."""
        return self._slots.running

    @property
    def unsettled(self) -> int:
        """Deliveries this consumer is claiming or holds the lease of: claims under way,
        handlers running, acks or failures not recorded yet (0: all settled in Redis)."""
        return self._slots.reserved + len(self._settlement.leased)

    @property
    def flow_waits(self) -> FlowWaits:
        """The waits of this consumer's fetchers held back by flow limits."""
        return self._flow

    def running_since(self, most: int) -> list[tuple[str, int]]:
        """``(event id, claim time in ms)`` of up to ``most`` running handlers, longest first."""
        started = sorted(
            ((us, raw) for (_, raw, _), (us, _) in self._slots.started.items()),
            key=lambda item: item[0],
        )[:most]
        return [(raw.decode("utf-8", "replace"), us // 1000) for us, raw in started]

    @property
    def max_deliveries(self) -> int:
        """Deliveries of an event to this consumer's group before it becomes a dead letter."""
        return self._fetcher.max_deliveries

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` has been called."""
        return self._stopping

    def stop(self) -> None:
        """Stop fetching; in-flight handlers get ``shutdown_grace`` to finish."""
        self._stopping = self._fetcher.stopping = True
        if self._fetch_scope is not None:
            self._fetch_scope.cancel()

    async def wait_finished(self) -> None:
        """Wait until :meth:`run` has returned."""
        await self._finished.wait()

    async def run(self) -> None:
        """Consume until :meth:`stop`; owns the handler, ack and renewal tasks.

        On stop: fetching ends, running handlers get ``shutdown_grace`` to
        finish, and the ack task sends every ack still pending before it ends
        (a handler that succeeded is acked before this returns, unless Redis
        stays unreachable for the whole flush; that is logged).
        """
        self._finished.clear()
        self._slots.reset()
        slots = self._slots
        settlement = self._settlement
        settlement.open()
        _progress_sink.set(self._report_progress)  # the handler tasks inherit it
        self._progress = None  # a writer of an earlier run ended with its task group
        try:
            async with anyio.create_task_group() as helpers:
                self._helpers = helpers
                helpers.start_soon(settlement.renew_loop)
                helpers.start_soon(settlement.ack_loop)
                handlers = self._handlers = HandlerTasks(self.label)
                try:
                    with anyio.CancelScope() as self._fetch_scope:
                        await self._fetcher.register_group()
                        await self._fetcher.fetch_all(handlers)
                    with anyio.move_on_after(self._s.shutdown_grace):
                        while slots.running:
                            await slots.wait()
                    if slots.running:
                        log.warning(
                            "%s: %d handlers still running after shutdown_grace; cancelling "
                            "them, their events come back when their leases expire",
                            self.label,
                            slots.running,
                        )
                finally:
                    await handlers.cancel_and_wait()
                # The ack task sends what is pending, including a batch it may
                # hold in a call under way right now, then ends by itself.
                await settlement.close_acks()
                helpers.cancel_scope.cancel()
        finally:
            self._helpers = None
            self._finished.set()

    def cancel_run(self, lease: Lease, why: str, *, cancelled: bool = False) -> bool:
        """Cancel the handler task of the delivery ``lease`` (shard, id, claim token) if it
        runs here: its event was cancelled (``cancelled``: counted in the history), or its
        lease lost. True when a task was told."""
        entry = self._slots.started.get(lease)
        if entry is None or entry[1].done():
            return False
        _, raw_id, _ = lease
        task = entry[1]
        log.info(
            "%s %r: cancelling its handler (%s)", self.label, raw_id.decode("utf-8", "replace"), why
        )
        if cancelled and self._late_row is not None and not self._handlers.settled(task):
            # the event ended here: a cancelled run, neither handled nor failed
            self._late_row[CANCELLED_COLUMN] += 1
        cancel_unless_shielded(task, self._handlers.settled)
        # the run records nothing (its event is gone, or another delivery holds it): its
        # lease is no longer renewed once the task has ended
        task.add_done_callback(lambda _: self._settlement.leased.discard(lease))
        return True

    def _leases_lost(self, leases: list[Lease]) -> None:
        """A renewal found these leases lost (expired while this process stalled, say, and
        maybe claimed by another worker): cancel their runs, which must not go on."""
        for lease in leases:
            self.cancel_run(lease, "its lease was lost")

    def _report_progress(self, delivery: Delivery, value: object, note: str | None) -> None:
        """``Delivery.progress`` of one of this consumer's runs: kept for the writer task."""
        data = encode_progress(value, note)
        writer = self._progress
        if writer is None:
            writer = self._progress = ProgressWriter(self._store, self.group, self.label)
        if not writer.started and self._helpers is not None:
            writer.started = True
            self._helpers.start_soon(writer.run)
        raw = delivery.id.encode()
        for (shard, raw_id, token), (claimed_us, task) in self._slots.started.items():
            if raw_id == raw and claimed_us == delivery.claimed_us:
                if writer.report(shard, raw_id, token, data):  # its first: clear it at its end
                    task.add_done_callback(partial(_run_ended, writer, token))
                return

    # -- handling --------------------------------------------------------------

    async def _parents(self, shard: str, event_id: str) -> tuple[Parent, ...]:
        """The parents of a child event and their outcomes (docs/WORKFLOWS.md); none when
        they cannot be read (the handler runs anyway: it was released by them)."""
        try:
            _, _, edges = await self._store.dependencies.dep_parents(shard, event_id)
        except Exception as exc:
            self._metrics.increment("redis_errors", event_type=self.type_name)
            log.warning("%s %r: reading its parents failed (%s)", self.label, event_id, exc)
            return ()
        return tuple(decode_parent(t, i, r) for t, i, r in edges)

    async def _batch_of(self, parents: tuple[Parent, ...]) -> Batch | None:
        """A callback's batch, read once (docs/WORKFLOWS.md, "Batches"); None for a child
        whose parents hold no batch."""
        batches = self._batches
        if batches is None:
            return None
        for parent in parents:
            if parent.event_type == BATCH_TYPE:
                try:
                    return await batches.callback_handle(parent.id)
                except Exception as exc:
                    self._metrics.increment("redis_errors", event_type=self.type_name)
                    log.warning("%s: reading batch %s failed (%s)", self.label, parent.id, exc)
                    return Batch(batches, parent.id)
        return None

    async def _handle(self, c: Claimed, now_us: int, lease: Lease) -> None:
        shard = lease[0]
        try:
            try:
                event, context, enqueued_ms = self._codec.decode_timed(
                    c.envelope, self.event_type, c.raw_id
                )
            except DecodeError as exc:
                self._metrics.increment("decode_errors", event_type=self.type_name)
                log.error(
                    "%s %r: %s; moving it to dead letters",
                    self.label,
                    c.id,
                    exc,
                    extra=delivery_fields(self.type_name, c),
                )
                self._handlers.settling()
                await self._settlement.fail(c, shard, f"DecodeError: {exc}", dead=True)
                return
            due_ms = c.due_ms
            token = c.token
            delivery = Delivery(
                self.type_name,
                c.id,
                c.attempt,
                due_ms,
                now_us,
                context,
                self._group_name,
                enqueued_ms,
                c.envelope,
                # a keyed delivery's token is "<n>|<key>" (claim.lua), a plain one digits;
                # not `b"|" in token`: bytes' `in` builds a TypeError first (~2k instructions)
                None if token.isdigit() else token_flow_key(token),
            )
            timeout = self._s.handler_timeout
            if context:  # rare: an event's own timeout (enqueue's timeout=), its parents
                if TIMEOUT_KEY in context:
                    timeout = _event_timeout(context[TIMEOUT_KEY], timeout)
                if AFTER_KEY in context:  # after=[...]: its parents' outcomes, from its slot
                    parents = await self._parents(shard, c.id)
                    batch = await self._batch_of(parents) if self._batches is not None else None
                    delivery = with_parents(delivery, parents, batch)
                elif BATCH_KEY in context and self._batches is not None:  # a batch's member
                    handle = self._batches.member_handle(context, self.type_name, c.id)
                    delivery = with_parents(delivery, (), handle)
            _set_delivery(delivery)
            row = self._late_row
            if row is not None and due_ms is not None:
                # the history's lateness bucket, as HistoryRecorder.observe would count it
                late_s = (now_us / 1000 - due_ms) / 1000
                bucket = bisect_left(LATENESS_BOUNDS_MS, late_s * 1000 if late_s > 0 else 0.0)
                row[LATENESS_ROW_START + bucket] += 1
            hooks = self._hooks
            run = None if hooks is None else hooks.started(delivery)
            error: Exception | None = None
            failure: str | None = CANCELLED  # unless the handler comes back
            try:
                if timeout is None and not self._middleware:  # no scope nor frame to pay for
                    try:
                        result = await self.handler(event)
                    except Exception as exc:
                        failure, error = self._failed(exc, c), exc
                    else:
                        failure = None if result is not False else _RETURNED_FALSE
                else:
                    failure, error, result = await self._call_guarded(event, c, delivery, timeout)
                if failure is None and self._keeps:
                    failure = self._keep(result, lease)
            finally:
                if run is not None and hooks is not None:
                    hooks.finished(delivery, run, failure, error)
            if failure is None:
                # No await from the handler's return to here, so a drain's cancel cannot
                # come between them. The ack task clears ack_wanted before it takes the
                # list: the first ack of a new list wakes it, the others find it awake.
                acks = self._settlement.acks
                acks.append(lease)
                if len(acks) == 1:
                    self._settlement.ack_wanted.set()
            else:
                self._handlers.settling()
                await self._settlement.fail(
                    c, shard, failure, dead=c.attempt > self._s.retry_attempts
                )
        finally:
            self._slots.ended(lease, self._reports)

    def _keep(self, returned: object, lease: Lease) -> str | None:
        """Note the outcome record of a handler's return value for its ack (a type with
        ``results=``); the failure to record instead when the value cannot be kept."""
        try:
            record = encode_value(
                returned_value(returned), self._codec.serializer, self._codec.max_payload_bytes
            )
        except (TypeError, ValueError) as exc:
            return f"ResultNotKept: {exc}"
        self._settlement.results[lease] = record
        return None

    async def _call_guarded(
        self, event: Event, c: Claimed, delivery: Delivery, timeout: float | None
    ) -> tuple[str | None, Exception | None, object]:
        """Run the handler in its middleware, under ``timeout`` (seconds, None: none):
        ``(None, None, returned)`` on success, else the failure and the exception raised
        (None for a timeout or False), and None."""
        items = self._pipeline.items
        chain = self._chain
        if items and (chain is None or chain[0] != len(items)):
            chain = self._chain = (len(items), self._pipeline.chain(self.handler))
        try:
            if timeout is None:
                result = await (self.handler(event) if chain is None else chain[1](delivery, event))
            else:
                with anyio.CancelScope() as scope:
                    scope.deadline = anyio.current_time() + timeout
                    if chain is None:
                        result = await self.handler(event)
                    else:
                        result = await chain[1](delivery, event)
                # cancel_called: the deadline passed, even if a middleware swallowed the cancel
                if scope.cancel_called:
                    return f"{TIMEOUT_PREFIX} handler ran longer than {timeout}s", None, None
        except Exception as exc:
            return self._failed(exc, c), exc, None
        return (None if result is not False else _RETURNED_FALSE), None, result

    def _failed(self, exc: Exception, c: Claimed) -> str:
        """Log the handler's exception; return the failure as "Type: message"."""
        log.warning(
            "%s %r: handler failed on attempt %d: %s: %s",
            self.label,
            c.id,
            c.attempt,
            type(exc).__name__,
            exc,
            exc_info=log.isEnabledFor(logging.DEBUG),
            extra=delivery_fields(self.type_name, c),
        )
        return f"{type(exc).__name__}: {exc}"


def _run_ended(writer: ProgressWriter, token: bytes, _: object) -> None:
    """A reporting run's task ended: its progress goes."""
    writer.finished(token)


def _event_timeout(raw: str, default: float | None) -> float | None:
    """One event's timeout (ms as digits in its context) in seconds; ``default`` if malformed."""
    ms = int(raw) if raw.isdigit() else 0
    return ms / 1000 if ms else default
