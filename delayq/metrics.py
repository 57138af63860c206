"""The metrics interface: counters, gauges and durations the service reports.

Pass any object with ``increment``, ``gauge`` and ``observe`` methods as
``metrics=`` to feed Prometheus (:mod:`delayq.prometheus` ships one), StatsD or
OpenTelemetry. A sink written before ``observe`` existed (only ``increment``
and ``gauge``) still works: the service wraps it and drops the durations.

Names reported:

counters: ``enqueued``, ``kept``, ``replaced``, ``cancelled``, ``moved``,
``delivered``, ``succeeded``, ``failed``, ``retried``, ``dead_lettered``,
``decode_errors``, ``leases_lost``, ``stale_outcomes`` (a success's ack or a
failure's record that changed nothing: the lease had gone), ``redis_errors``,
``scheduler_takeovers`` (the scheduler lock taken from a leader that went silent);
recurring schedules
(:mod:`delayq.schedules`): ``schedule_fires``, ``schedule_skipped`` (by the
overlap policy), ``schedule_catch_up`` (fired over a second after the slot),
``schedule_missed`` (passed over by the catch-up policy), ``schedule_triggers``;
batches (docs/WORKFLOWS.md, "Batches"): ``batch_completions_ignored`` (members'
completions the relay handed to a batch already done or removed: they changed nothing)

gauges: ``in_flight`` (handlers running in this process), ``concurrency`` (the
handler's slots in this process: set when a handler is added, 0 when it is
removed), ``lateness_ms`` (of the latest delivery)

flow control (types with limits or paused, see docs/FLOW.md): counter
``throttled`` (claims held back), ``observe("throttled_time", seconds,
outcome=paused|concurrency|rate)`` (a consumer's wait), gauges ``paused``,
``fleet_in_flight`` and ``concurrency_limit``

durations (``observe``, in seconds): ``lateness`` (due time → claim, Redis's
clock), ``handler_duration`` (with ``outcome`` ``success``, ``failure``,
``timeout`` or ``cancelled``), ``enqueue_to_done`` (enqueue → successful end of the handler),
``schedule_lag`` (a schedule slot's nominal time → its fire, Redis's clock)

When a handler is added, each counter in :data:`DELIVERY_COUNTERS` is reported
once with the value 0 (for its type and group), so a sink that exports series
(Prometheus) has them from the start and ``increase()`` sees the first event.

Every call carries ``event_type`` (the wire name, or ``""`` for the scheduler).
Calls made for a named delivery group (``add_handler(..., group="audit")``)
also carry ``group="audit"`` when the sink's methods accept a ``group``
keyword; a sink without it gets ``event_type="<type>:<group>"`` instead. The
default group's calls never carry it.

What runs per event (a producer's outcome counters, a consumer's durations and
gauges) is bound once per type: a sink may offer ``bind_increment(name, *,
event_type[, group])``, ``bind_gauge(...)`` and ``bind_observe(name, *,
event_type, outcome[, group])``, each returning a one-argument callable that
records a value for those labels (or ``None`` for a name it ignores);
:class:`delayq.prometheus.PrometheusMetrics` does. Any other sink gets its
``increment``/``gauge``/``observe`` called with the same arguments as before.
A bound ``observe`` may only keep the value (PrometheusMetrics' appends it to a
list): a sink that also has ``fold()`` gets it called from the service's event
loop at least every :data:`FOLD_EVERY` handler runs of each consumer, to fold
what was kept.

This module is the one place that adapts sinks: :func:`as_metrics` checks the
user's, and :class:`ServiceMetrics` is what the service's parts report to (the
user's sink teed with the history recorder, one view per delivery group). It is one
job over 400 lines: the names above, the sink's interface and its one adapter.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "DELIVERY_COUNTERS",
    "FOLD_EVERY",
    "InMemoryMetrics",
    "Metrics",
    "NoopMetrics",
    "ServiceMetrics",
    "as_metrics",
]

DELIVERY_COUNTERS: tuple[str, ...] = (
    "delivered",
    "succeeded",
    "failed",
    "retried",
    "dead_lettered",
    "decode_errors",
    "leases_lost",
    "stale_outcomes",
    "redis_errors",
)
"""The counters a handler's consumer moves: reported as 0 when the handler is added."""

