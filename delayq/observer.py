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
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol, runtime_checkable

from .context import Delivery
from .metrics import FOLD_EVERY, Metrics, ServiceMetrics

__all__ = ["FireSpans", "HandlerRun", "Observer", "RunHooks", "Tracing"]

TIMEOUT_PREFIX = "HandlerTimeout:"
CANCELLED = "Cancelled: the handler was cancelled (the service is stopping)"


def run_outcome(failure: str | None) -> str:
    """The ``outcome`` label of a handler run: success, timeout, cancelled or failure."""
    if failure is None:
        return "success"
    if failure is CANCELLED:
        return "cancelled"
    if failure.startswith(TIMEOUT_PREFIX):
        return "timeout"
    return "failure"


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
        self.context_without_span: (
            Callable[[Mapping[str, str] | None], dict[str, str] | None] | None
        )
        """The tracing's ``context_without_span`` when it has one (:class:`delayq.otel.OTelTracing`
        does): the context an enqueue stores when it gets no span, or ``None`` when it does
        (then :meth:`sending` opens it)."""
        quick = getattr(tracing, "context_without_span", None)
        self.context_without_span = quick if callable(quick) else None

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

    def bind(self, type_name: str, metrics: ServiceMetrics) -> RunHooks:
        """The hooks of one consumer of ``type_name`` reporting to ``metrics``: what
        :meth:`started` and :meth:`finished` do, with the metrics bound once."""
        return RunHooks(self.tracing, type_name, metrics)

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
        outcome = run_outcome(failure)
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


_UNBOUND: Any = object()


class RunHooks:
    """:meth:`Observer.started` and :meth:`Observer.finished` bound to one consumer.

    Each figure is bound to its labelled series on first use (the series appear
    when they did before: at the first event), so a handler run makes one call
    per figure instead of three or four (the view, the sink, its lookup), and
    what :meth:`started` hands to :meth:`finished` is a tuple, not an object.
    """

    __slots__ = (
        "_durations",
        "_e2d",
        "_fold",
        "_handled",
        "_handling",
        "_late",
        "_late_gauge",
        "_metrics",
        "_runs_to_fold",
        "_type",
        "tracing",
    )

    def __init__(self, tracing: Tracing | None, type_name: str, metrics: ServiceMetrics):
        self.tracing = tracing
        self._handling = None if tracing is None else tracing.handling
        self._handled = None if tracing is None else tracing.handled
        self._type = type_name
        self._metrics = metrics
        reports = metrics.reports
        self._late_gauge: Any = _UNBOUND if reports else None
        self._late: Any = _UNBOUND if reports else None
        self._e2d: Any = _UNBOUND if reports else None
        self._durations: dict[str, Any] | None = {} if reports else None
        self._fold = metrics.fold
        self._runs_to_fold = FOLD_EVERY

    def started(self, delivery: Delivery) -> tuple[float, Any]:
        """As :meth:`Observer.started`: record the lateness, open the span; returns what
        :meth:`finished` takes (the start time and the tracing's state)."""
        due_ms = delivery.due_ms  # Delivery.lateness_ms, without the property's call
        if due_ms is not None and self._late is not None:
            lateness_ms = delivery.claimed_us / 1000 - due_ms
            gauge, late = self._late_gauge, self._late
            if late is _UNBOUND:
                metrics, name = self._metrics, self._type
                gauge = self._late_gauge = metrics.bind_gauge("lateness_ms", name)
                late = self._late = metrics.bind_observe("lateness", name)
            if gauge is not None:
                gauge(lateness_ms)
            if late is not None:
                late(lateness_ms / 1000 if lateness_ms > 0 else 0.0)
        handling = self._handling
        return time.perf_counter(), None if handling is None else handling(delivery)

    def finished(
        self,
        delivery: Delivery,
        run: tuple[float, Any],
        failure: str | None,
        error: BaseException | None = None,
    ) -> None:
        """As :meth:`Observer.finished`: ``run`` is what :meth:`started` returned,
        ``error`` the exception the handler raised, if any."""
        started, span = run
        elapsed = time.perf_counter() - started
        outcome = "success" if failure is None else run_outcome(failure)
        durations = self._durations
        if durations is not None:
            try:
                duration = durations[outcome]
            except KeyError:
                duration = durations[outcome] = self._metrics.bind_observe(
                    "handler_duration", self._type, outcome
                )
            if duration is not None:
                duration(elapsed)
            enqueued_ms = delivery.enqueued_ms
            if failure is None and enqueued_ms:
                e2d = self._e2d
                if e2d is _UNBOUND:
                    e2d = self._e2d = self._metrics.bind_observe("enqueue_to_done", self._type)
                if e2d is not None:
                    # the producer's clock against ours: hosts' clocks must agree (NTP)
                    done = time.time() - enqueued_ms / 1000
                    e2d(done if done > 0 else 0.0)
            if self._fold is not None:  # the sink keeps observations until folded
                left = self._runs_to_fold - 1
                if left:
                    self._runs_to_fold = left
                else:
                    self._runs_to_fold = FOLD_EVERY
                    self._fold()
        if span is not None and self._handled is not None:
            self._handled(span, outcome, failure, error)
