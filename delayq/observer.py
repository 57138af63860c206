"""What the service reports around each enqueue and each handler run.

One :class:`Observer` per service, shared by its consumers: it times handler
runs and records the durations through the metrics sink (``observe``), and,
when tracing is on, opens and closes the spans of a :class:`Tracing`
implementation (:mod:`delayq.otel` has the OpenTelemetry one). It sends
nothing to Redis: everything it reports comes from what the consumer already
has in hand.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol, runtime_checkable

from .context import Delivery
from .metrics import Metrics

__all__ = ["FireSpans", "HandlerRun", "Observer", "Tracing"]

TIMEOUT_PREFIX = "HandlerTimeout:"
CANCELLED = "Cancelled: the handler was cancelled (the service is stopping)"


@runtime_checkable
class Tracing(Protocol):
    """Span hooks around enqueues and handler runs (see :mod:`delayq.otel`).

    An implementation may also have ``firing(type_name, fires, trigger)`` returning a
    :class:`FireSpans` for schedule fires (``OTelTracing`` has); without it each fire
    gets a ``sending`` span (see :meth:`Observer.firing`).
    """

    def sending(
        self,
        type_names: Sequence[str],
        event_id: str | None,
        count: int,
        context: Mapping[str, str] | None,
    ) -> AbstractContextManager[Mapping[str, str] | None]:
        """Open a span around an enqueue of ``count`` events; yield the context to store.

        ``event_id`` is given for a single event. The yielded mapping is
        ``context`` with the propagation keys added (or ``context`` unchanged).
        """

    def handling(self, delivery: Delivery) -> Any:
        """Open the span of one handler run (current until :meth:`handled`); return its state."""

    def handled(
        self, state: Any, outcome: str, failure: str | None, error: BaseException | None
    ) -> None:
        """Close the span opened by :meth:`handling`, with the run's outcome."""


class FireSpans(Protocol):
    """The send spans of a batch of schedule fires (see :meth:`Observer.firing`)."""

    carriers: Sequence[Mapping[str, str] | None]
    """Per fire, the propagation keys to store in its event context (or None)."""

    def end(self, outcomes: Sequence[str] | None, error: BaseException | None) -> None:
        """End the spans: each fire's outcome (``fired``, ``skipped``...), or the error
        that failed the whole batch."""


class _SendingEach:
    """Fire spans through a :class:`Tracing` that has no ``firing`` hook: one ``sending``
    span per fire (as one enqueue each), ended before the fires are written."""

    def __init__(self, tracing: Tracing, type_name: str, fires: Sequence[tuple[str, str, int]]):
        carriers: list[Mapping[str, str] | None] = []
        for event_id, _, _ in fires:
            with tracing.sending((type_name,), event_id, 1, None) as carrier:
                carriers.append(carrier)
        self.carriers: Sequence[Mapping[str, str] | None] = carriers

    def end(self, outcomes: Sequence[str] | None, error: BaseException | None) -> None:
        """Nothing left to end."""


class HandlerRun:
    """One handler run in progress, as the observer tracks it."""

    __slots__ = ("delivery", "error", "metrics", "span", "started")

    def __init__(self, delivery: Delivery, metrics: Metrics, started: float, span: Any):
        self.delivery = delivery
        self.metrics = metrics
        self.started = started
        self.span = span
        self.error: BaseException | None = None
        """The exception the handler raised, if any (set by the consumer)."""


class Observer:
    """Times handler runs and drives the tracing hooks; the consumers call it."""

    def __init__(self, tracing: Tracing | None = None):
        self.tracing = tracing

    # -- enqueue -------------------------------------------------------------------

    def sending(
        self, event: Any, context: Mapping[str, str] | None
    ) -> AbstractContextManager[Mapping[str, str] | None]:
        """The producer span of one enqueue (a no-op without tracing); yields the context to store.

        ``event`` is not validated yet: the enqueue inside the span does that.
        """
        if self.tracing is None:
            return nullcontext(context)
        name = getattr(type(event), "event_name", "")
        return self.tracing.sending((name,), str(getattr(event, "id", "")), 1, context)

    @contextmanager
    def sending_many(
        self, type_names: Sequence[str], count: int, context: Mapping[str, str] | None
    ) -> Iterator[Mapping[str, str] | None]:
        """The producer span of an ``enqueue_many`` call (one span for the call)."""
        if self.tracing is None or not count:
            yield context
            return
        with self.tracing.sending(sorted(set(type_names)), None, count, context) as stored:
            yield stored

    def firing(
        self, type_name: str, fires: Sequence[tuple[str, str, int]], *, trigger: bool = False
    ) -> FireSpans | None:
        """The producer spans of schedule fires ``(event id, schedule name, slot ms)`` about
        to be written in one call (None without tracing: fires then cost nothing more).

        A tracing with a ``firing`` hook (:class:`delayq.otel.OTelTracing`) gives each
        fire a span naming its schedule and slot; any other gets one ``sending`` span per
        fire. ``trigger``: a manual fire (its slot is the trigger time).
        """
        if self.tracing is None:
            return None
        hook = getattr(self.tracing, "firing", None)
        if hook is not None:
            spans: FireSpans = hook(type_name, fires, trigger)
            return spans
        return _SendingEach(self.tracing, type_name, fires)

    # -- handler runs ----------------------------------------------------------------

    def started(self, delivery: Delivery, metrics: Metrics) -> HandlerRun:
        """A handler is about to run ``delivery``: record its lateness in ``metrics`` (the
        sink as the delivery's group reports to it), open its span."""
        lateness_ms = delivery.lateness_ms
        if lateness_ms is not None:
            metrics.gauge("lateness_ms", lateness_ms, event_type=delivery.event_type)
            metrics.observe(
                "lateness", max(0.0, lateness_ms / 1000), event_type=delivery.event_type
            )
        span = None if self.tracing is None else self.tracing.handling(delivery)
        return HandlerRun(delivery, metrics, time.perf_counter(), span)

    def finished(self, run: HandlerRun, failure: str | None) -> None:
        """The handler of ``run`` returned (``failure`` None) or failed: record and close."""
        elapsed = time.perf_counter() - run.started
        delivery = run.delivery
        if failure is None:
            outcome = "success"
        elif failure.startswith(TIMEOUT_PREFIX):
            outcome = "timeout"
        elif failure is CANCELLED:
            outcome = "cancelled"
        else:
            outcome = "failure"
        metrics = run.metrics
        metrics.observe(
            "handler_duration", elapsed, event_type=delivery.event_type, outcome=outcome
        )
        if failure is None and delivery.enqueued_ms:
            # the producer's clock against ours: hosts' clocks must agree (NTP)
            metrics.observe(
                "enqueue_to_done",
                max(0.0, time.time() - delivery.enqueued_ms / 1000),
                event_type=delivery.event_type,
            )
        if run.span is not None and self.tracing is not None:
            self.tracing.handled(run.span, outcome, failure, run.error)
