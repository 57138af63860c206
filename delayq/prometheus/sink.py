"""``PrometheusMetrics``: the service's counters, gauges and durations as Prometheus metrics.

One job over 400 lines: the tables of what is exported (names, help texts, buckets, one
entry a line) and the sink that registers and feeds exactly those.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from prometheus_client import REGISTRY, CollectorRegistry

from ..keyspace.groups import DEFAULT_GROUP, labelled
from ..metrics import DELIVERY_COUNTERS, FOLD_EVERY
from .local import LocalCollector, LocalCounter, LocalGauge, LocalHistogram

__all__ = ["DURATION_BUCKETS", "LONG_BUCKETS", "PrometheusMetrics"]

log = logging.getLogger("delayq.prometheus")

DURATION_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    900,
    1800,
    3600,
    3 * 3600,
    6 * 3600,
)
"""Buckets of ``lateness_seconds`` and ``handler_duration_seconds``: 1 ms to 6 h.

Fine below a second, where a healthy queue's lateness and most handlers sit;
coarse from a minute to hours, where a backlog or a stuck handler shows.
"""

LONG_BUCKETS: tuple[float, ...] = (
    0.01,
    0.1,
    0.5,
    1,
    5,
    10,
    30,
    60,
    300,
    900,
    1800,
    3600,
    3 * 3600,
    6 * 3600,
    12 * 3600,
    86400,
    3 * 86400,
    7 * 86400,
)
"""Buckets of ``enqueue_to_done_seconds``: 10 ms to 7 days (it includes the chosen delay)."""

# service counter name -> (metric, help, outcome label value or None)
_COUNTERS: dict[str, tuple[str, str, str | None]] = {
    "enqueued": ("enqueued", "Events passed to enqueue, by outcome", "new"),
    "kept": ("enqueued", "", "kept"),
    "replaced": ("enqueued", "", "replaced"),
    "cancelled": ("cancelled", "Events removed by cancel() (pending or running)", None),
    "moved": ("moved", "Due events the scheduler moved to their ready list", None),
    "delivered": ("delivered", "Deliveries claimed by this process (each attempt counts)", None),
    "succeeded": ("succeeded", "Handler runs that succeeded and were acknowledged", None),
    "failed": ("failed", "Handler runs that failed, and events that did not decode", None),
    "retried": ("retried", "Failed events scheduled for another attempt", None),
    "dead_lettered": (
        "dead_lettered",
        "Events moved to dead letters (attempts used up, undecodable, or a last lease expired)",
        None,
    ),
    "decode_errors": ("decode_errors", "Stored events that did not decode", None),
    "leases_lost": ("leases_lost", "Leases lost while a handler ran", None),
    "stale_outcomes": (
        "stale_outcomes",
        "Acks and failure records that changed nothing: the delivery's lease had gone",
        None,
    ),
    "redis_errors": ("redis_errors", "Redis calls that failed (then retried)", None),
    "scheduler_takeovers": (
        "scheduler_takeovers",
        "Scheduler locks this process took from a silent leader (events left overdue)",
        None,
    ),
    "schedule_fires": ("schedule_fires", "Slots of recurring schedules fired", None),
    "schedule_skipped": ("schedule_skipped", "Schedule slots skipped by the overlap policy", None),
    "schedule_catch_up": (
        "schedule_catch_up",
        "Schedule fires more than a second after their slot (catching up after an outage)",
        None,
    ),
    "schedule_missed": (
        "schedule_missed",
        "Schedule slots passed over by the catch-up policy",
        None,
    ),
    "schedule_triggers": (
        "schedule_triggers",
        "Manual fires of schedules (trigger_schedule)",
        None,
    ),
    "throttled": (
        "throttled",
        "Claims held back by flow limits (paused, fleet concurrency or rate; docs/FLOW.md)",
        None,
    ),
    "batch_completions_ignored": (
        "batch_completions_ignored",
        "Members' completions handed to a batch already done or removed (they changed nothing)",
        None,
    ),
}
# counters (metric names) a delivery group's consumer reports: they have a ``group`` label
# (a Redis error is the process's, not a group's)
_GROUP_COUNTERS = (frozenset(DELIVERY_COUNTERS) - {"redis_errors"}) | {"throttled"}
_HISTOGRAMS: dict[str, tuple[str, bool, bool]] = {
    # observe() name -> (help, has an outcome label, long buckets)
    "lateness": (
        "From an event's due time to its claim by a consumer (Redis's clock)",
        False,
        False,
    ),
    "handler_duration": ("How long handlers ran, by outcome", True, False),
    "schedule_lag": (
        "From a schedule slot's nominal time to its fire (Redis's clock)",
        False,
        False,
    ),
    "enqueue_to_done": (
        "From enqueue (or replace) to the successful end of the handler (producer's clock "
        "against the consumer's)",
        False,
        True,
    ),
    "throttled_time": (
        "How long consumers waited, held back by flow limits, by reason (paused, "
        "concurrency, rate): its _sum is the throttled time",
        True,
        False,
    ),
}
# gauges the service reports besides in_flight (labelled by event_type, "<type>:<group>"
# for a named group)
_GAUGE_DOCS: dict[str, str] = {
    "paused": "1 while a consumer finds its type (group) paused (docs/FLOW.md)",
    "fleet_in_flight": "Live leases of the type across the fleet, as its last held-back "
    "claim saw them (against concurrency_limit)",
    "concurrency_limit": "The fleet-wide concurrency limit of the type, as its last "
    "held-back claim saw it",
}
_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"


def _valid(name: str) -> bool:
    return re.fullmatch(_NAME, name) is not None


class PrometheusMetrics:
    """A metrics sink for ``EventService(metrics=...)`` that feeds prometheus-client.

    Registers its metrics in ``registry`` (default: prometheus-client's global
    ``REGISTRY``) under ``namespace``; see docs/OBSERVABILITY.md for each one.
    Counters are ``{namespace}_{name}_total`` labelled by ``event_type``
    (``enqueued_total`` also by ``outcome``: ``new``, ``kept``, ``replaced``);
    histograms are ``lateness_seconds``, ``handler_duration_seconds`` (by
    ``outcome``) and ``enqueue_to_done_seconds``; ``handlers_in_flight`` (busy)
    and ``handler_concurrency`` (capacity) are gauges. The metrics of deliveries
    (``delivered``, ``succeeded``, ``failed``, ``retried``, ``dead_lettered``,
    ``decode_errors``, ``leases_lost``, ``stale_outcomes``, the three histograms and
    both gauges)
    also have a ``group`` label: the delivery group (``default`` for handlers
    added without one). Every counter a handler moves exists with the value 0
    from ``add_handler`` on. One instance can serve several services of a
    process; a second instance on the same registry and namespace is refused
    by prometheus-client.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        namespace: str = "delayq",
        *,
        buckets: Sequence[float] = DURATION_BUCKETS,
        long_buckets: Sequence[float] = LONG_BUCKETS,
    ):
        if not _valid(namespace):
            raise ValueError(f"namespace must match {_NAME}, not {namespace!r}")
        self.registry = REGISTRY if registry is None else registry
        self.namespace = namespace
        self._buckets = tuple(buckets)
        self._long_buckets = tuple(long_buckets)
        # counters, histograms and gauges move once or more per event: kept locally (see
        # .local, no lock) and exported by one collector at scrape time
        self._local = LocalCollector()
        self._counters: dict[str, LocalCounter] = {}
        self._histograms: dict[str, LocalHistogram] = {}
        self._gauges: dict[str, LocalGauge] = {}
        # (name, event_type[, outcome]) -> the bound method of the labelled child: the hot
        # path is one dict lookup and one call
        self._inc: dict[tuple[str, str, str], Callable[[float], None]] = {}
        self._obs: dict[tuple[str, str, str, str], Callable[[float], None]] = {}
        self._set: dict[tuple[str, str, str], Callable[[float], None]] = {}
        for metric, doc, outcome in _COUNTERS.values():
            if metric not in self._counters:
                labels: tuple[str, ...] = ("event_type", "outcome") if outcome else ("event_type",)
                if metric in _GROUP_COUNTERS:
                    labels += ("group",)
                self._counters[metric] = self._add(
                    LocalCounter(f"{namespace}_{metric}", doc, labels)
                )
        for name in _HISTOGRAMS:
            self._histogram(name)
        self._gauges["in_flight"] = self._add(
            LocalGauge(
                f"{namespace}_handlers_in_flight",
                "Handlers running (or recording their outcome) in this process",
                ("event_type", "group"),
            )
        )
        self._gauges["concurrency"] = self._add(
            LocalGauge(
                f"{namespace}_handler_concurrency",
                "Handler slots (add_handler's concurrency) in this process: the capacity "
                "handlers_in_flight is busy out of",
                ("event_type", "group"),
            )
        )
        self.registry.register(self._local)

    def _add(self, metric: _Local) -> _Local:
        self._local.add(metric)
        return metric

    # -- the Metrics protocol ------------------------------------------------------------

    def increment(
        self, name: str, value: int = 1, *, event_type: str = "", group: str = DEFAULT_GROUP
    ) -> None:
        """Add ``value`` to the counter of ``name`` (of delivery group ``group``)."""
        try:
            inc = self._inc[name, event_type, group]
        except KeyError:
            inc = self._bind_counter(name, event_type, group)
        inc(value)

    def gauge(
        self, name: str, value: float, *, event_type: str = "", group: str = DEFAULT_GROUP
    ) -> None:
        """Set the gauge of ``name`` (``in_flight``; ``lateness_ms`` is left to the histogram)."""
        try:
            set_ = self._set[name, event_type, group]
        except KeyError:
            set_ = self._bind_gauge(name, event_type, group)
        set_(value)

    def observe(
        self,
        name: str,
        seconds: float,
        *,
        event_type: str = "",
        outcome: str = "",
        group: str = DEFAULT_GROUP,
    ) -> None:
        """Record one duration in the histogram ``{name}_seconds``."""
        try:
            obs = self._obs[name, event_type, outcome, group]
        except KeyError:
            obs = self._bind_histogram(name, event_type, outcome, group)
        obs(seconds)
        pending = getattr(obs, "__self__", None)  # the series' pending list (.local)
        if pending is not None and len(pending) >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """Fold the durations recorded since the last fold into the histograms' buckets.

        The bound observers (``bind_observe``) only append to a list; the service calls
        this from its event loop every :data:`~delayq.metrics.FOLD_EVERY` handler runs of
        a consumer, ``observe()`` when a list grows that long, and every scrape does.
        """
        for histogram in list(self._histograms.values()):
            histogram.fold()

    # -- bound forms: one call per event (delayq.metrics.ServiceMetrics.bind_*) -------------

    def bind_increment(
        self, name: str, *, event_type: str = "", group: str = DEFAULT_GROUP
    ) -> Callable[[int], None] | None:
        """:meth:`increment` of ``name`` with these labels, as a one-argument callable that
        adds its argument to the labelled series (``None`` when the name is ignored)."""
        inc = self._inc.get((name, event_type, group)) or self._bind_counter(
            name, event_type, group
        )
        return None if inc is _ignore else inc

    def bind_gauge(
        self, name: str, *, event_type: str = "", group: str = DEFAULT_GROUP
    ) -> Callable[[float], None] | None:
        """:meth:`gauge` of ``name`` with these labels, as a one-argument callable (``None``
        when the gauge is not exported, as ``lateness_ms``)."""
        set_ = self._set.get((name, event_type, group)) or self._bind_gauge(name, event_type, group)
        return None if set_ is _ignore else set_

    def bind_observe(
        self,
        name: str,
        *,
        event_type: str = "",
        outcome: str = "",
        group: str = DEFAULT_GROUP,
    ) -> Callable[[float], None] | None:
        """:meth:`observe` of ``name`` with these labels, as a one-argument callable
        (``None`` when the name is ignored)."""
        obs = self._obs.get((name, event_type, outcome, group)) or self._bind_histogram(
            name, event_type, outcome, group
        )
        return None if obs is _ignore else obs

    # -- binding labelled children ---------------------------------------------------------

    def _bind_counter(self, name: str, event_type: str, group: str) -> Callable[[float], None]:
        known = _COUNTERS.get(name)
        if known is not None:
            metric, _, outcome = known
            values: tuple[str, ...] = (event_type, outcome) if outcome else (event_type,)
            if metric in _GROUP_COUNTERS:
                values += (group,)
            inc = self._counters[metric].incrementer(*values)
        elif _valid(name):  # a counter this version does not know: export it as is
            unknown = self._counters.get(name)
            if unknown is None:
                unknown = self._counters[name] = self._add(
                    LocalCounter(
                        f"{self.namespace}_{name}", f"delayq counter {name}", ("event_type",)
                    )
                )
            inc = unknown.incrementer(_folded(event_type, group))
        else:
            log.debug("ignoring counter with an invalid name %r", name)
            return _ignore
        self._inc[name, event_type, group] = inc
        return inc

    def _bind_gauge(self, name: str, event_type: str, group: str) -> Callable[[float], None]:
        set_: Callable[[float], None] = _ignore
        if name == "lateness_ms":  # the lateness histogram says more than the latest value
            self._set[name, event_type, group] = set_
            return set_
        gauge = self._gauges.get(name)
        if gauge is None:
            if not _valid(name):
                log.debug("ignoring gauge with an invalid name %r", name)
                return _ignore
            gauge = self._gauges[name] = self._add(
                LocalGauge(
                    f"{self.namespace}_{name}",
                    _GAUGE_DOCS.get(name, f"delayq gauge {name}"),
                    ("event_type",),
                )
            )
        if name in ("in_flight", "concurrency"):
            set_ = gauge.setter(event_type, group)
        else:
            set_ = gauge.setter(_folded(event_type, group))
        self._set[name, event_type, group] = set_
        return set_

    def _histogram(self, name: str) -> tuple[LocalHistogram, bool]:
        """The histogram ``{name}_seconds`` and whether it has an ``outcome`` label."""
        doc, by_outcome, long = _HISTOGRAMS.get(name, (f"delayq duration {name}", True, True))
        histogram = self._histograms.get(name)
        if histogram is None:
            labels: tuple[str, ...] = ("event_type", "outcome") if by_outcome else ("event_type",)
            if name in _HISTOGRAMS:
                labels += ("group",)
            histogram = self._histograms[name] = self._add(
                LocalHistogram(
                    f"{self.namespace}_{name}_seconds",
                    doc,
                    labels,
                    self._long_buckets if long else self._buckets,
                )
            )
        return histogram, by_outcome

    def _bind_histogram(
        self, name: str, event_type: str, outcome: str, group: str
    ) -> Callable[[float], None]:
        if not _valid(name):
            log.debug("ignoring duration with an invalid name %r", name)
            return _ignore
        histogram, by_outcome = self._histogram(name)
        if name in _HISTOGRAMS:
            values: tuple[str, ...] = (event_type, group)
        else:
            values = (_folded(event_type, group),)
        if by_outcome:
            values = (values[0], outcome, *values[1:])
        obs = self._obs[name, event_type, outcome, group] = histogram.observer(*values)
        return obs


_Local = TypeVar("_Local", LocalCounter, LocalHistogram, LocalGauge)


def _folded(event_type: str, group: str) -> str:
    """The ``event_type`` label of a metric without a ``group`` label (one this version
    does not know): a named group folded in as ``type:group``, as ``ServiceMetrics`` does."""
    return labelled(event_type, group)


def _ignore(value: float) -> None:
    pass