FOLD_EVERY = 1024
"""A consumer calls its sink's ``fold()`` (when it has one) every this many handler runs."""


@runtime_checkable
class Metrics(Protocol):
    """What a metrics sink provides."""

    def increment(self, name: str, value: int = 1, *, event_type: str = "") -> None:
        """Add ``value`` to the counter ``name``."""

    def gauge(self, name: str, value: float, *, event_type: str = "") -> None:
        """Set the gauge ``name`` to ``value``."""

    def observe(
        self, name: str, seconds: float, *, event_type: str = "", outcome: str = ""
    ) -> None:
        """Record one duration of ``seconds`` under ``name`` (a histogram, a summary...)."""


class NoopMetrics:
    """The default sink: records nothing."""

    def increment(self, name: str, value: int = 1, *, event_type: str = "") -> None:
        """Do nothing."""

    def gauge(self, name: str, value: float, *, event_type: str = "") -> None:
        """Do nothing."""

    def observe(
        self, name: str, seconds: float, *, event_type: str = "", outcome: str = ""
    ) -> None:
        """Do nothing."""


class _WithoutObserve:
    """A sink with only ``increment`` and ``gauge``: durations are dropped.

    Attribute reads go to the wrapped sink, so ``service.options.metrics.x``
    still finds what the user's object has.
    """

    def __init__(self, sink: Any):
        self.wrapped = sink
        self.increment = sink.increment
        self.gauge = sink.gauge

    def observe(
        self, name: str, seconds: float, *, event_type: str = "", outcome: str = ""
    ) -> None:
        """Do nothing: the wrapped sink has no ``observe``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


def as_metrics(sink: object) -> Metrics:
    """``sink`` itself when it has all three methods; wrapped when it lacks ``observe``.

    Raises ``TypeError`` when ``increment`` or ``gauge`` is missing.
    """
    if not (callable(getattr(sink, "increment", None)) and callable(getattr(sink, "gauge", None))):
        raise TypeError(
            "metrics must have increment(name, value, *, event_type) and "
            "gauge(name, value, *, event_type) methods (and optionally "
            "observe(name, seconds, *, event_type, outcome))"
        )
    if callable(getattr(sink, "observe", None)):
        return sink  # type: ignore[return-value]
    return _WithoutObserve(sink)


def _takes_group(method: Any) -> bool:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "group" or p.kind is p.VAR_KEYWORD for p in params)


class ServiceMetrics:
    """What the service's parts report to: the user's sink, teed with a recorder.

    ``sink`` is the user's (checked by :func:`as_metrics`); ``recorder`` (the
    history recorder, or None) sees every call too. :meth:`for_group` gives
    the view a named delivery group's consumer reports through: the user's
    sink gets ``group=<name>`` when its method accepts it, else
    ``event_type="<type>:<group>"`` (type names hold no ``:``); the recorder
    always gets the folded label.
    """

    __slots__ = (
        "_by_group",
        "_recorder",
        "_sink",
        "_sink_view",
        "_takes",
        "fold",
        "group",
        "reports",
    )

    def __init__(self, sink: Metrics, recorder: Metrics | None = None, group: str | None = None):
        self._sink = sink
        self._recorder = recorder
        self.group = group
        """The named delivery group of this view (None: the default group)."""
        self.reports = not isinstance(sink, NoopMetrics)
        """False when the user gave no sink: per-event figures that only the sink would
        get (durations, ``in_flight`` after each handler) need not be computed."""
        fold = getattr(sink, "fold", None) if self.reports else None
        self.fold: Callable[[], None] | None = fold if callable(fold) else None
        """The sink's ``fold()``, if it has one: what its bound observers kept goes into
        its figures (see the module's docs)."""
        self._takes = (
            _takes_group(sink.increment),
            _takes_group(sink.gauge),
            _takes_group(sink.observe),
        )
        self._by_group: dict[str, ServiceMetrics] = {}
        self._sink_view: ServiceMetrics | None = None

    def label(self, event_type: str) -> str:
        """The label the recorder gets for ``event_type`` from this view (``type:group``
        for a named group)."""
        return event_type if self.group is None else f"{event_type}:{self.group}"

    def handler_added(self, event_type: str, concurrency: int) -> None:
        """A handler of ``event_type`` was added to this view's group: give the user's sink
        a zero of each :data:`DELIVERY_COUNTERS` and the ``concurrency`` gauge (the history
        recorder records nothing for them)."""
        if not self.reports:
            return
        view = self.sink_only()
        for name in DELIVERY_COUNTERS:
            view.increment(name, 0, event_type=event_type)
        view.gauge("concurrency", concurrency, event_type=event_type)

    def handler_removed(self, event_type: str) -> None:
        """The handler of ``event_type`` in this view's group has stopped: no slots left."""
        if self.reports:
            self.sink_only().gauge("concurrency", 0, event_type=event_type)

    def sink_only(self) -> ServiceMetrics:
        """This view without the recorder: for figures the recorder is given another way
        (a consumer counts lateness straight into :meth:`HistoryRecorder.lateness_row
        <delayq.runtime.history.HistoryRecorder.lateness_row>`)."""
        if self._recorder is None:
            return self
        view = self._sink_view
        if view is None:
            view = self._sink_view = ServiceMetrics(self._sink, None, self.group)
        return view

    def for_group(self, group: str | None) -> ServiceMetrics:
        """The view of a named delivery group (this one for ``None``, the default group)."""
        if group is None:
            return self
        view = self._by_group.get(group)
        if view is None:
            view = self._by_group[group] = ServiceMetrics(self._sink, self._recorder, group)
        return view

    # -- bound forms: what a consumer or a producer calls per event -------------------------
    #
    # A per-event figure goes through several calls (this view, the sink's method, its
    # lookup of the labelled series); bound once per type, it is one call. A sink with
    # ``bind_increment`` / ``bind_gauge`` / ``bind_observe`` (PrometheusMetrics) gives its
    # series' own method; any other sink gets its generic method with the labels bound.

    def bind_increment(self, name: str, event_type: str) -> Callable[[int], None] | None:
        """``increment(name, value, event_type=event_type)`` as a one-argument callable
        (``None`` when neither the sink nor the recorder would record it)."""
        return self._bind(0, name, event_type, {})

    def bind_gauge(self, name: str, event_type: str) -> Callable[[float], None] | None:
        """``gauge(name, value, event_type=event_type)`` as a one-argument callable (or None)."""
        return self._bind(1, name, event_type, {})

    def bind_observe(
        self, name: str, event_type: str, outcome: str = ""
    ) -> Callable[[float], None] | None:
        """``observe(name, seconds, event_type=event_type, outcome=outcome)`` as a one-argument
        callable (or None)."""
        return self._bind(2, name, event_type, {"outcome": outcome} if outcome else {})

    def _bind(
        self, kind: int, name: str, event_type: str, extra: dict[str, str]
    ) -> Callable[[Any], None] | None:
        sink: Any = self._sink
        method_name = ("increment", "gauge", "observe")[kind]
        group = self.group
        label = event_type if group is None else f"{event_type}:{group}"
        kwargs: dict[str, str] = {"event_type": event_type, **extra}
        if group is not None:
            if self._takes[kind]:
                kwargs["group"] = group
            else:
                kwargs["event_type"] = label
        to_sink: Callable[[Any], None] | None = None
        if self.reports:
            binder = getattr(sink, f"bind_{method_name}", None)
            if callable(binder):
                to_sink = binder(name, **kwargs)
            else:
                to_sink = partial(getattr(sink, method_name), name, **kwargs)
        recorder = self._recorder
        if recorder is None:
            return to_sink
        recorder_binder = getattr(recorder, f"bind_{method_name}", None)
        to_recorder: Callable[[Any], None] | None
        if callable(recorder_binder):  # the history recorder: None for what it ignores
            to_recorder = recorder_binder(name, event_type=label, **extra)
            if to_recorder is None:
                return to_sink
        else:
            to_recorder = partial(getattr(recorder, method_name), name, event_type=label, **extra)
        if to_sink is None:
            return to_recorder
        return _Tee(to_sink, to_recorder)

    def increment(self, name: str, value: int = 1, *, event_type: str = "") -> None:
        """Add ``value`` to the counter ``name``."""
        self._report(0, name, value, event_type, {})

    def gauge(self, name: str, value: float, *, event_type: str = "") -> None:
        """Set the gauge ``name``."""
        self._report(1, name, value, event_type, {})

    def observe(
        self, name: str, seconds: float, *, event_type: str = "", outcome: str = ""
    ) -> None:
        """Record one duration."""
        self._report(2, name, seconds, event_type, {"outcome": outcome})

    def _report(
        self, kind: int, name: str, value: float, event_type: str, extra: dict[str, str]
    ) -> None:
        method = ("increment", "gauge", "observe")[kind]
        group = self.group
        label = event_type if group is None else f"{event_type}:{group}"
        if group is None:
            getattr(self._sink, method)(name, value, event_type=event_type, **extra)
        elif self._takes[kind]:
            getattr(self._sink, method)(name, value, event_type=event_type, group=group, **extra)
        else:
            getattr(self._sink, method)(name, value, event_type=label, **extra)
        if self._recorder is not None:
            getattr(self._recorder, method)(name, value, event_type=label, **extra)


class _Tee:
    """Two bound calls as one (the user's sink and the history recorder)."""

    __slots__ = ("_first", "_second")

    def __init__(self, first: Callable[[Any], None], second: Callable[[Any], None]):
        self._first = first
        self._second = second

    def __call__(self, value: Any) -> None:
        self._first(value)
        self._second(value)


class InMemoryMetrics:
    """Keeps counters, gauges and duration totals in dicts; handy in tests and the demo.

    ``counters`` sums every group of a type; ``group_counters`` keeps the
    calls made for named groups by ``(name, event_type, group)``.
    """

    def __init__(self) -> None:
        self.counters: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.gauges: dict[tuple[str, str], float] = {}
        self.group_counters: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        # (name, event_type, outcome) -> [count, sum of seconds, max seconds]
        self.durations: defaultdict[tuple[str, str, str], list[float]] = defaultdict(
            lambda: [0, 0.0, 0.0]
        )

    def increment(
        self, name: str, value: int = 1, *, event_type: str = "", group: str = ""
    ) -> None:
        """Add ``value`` to the counter ``(name, event_type)`` (and its group's)."""
        self.counters[name, event_type] += value
        if group:
            self.group_counters[name, event_type, group] += value

    def gauge(self, name: str, value: float, *, event_type: str = "", group: str = "") -> None:
        """Set the gauge ``(name, event_type)``, or ``(name, "<type>:<group>")`` for a group."""
        self.gauges[name, f"{event_type}:{group}" if group else event_type] = value

    def observe(
        self, name: str, seconds: float, *, event_type: str = "", outcome: str = ""
    ) -> None:
        """Add one duration to ``durations[name, event_type, outcome]`` (count, sum, max)."""
        entry = self.durations[name, event_type, outcome]
        entry[0] += 1
        entry[1] += seconds
        if seconds > entry[2]:
            entry[2] = seconds

    def total(self, name: str) -> int:
        """The counter ``name`` summed over event types."""
        return sum(v for (n, _), v in self.counters.items() if n == name)

    def observed(self, name: str, outcome: str | None = None) -> int:
        """How many durations ``name`` (of ``outcome``, if given) were recorded, over all types."""
        return int(
            sum(
                v[0]
                for (n, _, o), v in self.durations.items()
                if n == name and (outcome is None or o == outcome)
            )
        )
