"""One consumer per event type: BRPOP, bounded concurrency, handler, ack or retry.

A consumer only pops when a handler slot is free. After a BRPOP wakes it, one
``claim`` script call leases that entry and drains up to the remaining free
slots from the ready list. While handlers run their leases are renewed;
successful events are acked in batches by one task, so a busy consumer sends
one ack call for many events.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio

from .codec import Codec
from .context import Delivery, _set_delivery
from .errors import DecodeError
from .events import Event
from .keys import DEFAULT_GROUP
from .metrics import Metrics
from .observer import CANCELLED, TIMEOUT_PREFIX, HandlerRun, Observer
from .retry import Backoff, delay_seconds
from .store import Claimed, Store

__all__ = ["Consumer", "ConsumerSettings", "Handler"]

log = logging.getLogger("delayq.consumer")

Handler = Callable[[Any], Awaitable[Any]]

_MAX_BACKOFF = 5.0
# A stopping consumer gives its last acks at least this long, even with shutdown_grace=0.
_MIN_ACK_FLUSH = 2.0


class _HandlerTasks:
    """A consumer's handler tasks: one plain asyncio task per delivery.

    Starting an asyncio task costs a fraction of starting an anyio task-group
    child (no cancel scope and task record per task), which shows at tens of
    thousands of events per second. The consumer still owns every one:
    whatever runs when it ends is cancelled and awaited.
    """

    def __init__(self, type_name: str):
        self._type_name = type_name
        self._tasks: set[asyncio.Task[None]] = set()
        # tasks whose handler has returned and which are recording the outcome
        self._settling: set[asyncio.Task[None]] = set()

    def start_soon(self, func: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """Start ``func(*args)`` in a new task (it copies the current context, as anyio does)."""
        task = asyncio.get_running_loop().create_task(func(*args))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def settling(self) -> None:
        """Mark the calling task as past its handler: a drain lets it finish recording."""
        task = asyncio.current_task()
        if task in self._tasks:
            self._settling.add(task)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._settling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: a handler task failed", self._type_name, exc_info=task.exception())

    async def cancel_and_wait(self, timeout: float = 10.0) -> None:
        """Cancel the handlers still running and wait (up to ``timeout``) until all tasks end.

        A task whose handler already returned is not cancelled: the outcome it
        is recording (a failure and its retry time) must reach Redis. After
        ``timeout`` every task left is cancelled.
        """
        if not self._tasks:
            return
        for task in self._tasks - self._settling:
            task.cancel()
        with anyio.move_on_after(timeout, shield=True):
            await asyncio.wait(set(self._tasks))
        if self._tasks:
            for task in self._tasks:
                task.cancel()
            with anyio.move_on_after(1.0, shield=True):
                await asyncio.wait(set(self._tasks))


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """The service options a consumer needs."""

    visibility_ms: int
    polling_timeout: float
    retry_attempts: int
    retry_backoff: Backoff
    handler_timeout: float | None
    shutdown_grace: float


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
        metrics: Metrics,
        group: str | None = None,
        observer: Observer | None = None,
    ):
        self.event_type = event_type
        self.type_name = event_type.event_name
        # None: the default group (the type's own keys, no registration)
        self.group = group
        self.label = self.type_name if group is None else f"{self.type_name}[{group}]"
        self.handler = handler
        self.concurrency = concurrency
        self._store = store
        self._codec = codec
        self._s = settings
        self._metrics = metrics
        # times handler runs and opens their spans (shared with the service)
        self._observer = observer if observer is not None else Observer(metrics)
        self._stopping = False
        self._fetch_scope: anyio.CancelScope | None = None
        self._running = 0
        # (id, token) of every delivery whose lease we hold, acked or not yet
        self._leased: set[tuple[bytes, bytes]] = set()
        # the subset whose ack or fail call is under way: a renew racing it finds
        # the lease gone, which is no loss
        self._settling: set[tuple[bytes, bytes]] = set()
        self._acks: list[tuple[bytes, bytes]] = []
        self._acking: list[tuple[bytes, bytes]] = []  # the batch of the ack call under way
        self._acks_closing = False
        self._handlers = _HandlerTasks(self.label)
        self._slot_freed: anyio.Event | None = None
        self._ack_wanted: anyio.Event | None = None
        # asyncio's Event needs no running loop to be created: add_handler may run before one
        self._finished = asyncio.Event()

    @property
    def running_handlers(self) -> int:
        """Handlers running right now."""
        return self._running

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` has been called."""
        return self._stopping

    def stop(self) -> None:
        """Stop fetching; in-flight handlers get ``shutdown_grace`` to finish."""
        self._stopping = True
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
        self._slot_freed = anyio.Event()
        self._ack_wanted = anyio.Event()
        self._acks_closing = False
        acks_done = anyio.Event()
        try:
            async with anyio.create_task_group() as helpers:
                helpers.start_soon(self._renew_loop)
                helpers.start_soon(self._ack_loop, acks_done)
                handlers = self._handlers = _HandlerTasks(self.label)
                try:
                    with anyio.CancelScope() as self._fetch_scope:
                        await self._register_group()
                        await self._fetch_loop(handlers)
                    with anyio.move_on_after(self._s.shutdown_grace):
                        while self._running:
                            await self._wait_for_slot()
                    if self._running:
                        log.warning(
                            "%s: %d handlers still running after shutdown_grace; cancelling "
                            "them, their events come back when their leases expire",
                            self.label,
                            self._running,
                        )
                finally:
                    await handlers.cancel_and_wait()
                # The ack task sends what is pending, including a batch it may
                # hold in a call under way right now, then ends by itself.
                self._acks_closing = True
                self._ack_wanted.set()
                with anyio.move_on_after(max(self._s.shutdown_grace, _MIN_ACK_FLUSH)):
                    await acks_done.wait()
                if not acks_done.is_set():
                    log.error(
                        "%s: Redis did not take the acks of %d finished events during the "
                        "shutdown; they will run again when their leases expire",
                        self.label,
                        len(self._acks) + len(self._acking),
                    )
                helpers.cancel_scope.cancel()
        finally:
            self._finished.set()

    # -- fetching --------------------------------------------------------------

    async def _register_group(self) -> None:
        """Make a named group exist in Redis (durably) before fetching its events."""
        if self.group is None:
            return
        backoff = 0.05
        while not self._stopping:
            try:
                await self._store.register_group(
                    self.type_name, self.group, 1 + self._s.retry_attempts
                )
                return
            except Exception as exc:  # loops never die: back off, go on
                self._metrics.increment("redis_errors", event_type=self.type_name)
                log.warning("%s: registering the group failed (%s)", self.label, exc)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)

    async def _wait_for_slot(self) -> None:
        assert self._slot_freed is not None
        await self._slot_freed.wait()
        self._slot_freed = anyio.Event()

    async def _fetch_loop(self, handlers: _HandlerTasks) -> None:
        backoff = 0.05
        popped: list[bytes] = []  # a BRPOP'd entry whose claim has not gone through yet
        drain = False  # the last claim filled every slot: more may be waiting
        block = max(0.05, self._s.polling_timeout)
        while not self._stopping:
            free = self.concurrency - self._running
            if free <= 0:
                await self._wait_for_slot()
                continue
            try:
                if not popped and not drain:
                    entry = await self._store.pop_ready(self.type_name, block, group=self.group)
                    if entry is None:
                        continue
                    popped.append(entry)
                # A claim that ran must be read to the end, or its events wait
                # a whole lease for nothing: never cancel it half-way.
                with anyio.CancelScope(shield=True):
                    now_us, claimed = await self._store.claim(
                        self.type_name, popped, free - len(popped), self._s.visibility_ms,
                        group=self.group,
                    )  # fmt: skip
                    popped = []
                    drain = len(claimed) >= free
                    for c in claimed:
                        self._running += 1
                        self._leased.add((c.raw_id, c.token))
                        handlers.start_soon(self._handle, c, now_us)
                if claimed:
                    self._metrics.increment("delivered", len(claimed), event_type=self.type_name)
                    self._metrics.gauge("in_flight", self._running, event_type=self.type_name)
                backoff = 0.05
            except Exception as exc:  # Redis down, connection killed, ...: back off, go on
                drain = False
                self._metrics.increment("redis_errors", event_type=self.type_name)
                log.warning(
                    "%s: fetching failed (%s: %s); retrying in %.2fs",
                    self.label,
                    type(exc).__name__,
                    exc,
                    backoff,
                )
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)

    # -- handling --------------------------------------------------------------

    async def _handle(self, c: Claimed, now_us: int) -> None:
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
                    extra=self._fields(c),
                )
                self._handlers.settling()
                await self._fail(c, f"DecodeError: {exc}", dead=True)
                return
            delivery = Delivery(
                self.type_name, c.id, c.attempt, c.due_ms, now_us, context,
                self.group or DEFAULT_GROUP, enqueued_ms=enqueued_ms, envelope=c.envelope,
            )  # fmt: skip
            _set_delivery(delivery)
            run = self._observer.started(delivery)
            failure: str | None = CANCELLED  # unless the handler comes back
            try:
                failure = await self._call_handler(event, c, run)
            finally:
                self._observer.finished(run, failure)
            self._handlers.settling()
            if failure is None:
                self._acks.append((c.raw_id, c.token))
                assert self._ack_wanted is not None
                self._ack_wanted.set()
            else:
                await self._fail(c, failure, dead=c.attempt > self._s.retry_attempts)
        finally:
            self._running -= 1
            self._metrics.gauge("in_flight", self._running, event_type=self.type_name)
            assert self._slot_freed is not None
            self._slot_freed.set()

    def _fields(self, c: Claimed) -> dict[str, Any]:
        """Structured fields of a log record about one delivery (for JSON log formatters)."""
        return {"event_type": self.type_name, "event_id": c.id, "attempt": c.attempt}

    async def _call_handler(self, event: Event, c: Claimed, run: HandlerRun) -> str | None:
        """Run the handler; return None on success, else the failure as "Type: message"."""
        try:
            if self._s.handler_timeout is None:
                result = await self.handler(event)  # no cancel scope to pay for
            else:
                with anyio.CancelScope() as scope:
                    scope.deadline = anyio.current_time() + self._s.handler_timeout
                    result = await self.handler(event)
                if scope.cancelled_caught:
                    return f"{TIMEOUT_PREFIX} handler ran longer than {self._s.handler_timeout}s"
        except Exception as exc:
            run.error = exc
            log.warning(
                "%s %r: handler failed on attempt %d: %s: %s",
                self.label,
                c.id,
                c.attempt,
                type(exc).__name__,
                exc,
                exc_info=log.isEnabledFor(logging.DEBUG),
                extra=self._fields(c),
            )
            return f"{type(exc).__name__}: {exc}"
        if result is False:
            return "ReturnedFalse: the handler returned False"
        return None

    async def _fail(self, c: Claimed, error: str, *, dead: bool) -> None:
        delay_ms = 0
        if not dead:
            try:
                delay_ms = math.ceil(1000 * delay_seconds(self._s.retry_backoff(c.attempt)))
            except Exception:
                log.exception("%s: retry_backoff(%d) failed; retrying in 1s", self.label, c.attempt)
                delay_ms = 1000
        backoff = 0.05
        self._settling.add((c.raw_id, c.token))
        for _ in range(5):
            try:
                code = await self._store.fail(
                    self.type_name, c, dead=dead, delay_ms=delay_ms, error=error[:4000],
                    group=self.group,
                )  # fmt: skip
                break
            except Exception as exc:
                log.warning(
                    "%s %r: recording the failure failed (%s); retrying", self.label, c.id, exc
                )
                await anyio.sleep(backoff)
                backoff *= 2
        else:
            # The lease runs out and the event comes back; the attempt still counts.
            log.error(
                "%s %r: could not record the failure; its lease will expire",
                self.label,
                c.id,
                extra=self._fields(c),
            )
            code = -1
        self._leased.discard((c.raw_id, c.token))
        self._settling.discard((c.raw_id, c.token))
        self._metrics.increment("failed", event_type=self.type_name)
        if code == 2:
            self._metrics.increment("dead_lettered", event_type=self.type_name)
            log.error(
                "%s %r: dead letter after %d deliveries: %s",
                self.label,
                c.id,
                c.attempt,
                error,
                extra=self._fields(c),
            )
        elif code == 1:
            self._metrics.increment("retried", event_type=self.type_name)

    # -- acks and leases ---------------------------------------------------------

    async def _flush_acks(self) -> None:
        backoff = 0.05
        while self._acks:
            batch, self._acks = self._acks, []
            self._acking = batch
            self._settling.update(batch)
            try:
                await self._store.ack(self.type_name, batch, group=self.group)
            except Exception as exc:
                self._settling.difference_update(batch)
                self._acks = batch + self._acks
                self._metrics.increment("redis_errors", event_type=self.type_name)
                log.warning("%s: ack failed (%s); retrying in %.2fs", self.label, exc, backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
                continue
            finally:
                self._acking = []
            self._leased.difference_update(batch)
            self._settling.difference_update(batch)
            self._metrics.increment("succeeded", len(batch), event_type=self.type_name)

    async def _ack_loop(self, done: anyio.Event) -> None:
        """The one task that sends acks, until the consumer closes and none are left.

        Acks that arrive while one call is under way go together in the next.
        Only this task sends acks, so a batch is never cancelled half-way by a
        second flush racing it.
        """
        assert self._ack_wanted is not None
        while not (self._acks_closing and not self._acks):
            await self._ack_wanted.wait()
            self._ack_wanted = anyio.Event()
            await self._flush_acks()
        done.set()

    async def _renew_loop(self) -> None:
        period = self._s.visibility_ms / 3000
        while True:
            await anyio.sleep(period)
            if not self._leased:
                continue
            try:
                lost = await self._store.renew(
                    self.type_name, list(self._leased), self._s.visibility_ms, group=self.group
                )
            except Exception as exc:
                self._metrics.increment("redis_errors", event_type=self.type_name)
                log.warning("%s: renewing leases failed (%s)", self.label, exc)
                continue
            # an ack or fail that ran just before this renew ended the lease itself
            held = {p[0] for p in self._leased - self._settling}
            lost = [i for i in lost if i in held]
            if lost:
                self._metrics.increment("leases_lost", len(lost), event_type=self.type_name)
                log.warning(
                    "%s: lost the lease of %d events (expired, cancelled or replaced): %s",
                    self.label,
                    len(lost),
                    [i.decode("utf-8", "replace") for i in lost[:10]],
                )
                gone = set(lost)
                self._leased = {p for p in self._leased if p[0] not in gone}
