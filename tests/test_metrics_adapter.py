"""metrics.ServiceMetrics: the one adapter between the service's parts and the user's sink."""

from __future__ import annotations

from typing import Any

from delayq.metrics import InMemoryMetrics, NoopMetrics, ServiceMetrics, as_metrics
from delayq.runtime.history import HistoryRecorder


class OldSink:
    """A sink from before groups and durations: increment and gauge only, no ``group``."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def increment(self, name: str, value: int = 1, *, event_type: str = "") -> None:
        self.calls.append(("increment", name, value, event_type))

    def gauge(self, name: str, value: float, *, event_type: str = "") -> None:
        self.calls.append(("gauge", name, value, event_type))


def test_a_named_group_is_folded_into_the_label_of_a_sink_without_group() -> None:
    sink = OldSink()
    recorder = HistoryRecorder()
    metrics = ServiceMetrics(as_metrics(sink), recorder)
    audit = metrics.for_group("audit")
    assert metrics.for_group(None) is metrics and metrics.for_group("audit") is audit
    metrics.increment("succeeded", event_type="t")
    audit.increment("succeeded", 2, event_type="t")
    audit.gauge("in_flight", 3, event_type="t")
    audit.observe("lateness", 0.004, event_type="t")  # dropped for the sink, kept by the recorder
    assert sink.calls == [
        ("increment", "succeeded", 1, "t"),
        ("increment", "succeeded", 2, "t:audit"),
        ("gauge", "in_flight", 3, "t:audit"),
    ]
    rows = recorder.take()
    assert rows["t"][0] == 1 and rows["t:audit"][0] == 2 and sum(rows["t:audit"][2:]) == 1


def test_a_sink_that_takes_group_gets_it_and_the_default_group_never_does() -> None:
    sink = InMemoryMetrics()
    metrics = ServiceMetrics(sink)  # no recorder (history_interval=0)
    metrics.increment("delivered", event_type="t")
    metrics.for_group("audit").increment("delivered", 5, event_type="t")
    metrics.for_group("audit").gauge("in_flight", 1, event_type="t")
    assert sink.counters["delivered", "t"] == 6
    assert dict(sink.group_counters) == {("delivered", "t", "audit"): 5}
    assert sink.gauges == {("in_flight", "t:audit"): 1}


def test_handler_added_gives_the_sink_zeros_and_the_recorder_nothing() -> None:
    sink = InMemoryMetrics()
    recorder = HistoryRecorder()
    metrics = ServiceMetrics(sink, recorder)
    metrics.for_group("audit").handler_added("t", 5)
    assert sink.group_counters["dead_lettered", "t", "audit"] == 0
    assert ("dead_lettered", "t", "audit") in sink.group_counters
    assert sink.gauges["concurrency", "t:audit"] == 5
    assert recorder.take() == {}
    metrics.for_group("audit").handler_removed("t")
    assert sink.gauges["concurrency", "t:audit"] == 0
    # without a sink of the user's, nothing at all
    quiet = ServiceMetrics(as_metrics(NoopMetrics()), recorder)
    assert not quiet.reports
    quiet.handler_added("t", 5)
    assert recorder.take() == {}


def test_a_lateness_row_is_taken_with_the_recorder_and_zeroed_in_place() -> None:
    from delayq.runtime.history import CANCELLED_COLUMN, LATENESS_BOUNDS_MS, LATENESS_ROW_START

    recorder = HistoryRecorder()
    row = recorder.lateness_row("t:audit")
    assert recorder.lateness_row("t:audit") is row
    row[LATENESS_ROW_START + 3] += 2
    recorder.increment("succeeded", 2, event_type="t:audit")
    taken = recorder.take()
    assert taken["t:audit"][0] == 2 and taken["t:audit"][LATENESS_ROW_START + 3] == 2
    # handled, failed, the lateness buckets (one past the last bound), cancelled
    buckets = len(LATENESS_BOUNDS_MS) + 1
    assert row == [0] * len(row) and len(row) == LATENESS_ROW_START + buckets + 1
    assert CANCELLED_COLUMN == len(row) - 1
    assert recorder.take() == {}


def test_bound_calls_report_what_the_generic_calls_report() -> None:
    """ServiceMetrics.bind_* (what a consumer or producer calls per event, issue 20): the
    same calls reach the sink and the recorder as through increment/gauge/observe."""
    from prometheus_client import CollectorRegistry

    from delayq.prometheus import PrometheusMetrics

    def run(bound: bool, sink: Any, recorder: HistoryRecorder) -> None:
        metrics = ServiceMetrics(as_metrics(sink), recorder)
        for view in (metrics, metrics.for_group("audit")):
            if bound:
                for name in ("succeeded", "failed", "delivered", "enqueued"):
                    inc = view.bind_increment(name, "t")
                    if inc is not None:
                        inc(2)
                for name in ("in_flight", "lateness_ms"):
                    set_ = view.bind_gauge(name, "t")
                    if set_ is not None:
                        set_(7.0)
                for name, outcome in (("lateness", ""), ("handler_duration", "success")):
                    obs = view.bind_observe(name, "t", outcome)
                    if obs is not None:
                        obs(0.25)
            else:
                for name in ("succeeded", "failed", "delivered", "enqueued"):
                    view.increment(name, 2, event_type="t")
                for name in ("in_flight", "lateness_ms"):
                    view.gauge(name, 7.0, event_type="t")
                view.observe("lateness", 0.25, event_type="t")
                view.observe("handler_duration", 0.25, event_type="t", outcome="success")

    for make in (OldSink, InMemoryMetrics, NoopMetrics):
        sinks, rows = [], []
        for bound in (False, True):
            sink, recorder = make(), HistoryRecorder()
            run(bound, sink, recorder)
            sinks.append(vars(sink))
            rows.append(recorder.take())
        assert sinks[0] == sinks[1], make
        assert rows[0] == rows[1], make
    samples = []
    for bound in (False, True):
        registry = CollectorRegistry()
        run(bound, PrometheusMetrics(registry), HistoryRecorder())
        samples.append(
            sorted(
                (s.name, tuple(sorted(s.labels.items())), s.value)
                for family in registry.collect()
                for s in family.samples
                if not s.name.endswith("_created")
            )
        )
    assert samples[0] == samples[1]
    assert ("delayq_succeeded_total", (("event_type", "t"), ("group", "audit")), 2.0) in samples[1]
