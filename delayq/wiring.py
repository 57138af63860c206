"""Wiring a service: its parts, built from its client(s) and keyword options.

:func:`wire` checks the options (:class:`~delayq.options.Options`) and the
client (:func:`delayq.connect.check_client`), then builds each part once and
hands it the others it works with: the store, the codec, the metrics sink
(the user's, teed with the history recorder), the tracing observer, the
registry of event types, and the parts the service delegates to. Building
opens no connection and starts no task: that is ``start()``'s job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import connect
from .codec import Codec
from .enqueueing import Enqueuer
from .events import EventTypes
from .groups import Groups
from .history import HistoryRecorder, TeeMetrics
from .inspection import Inspector
from .metrics import Metrics
from .observer import Observer
from .options import Options
from .routing import Router
from .runtime import Runtime
from .schedules.api import Schedules
from .store import Store

if TYPE_CHECKING:
    from .connect import Client

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
    metrics: Metrics
    """The user's metrics sink, teed with the history recorder."""
    types: EventTypes
    """The event types the service has met."""
    groups: Groups
    """Delivery group operations."""
    inspector: Inspector
    """Lookups by class or wire name."""
    enqueuer: Enqueuer
    """The enqueue operations."""
    runtime: Runtime
    """The loops and the lifecycle."""
    schedules: Schedules
    """Recurring schedules."""


def wire(redis: Client, blocking: Client | None, options: dict[str, Any]) -> Parts:
    """Check ``options`` and ``redis``; build the parts (``blocking``: BRPOP and pub/sub)."""
    opts = Options.build(**options)
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
    history = HistoryRecorder()
    metrics = TeeMetrics(opts.metrics, history)
    observer = Observer(metrics, opts.tracing)
    types = EventTypes(store.declare)
    schedules = Schedules(store, codec, types, metrics)
    return Parts(
        options=opts,
        store=store,
        router=router,
        metrics=metrics,
        types=types,
        groups=Groups(store, 1 + opts.retry_attempts),
        inspector=Inspector(store, codec, types),
        enqueuer=Enqueuer(store, router, codec, observer, metrics, types),
        runtime=Runtime(
            store,
            opts,
            codec=codec,
            observer=observer,
            metrics=metrics,
            history=history,
            polling_timeout=connect.block_time(opts.polling_timeout, blocking or redis),
        ),
        schedules=schedules,
    )
