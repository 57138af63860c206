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
:mod:`~delayq.runtime.runtime` (handlers, the loops, the lifecycle). Every public
method keeps its docstring here, where users read it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from .events import Event
from .flow.control import KEEP, FlowControl, Keep
from .flow.dedup import check_debounce, dedup_mode
from .flow.keys import KeyBacklogs
from .flow.limits import FlowLimits, Rate
from .operations.groups import check_group, check_view
from .options import Options
from .partitions.repartition import RepartitionResult
from .retry import Backoff, delay_ms, due_unix_ms
from .runtime.consumer import Handler
from .runtime.health import ServiceHealth
from .runtime.heartbeat import WorkerInfo
from .runtime.history import HistoryPoint, Window
from .schedules.api import ScheduleInfo
from .storage import connect
from .storage.connect import Client
from .storage.store import QueueCounts, Store
from .views.browsing import DueHistogram, InFlightEvent
from .views.inspection import DeadLetter, EventInfo, EventTypeRef, ScheduledEvent
from .views.searching import DeadLetterSearch, IdSearch, ReadyEvent
from .wiring import wire

__all__ = ["Client", "DeadLetter", "EventService", "HistoryPoint", "WorkerInfo"]


class EventService:
    """Delayed events on Redis: enqueue them, and handle them when they are due.

    ``redis`` must be a ``redis.asyncio.Redis`` created with ``decode_responses=False``;
    :meth:`from_url` builds suitable clients. Every option is a keyword argument
    (see the README for defaults); bad values raise ``TypeError``/``ValueError``.

    Use ``async with service:`` or :meth:`start` / :meth:`aclose`. Enqueueing
    works without starting (a producer-only process); handlers run once started.
    """

    def __init__(self, redis: Client, **options: Any):
        self._setup(connect.Clients(redis, None), options)

    def _setup(self, clients: connect.Clients, options: dict[str, Any]) -> None:
        parts = wire(clients, options, self)
        self._options, self._store, self._router = parts.options, parts.store, parts.router
        self._types, self._groups = parts.types, parts.groups
        self._inspector, self._browser, self._enqueuer = parts.inspector, parts.browser, parts.enqueuer
        self._finder = parts.finder
        self._runtime = parts.runtime
        self._flow = FlowControl(parts.store)
        self._scheduler = parts.runtime.scheduler
        self._schedules = parts.schedules

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
            list(sentinels), service_name, polling=polling, sentinel_kwargs=sentinel_kwargs,
            **kwargs,
        )  # fmt: skip
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

    # -- types and handlers ------------------------------------------------------

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
        README, "Delivery groups"). The group is registered in Redis as its
        consumer starts, and at the latest before this process's next enqueue
        or scheduler pass: an event enqueued here after ``add_handler``
        returns reaches the group. (Other processes' enqueues reach it once it
        is registered; ``await register_group(...)`` first to be sure.)
        Without ``group`` the handler joins the default group. ``retry_attempts`` and ``retry_backoff`` override the service's
        options for this group's deliveries.
        """
        name = self._types.register(event_type)
        self._runtime.add_consumer(
            name, event_type, handler, concurrency, check_group(group), retry_attempts,
            retry_backoff,
        )  # fmt: skip

    async def remove_handler(self, event_type: type[Event], *, group: str | None = None) -> bool:
        """Stop handling ``event_type`` (in ``group``) once its in-flight handlers finish.

        False if there was no such handler. The group stays registered: its
        events wait for it (see :meth:`remove_group`).
        """
        name = self._types.register(event_type)
        return await self._runtime.remove_consumer(name, check_group(group))

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
        name = self._types.register(event_type)
        checked = check_group(group)
        return await self._groups.register(name, checked, retry_attempts)

    async def remove_group(self, event_type: type[Event], group: str) -> bool:
        """Drop a delivery group: its pending deliveries, retries and dead letters.

        Events no other group holds are deleted. This process's handler for
        the group is stopped; stop the group's handlers in other processes
        first, or they register it again when they start. Returns False when
        the group was not registered; raises ``ValueError`` for the type's
        last group.
        """
        name = self._types.register(event_type)
        checked = check_group(group)
        await self._runtime.remove_consumer(name, checked)
        return await self._groups.remove(name, checked)

    async def groups(self, event_type: EventTypeRef) -> list[str]:
        """The delivery groups registered for ``event_type`` (class or wire name;
        ``["default"]`` if none is named), those of handlers just added included."""
        if self._runtime.pending.any:
            await self._runtime.pending.flush()
        return await self._groups.names(self._types.name(event_type))

    async def group_stats(self, event_type: EventTypeRef) -> dict[str, QueueCounts]:
        """Counts per delivery group of ``event_type`` (class or wire name).

        A group's ``scheduled`` counts the type's events not yet due (each will
        reach every group) plus the group's own retries waiting.
        """
        if self._runtime.pending.any:
            await self._runtime.pending.flush()
        return await self._groups.counts(self._types.name(event_type))

    # -- flow control ----------------------------------------------------------------

    async def set_limits(
        self,
        event_type: EventTypeRef,
        *,
        concurrency: int | Keep | None = KEEP,
        rate: str | Rate | Keep | None = KEEP,
        per_key_concurrency: int | Keep | None = KEEP,
        per_key_rate: str | Rate | Keep | None = KEEP,
        group: str | None = None,
    ) -> FlowLimits:
        """Store fleet-wide flow limits of ``event_type`` (or of one delivery ``group``).

        ``concurrency``: handlers in flight across every process (live leases,
        so a crashed worker's slots come back when its leases expire).
        ``rate``: handler starts per period across every process, e.g.
        ``"100/s"``, ``"6000/min"``, ``"5/10s"``, ``"100/s burst 20"`` (the
        bucket: starts allowed at once after an idle spell; default 100 ms
        worth, at least 1) or a :class:`~delayq.flow.limits.Rate`. ``None`` removes
        a limit; a limit not given is left as it is. Every process obeys the
        change within about a second; ``add_handler``'s ``concurrency`` still
        bounds each process. Returns the limits now stored. Raises
        ``ValueError`` for a bad value. On a partitioned type each partition
        enforces a share of the limit, the shares adding up to it (so
        ``concurrency`` must be at least the partition count; see
        docs/FLOW.md, "Partitioned types"). ``per_key_concurrency`` and
        ``per_key_rate`` are the same limits for each flow key separately
        (``enqueue_*(..., key=...)``; events without a key share one):
        ``per_key_concurrency=1`` runs each key's events one at a time, in the
        order they became ready. Per-key limits on a partitioned type raise
        ``ValueError`` (a key's events are spread over the partitions).
        """
        name, partitions = self._flow_type(event_type)
        return await self._flow.set_limits(
            name, partitions, check_group(group), concurrency=concurrency, rate=rate,
            per_key_concurrency=per_key_concurrency, per_key_rate=per_key_rate,
        )  # fmt: skip

    async def limits(self, event_type: EventTypeRef, *, group: str | None = None) -> FlowLimits:
        """The flow limits stored for ``event_type`` (or one delivery ``group``), paused
        state included; all None/False when none is set."""
        name, partitions = self._flow_type(event_type)
        return await self._flow.limits(name, partitions, check_group(group))

    async def pause(self, event_type: EventTypeRef, group: str | None = None) -> None:
        """Start no new handler of ``event_type`` (or of ``group``) in any process.

        Events are still accepted, scheduled and made ready; running handlers
        finish. Once this returns no claim succeeds, so the only handlers that
        start afterwards are those of events already claimed. Durable (stored
        in Redis) until :meth:`resume`.
        """
        name, partitions = self._flow_type(event_type)
        await self._flow.set_paused(name, partitions, check_group(group), True)

    async def resume(self, event_type: EventTypeRef, group: str | None = None) -> None:
        """Undo :meth:`pause`: waiting consumers are woken at once (within a second at most)."""
        name, partitions = self._flow_type(event_type)
        await self._flow.set_paused(name, partitions, check_group(group), False)

    async def key_backlog(
        self, event_type: EventTypeRef, *, group: str | None = None, limit: int = 10
    ) -> KeyBacklogs:
        """The flow keys of ``event_type`` (or one delivery ``group``) with the most ready
        events, at most ``limit`` (docs/FLOW.md, "Flow keys"): per key its ready events,
        running deliveries and whether a per-key limit holds it back. Looks at up to
        1,000 keys with work (``KeyBacklogs.scanned``); read-only."""
        name = self._types.name(event_type)
        cls = self._types.cls_of(name)
        partitions = 1 if cls is None else cls.event_partitions
        return await self._flow.key_backlog(name, partitions, check_group(group), limit)

    def _flow_type(self, event_type: EventTypeRef) -> tuple[str, int]:
        name = self._types.name(event_type)
        cls = self._types.cls_of(name)
        return name, 1 if cls is None else cls.event_partitions

    # -- enqueueing ----------------------------------------------------------------

    async def enqueue_with_delay(
        self,
        event: Event,
        delay: float | timedelta = 0,
        *,
        context: Mapping[str, str] | None = None,
        replace: bool = False,
        debounce: float | timedelta | None = None,
        unique_for: float | timedelta | None = None,
        key: str | None = None,
    ) -> bool:
        """Handle ``event`` once ``delay`` (a timedelta or seconds, >= 0) has passed.

        The due time is counted on Redis's clock. Returns True when scheduled.
        When an event of the same type and id exists, it is kept and False is
        returned, unless ``replace=True`` swaps its payload, context and due
        time in one step (and returns True).

        Two more dedup modes (at most one of the three per call; docs/FLOW.md):
        ``debounce=max_wait`` replaces an existing event like ``replace`` but
        never pushes its due time past the id's first enqueue + ``max_wait``
        (``delay`` must not exceed ``max_wait``); ``unique_for=ttl`` keeps the
        first like the default, and once the event has been handled refuses
        the id (returns False) until ``ttl`` has passed.

        ``key``: the event's flow key (say, its tenant; docs/FLOW.md "Flow
        keys"): ready events are served in fair turns between keys, and
        per-key limits apply to each key. None: the field named by the class's
        ``flow_key=...``, if any; events without a key share one.
        """
        ms = delay_ms(delay)
        mode = dedup_mode(replace, debounce, unique_for)
        check_debounce(mode, ms)
        return await self._enqueuer.one(
            event, ms, absolute=False, context=context, replace=mode, key=key
        )

    async def enqueue_at(
        self,
        event: Event,
        when: datetime,
        *,
        context: Mapping[str, str] | None = None,
        replace: bool = False,
        debounce: float | timedelta | None = None,
        unique_for: float | timedelta | None = None,
        key: str | None = None,
    ) -> bool:
        """Handle ``event`` at ``when`` (a timezone-aware datetime); past times mean now.

        ``replace``, ``debounce``, ``unique_for`` and ``key`` as in
        :meth:`enqueue_with_delay`. With ``debounce=max_wait`` the due time is capped
        (on Redis's clock) at the id's first enqueue + ``max_wait``; ``when`` further
        than ``max_wait`` from now (this process's clock: a check for mistakes) raises
        ``ValueError``.
        """
        ms = due_unix_ms(when)
        mode = dedup_mode(replace, debounce, unique_for)
        check_debounce(mode, ms - round(time.time() * 1000))
        return await self._enqueuer.one(
            event, ms, absolute=True, context=context, replace=mode, key=key
        )

    async def enqueue_many(
        self,
        events: Iterable[Event | tuple[Event, float | timedelta]],
        delay: float | timedelta = 0,
        *,
        context: Mapping[str, str] | None = None,
        replace: bool = False,
        debounce: float | timedelta | None = None,
        unique_for: float | timedelta | None = None,
        key: str | None = None,
    ) -> list[bool]:
        """Enqueue many events in pipelined batches; one result per event, in order.

        Items are events (due after ``delay``) or ``(event, delay)`` pairs. All
        items are validated before anything is written. ``replace``, ``debounce``
        (every item's delay at most ``max_wait``) and ``unique_for`` as in
        :meth:`enqueue_with_delay` (with ``debounce``, an id given twice in one call:
        the later replaces the earlier); ``key`` is every event's flow key (None: each
        class's ``flow_key`` field, if any).
        """
        mode = dedup_mode(replace, debounce, unique_for)
        return await self._enqueuer.many(events, delay, context, mode, key)

    async def enqueue_envelopes(
        self,
        event_type: str,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool = False,
        replace: bool = False,
        keys: Sequence[str | None] | None = None,
    ) -> list[int]:
        """Enqueue events already encoded into envelopes; one code per item, in order.

        For tools that encode elsewhere and send later, such as the transactional
        outbox of :mod:`delayq.postgres`: ``event_type`` is a wire name, and each
        item is ``(id, envelope, ms)`` with an envelope made by
        :class:`delayq.codec.Codec` and ``ms`` a delay in ms or, with
        ``absolute=True``, a unix time in ms. The same script, dedup and
        ``replace`` rule as every enqueue apply. Codes: 1 added, 0 kept (the id
        existed), 2 replaced. Envelopes are not decoded here: one that does not
        decode becomes a dead letter when it is delivered. ``keys``: a flow key
        per item (None: none; see :meth:`enqueue_with_delay`).
        """
        return await self._enqueuer.envelopes(
            event_type, items, absolute=absolute, replace=replace, keys=keys
        )

    async def cancel(self, event_type: EventTypeRef, id: str) -> bool:
        """Remove a pending (scheduled, ready or in-flight) event; True when one was removed.

        ``event_type`` is the class or its wire name. Dead letters are not
        touched: use :meth:`purge_dead_letters`.
        """
        name = self._types.name(event_type)
        return await self._enqueuer.cancel(name, id)

    # -- recurring schedules ---------------------------------------------------------

    async def schedule(
        self,
        name: str,
        event_type: type[Event],
        *,
        cron: str | None = None,
        every: timedelta | float | None = None,
        timezone: str = "UTC",
        payload: Mapping[str, Any] | None = None,
        context: Mapping[str, str] | None = None,
        overlap: str = "skip",
        catch_up: timedelta | float | None = None,
        jitter: timedelta | float | None = None,
        start_at: datetime | None = None,
        end_at: datetime | None = None,
    ) -> ScheduleInfo:
        """Create or update (by ``name``) a durable schedule firing ``event_type`` events.

        Exactly one of ``cron`` (5 fields, or 6 with seconds first; ``@hourly``-style
        aliases, ranges, steps, ``L`` and ``#``) evaluated in ``timezone`` (IANA), or
        ``every`` (a timedelta, slots at whole multiples from ``start_at`` or the unix
        epoch). Each slot is fired once, whichever and however many processes run the
        scheduler, as an event with id ``"<name>@<slot in UTC>"`` built from ``payload``
        (checked against ``event_type`` now) and ``context``; handlers read the slot from
        ``current_delivery().slot``. ``overlap``: ``"skip"`` (default: no fire while the
        previous one is still pending), ``"buffer_one"`` (one fire held back until the
        previous one has left, the others skipped) or ``"allow"``. ``catch_up``: after an outage, missed slots younger than this are
        fired (default None: only the latest missed slot). ``jitter``: a delay up to this
        long added per fire, the same for a slot in every process. Updating keeps the
        slots already fired; see docs/SCHEDULES.md. Bad arguments raise
        ``TypeError``/``ValueError`` and write nothing.
        """
        spec = self._schedules.build(
            name, event_type, cron=cron, every=every, timezone=timezone, payload=payload,
            context=context, overlap=overlap, catch_up=catch_up, jitter=jitter,
            start_at=start_at, end_at=end_at,
        )  # fmt: skip
        return await self._schedules.upsert(spec)

    async def schedules(self) -> list[ScheduleInfo]:
        """Every schedule under the prefix (by name): expression, next and last fire, state."""
        return await self._schedules.list()

    async def schedule_info(self, name: str) -> ScheduleInfo | None:
        """One schedule, or None when there is none by that name."""
        return await self._schedules.get(name)

    async def unschedule(self, name: str) -> bool:
        """Delete a schedule (fires already enqueued stay); False when there was none."""
        return await self._schedules.remove(name)

    async def pause_schedule(self, name: str) -> bool:
        """Stop firing a schedule until :meth:`resume_schedule`; False when there is none."""
        return await self._schedules.set_paused(name, True)

    async def resume_schedule(self, name: str) -> bool:
        """Fire a paused schedule again from its next slot (no late fires for the pause)."""
        return await self._schedules.set_paused(name, False)

    async def trigger_schedule(self, name: str) -> str | None:
        """Fire a schedule once now, besides its regular slots; the event id (None: no such
        schedule). Its id is ``"<name>@trigger-<unix ms>"``."""
        return await self._schedules.trigger(name)

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
        name = self._types.name(event_type)
        return await self._inspector.dead_letters(name, limit, offset, group=check_group(group))

    async def inspect(self, event_type: EventTypeRef, id: str) -> EventInfo:
        """Where one event is (scheduled, ready, in flight, dead, absent) and all Redis holds
        about it, read in one atomic step. ``event_type`` is the class or its wire name."""
        name = self._types.name(event_type)
        return await self._inspector.inspect(name, id)

    async def scheduled(
        self, event_type: EventTypeRef, limit: int = 100, offset: int = 0, *,
        group: str | None = None,
    ) -> list[ScheduledEvent]:
        """Up to ``limit`` (≤ 1000) scheduled events from position ``offset``, earliest due
        first. Retries waiting for their backoff are scheduled events too. With ``group``
        (``"default"`` included), the type's schedule and that group's retries."""
        name = self._types.name(event_type)
        return await self._inspector.scheduled(name, limit, offset, group=check_view(group))

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
        name = self._types.name(event_type)
        return await self._router.requeue_dead(name, ids, delay_ms(delay), check_group(group))

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
        name = self._types.name(event_type)
        return await self._router.purge_dead(name, ids, check_group(group))

    async def stats(self) -> dict[str, QueueCounts]:
        """Counts per event type name, for every type that has been used under the prefix.

        Each :class:`QueueCounts` also has the next due time and the backlog's age; the
        cost is one read-only script call per type, all in one pipeline.
        """
        return await self._inspector.stats()

    async def stats_for(self, event_type: EventTypeRef) -> QueueCounts:
        """Counts of one event type (class or wire name)."""
        name = self._types.name(event_type)
        return (await self._inspector.stats([name]))[name]

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
        name = self._types.register(event_type)
        return await self._router.repartition(name, event_type.event_partitions, wait)

    # -- browsing --------------------------------------------------------------------

    async def in_flight(
        self, event_type: EventTypeRef, limit: int = 100, offset: int = 0, *,
        group: str | None = None,
    ) -> list[InFlightEvent]:
        """Up to ``limit`` in-flight events (class or wire name; of delivery ``group``, the
        default group's without), earliest lease deadline first."""
        name = self._types.name(event_type)
        return await self._browser.in_flight(name, limit, offset, check_group(group))

    async def due_histogram(
        self, event_type: EventTypeRef, *, group: str | None = None
    ) -> DueHistogram:
        """How many scheduled events fall due: overdue, next minute, hour, day, later.
        With ``group``, that delivery group's retries count too."""
        name = self._types.name(event_type)
        return await self._browser.due_histogram(name, check_view(group))

    async def run_now(self, event_type: EventTypeRef, id: str, *, group: str | None = None) -> bool:
        """Hand a scheduled event to the consumers now; False when it is not scheduled.

        Its attempt count and last error are kept (a retry waiting for its backoff
        runs now as that retry). For a type with delivery groups: without ``group``
        every group runs it now; with ``group`` that group alone, the others getting
        it at its due time (see README, "Delivery groups").
        """
        name = self._types.name(event_type)
        return await self._browser.run_now(name, id, check_view(group))

    async def ready(
        self, event_type: EventTypeRef, limit: int = 100, offset: int = 0, *,
        group: str | None = None,
    ) -> list[ReadyEvent]:
        """Up to ``limit`` (≤ 1000) ready events (due, not claimed yet) from position
        ``offset``, in the order consumers get them; of delivery ``group`` (the default
        group's without). Cancel one with :meth:`cancel`."""
        name = self._types.name(event_type)
        return await self._finder.ready(name, limit, offset, check_group(group))

    async def find_ids(self, event_type: EventTypeRef, prefix: str, limit: int = 20) -> IdSearch:
        """Ids of the type's events (in any state and delivery group) that start with
        ``prefix``: at most ``limit``, and whether the search was complete (it looks at
        about 5,000 ids per state and group at most: ZSCAN with MATCH, COUNT 100)."""
        return await self._finder.find_ids(self._types.name(event_type), prefix, limit)

    async def find_dead_letters(
        self, event_type: EventTypeRef, text: str, limit: int = 100, offset: int = 0, *,
        scan: int = 1000, group: str | None = None,
    ) -> DeadLetterSearch:
        """Dead letters (of ``group``) whose last error contains ``text`` (ASCII case
        ignored), among the ``scan`` (≤ 5000) oldest from position ``offset``; the result
        says where to continue (``next_offset``) and whether it reached the end."""
        name = self._types.name(event_type)
        return await self._finder.find_dead_letters(
            name, text, limit, offset, scan, check_group(group)
        )

    # -- workers and history ----------------------------------------------------------

    @property
    def worker_id(self) -> str | None:
        """This process's id in :meth:`workers` (None when ``heartbeat_interval=0``)."""
        heartbeat = self._runtime.heartbeat
        return None if heartbeat is None else heartbeat.worker_id

    async def workers(self, limit: int = 1000) -> list[WorkerInfo]:
        """The live worker processes under the prefix, from their heartbeats (oldest first)."""
        return await self._browser.workers(limit)

    async def history(
        self, event_type: EventTypeRef, window: Window = "hour", *, group: str | None = None
    ) -> list[HistoryPoint]:
        """Handled, failed and lateness of a type (class or wire name; of delivery ``group``,
        the default group's without) per minute (``window="hour"``: 60 points) or per 20
        minutes (``"day"``: 72 points), summed over every worker, oldest first."""
        name = self._types.name(event_type)
        return await self._browser.history(name, window, check_group(group))

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

