"""Wiring a service: its parts, built from its clients and keyword options.

:func:`wire` checks the options (:class:`~delayq.options.Options`) and the
command client (:func:`delayq.storage.connect.check_client`), then builds each part
once and hands it the others it works with: the store, the router over
partitions, the codec, the metrics (the user's sink teed with the history
recorder), the tracing observer, the registry of event types, and the parts
the service delegates to. Building opens no connection and starts no task:
that is ``start()``'s job.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from .codec import Codec
from .events import EventTypes
from .metrics import ServiceMetrics
from .observer import Observer
from .operations.batches import Batches
from .operations.dependencies import Dependencies
from .operations.enqueueing import Enqueuer
from .operations.groups import Groups, PendingGroups
from .operations.results import ResultReader
from .options import Options
from .partitions.routing import Router
from .runtime.history import HistoryRecorder
from .runtime.runtime import Runtime
from .schedules.api import Schedules
from .storage import connect
from .storage.store import Store
from .views.browsing import Browser
from .views.inspection import Inspector
from .views.searching import Finder

__all__ = ["Parts", "wire"]


@dataclass(frozen=True, slots=True)
class Parts:
    """What one :class:`~delayq.EventService` is made of."""

    options: Options
    """The validated options."""
    store: Store
    """The Redis side of every operation."""
    router: Router
    """Operations spread over the shards of a partitioned type."""
    types: EventTypes
    """The event types the service has met."""
    groups: Groups
    """Delivery group operations."""
    inspector: Inspector
    """Lookups and counts."""
    browser: Browser
    """The dashboard's views and actions."""
    finder: Finder
    """The ready list and the searches (ids by prefix, dead letters by error text)."""
    enqueuer: Enqueuer
    """The producers' operations."""
    runtime: Runtime
    """The loops and the lifecycle."""
    schedules: Schedules
    """Recurring schedules."""
    results: ResultReader
    """Kept results (``results=`` types)."""
    dependencies: Dependencies
    """Children's enqueues (``after=[...]``)."""
    batches: Batches
    """Batches: opening, adding members, reading (docs/WORKFLOWS.md, "Batches")."""


def wire(clients: connect.Clients, options: dict[str, Any], service: object) -> Parts:
    """Check ``options`` and the clients; build the parts of ``service`` (which the outbox
    relay, if any, gets when it starts)."""
    opts = Options.build(**options)
    redis, blocking = clients.commands, clients.blocking
    connect.check_client(redis)
    store = Store(
        redis,
        opts.prefix,
        blocking=blocking,
        min_replicas=opts.min_replicas,
        replica_timeout_ms=opts.replica_timeout_ms,
    )
    router = Router(store)
    codec = Codec(opts.serializer, opts.max_payload_bytes)
    # the history recorder sees every metric; the user's sink sees them unchanged
    history = HistoryRecorder() if opts.history_interval else None
    metrics = ServiceMetrics(opts.metrics, history)
    observer = Observer(opts.tracing)
    types = EventTypes(store.types.declare)
    pending = PendingGroups(store)  # a running service's new groups (see delayq.operations.groups)
    schedules = Schedules(store, codec, types, metrics, observer)
    enqueuer = Enqueuer(store, router, codec, observer, metrics, types, pending)
    dependencies = Dependencies(store, router, types, traced=opts.tracing is not None)
    batches = Batches(store, types, enqueuer, dependencies)
    runtime = Runtime(
        store,
        opts,
        pending=pending,
        codec=codec,
        observer=observer,
        metrics=metrics,
        history=history,
        polling_timeout=connect.block_time(opts.polling_timeout, blocking or redis),
        owned=clients.owned,
        watch=clients.watch,
        outbox=None if opts.outbox is None else functools.partial(opts.outbox, service),
    )
    runtime.batches = batches
    return Parts(
        options=opts,
        store=store,
        router=router,
        types=types,
        groups=Groups(store, 1 + opts.retry_attempts),
        inspector=Inspector(store, router, codec, types),
        browser=Browser(store, router),
        finder=Finder(store, codec, types),
        enqueuer=enqueuer,
        runtime=runtime,
        schedules=schedules,
        results=ResultReader(store, router),
        dependencies=dependencies,
        batches=batches,
    )
