"""delayq.prometheus.local exports what prometheus-client's own Histogram and Gauge would."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from delayq.prometheus import DURATION_BUCKETS
from delayq.prometheus.local import LocalCollector, LocalGauge, LocalHistogram


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_histogram_and_gauge_match_prometheus_client() -> None:
    # bounds themselves (le is inclusive), between them, below the first, above the last
    values = [0.0, 0.001, 0.0011, 0.0025, 0.3, 1, 1.0000001, 21600, 21601, 1e9] + [
        i / 997 for i in range(300)
    ]
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram(
        "delayq_x_seconds", "doc", ("event_type", "group"), registry=theirs,
        buckets=DURATION_BUCKETS,
    )  # fmt: skip
    gauge = Gauge("delayq_g", "doc", ("event_type",), registry=theirs)
    local = LocalHistogram("delayq_x_seconds", "doc", ("event_type", "group"), DURATION_BUCKETS)
    local_gauge = LocalGauge("delayq_g", "doc", ("event_type",))
    collector = LocalCollector()
    collector.add(local)
    collector.add(local_gauge)
    ours.register(collector)
    for labels in (("a", "default"), ("b", "audit")):
        observe = local.observer(*labels)
        for v in values if labels[0] == "a" else values[:3]:
            reference.labels(*labels).observe(v)
            observe(v)
    gauge.labels("a").set(3)
    local_gauge.setter("a")(3)
    assert samples(ours) == samples(theirs)
    # a _created sample per histogram series, as prometheus-client writes them
    created = [line for line in generate_latest(ours).split(b"\n") if b"_created" in line]
    assert created and [c.split(b" ")[0] for c in created] == [
        c.split(b" ")[0]
        for c in generate_latest(theirs).split(b"\n")
        if b"_created" in c and b"delayq_x" in c
    ]
    # a second registration of the same names is refused, as prometheus-client does
    with pytest.raises(ValueError, match="Duplicated"):
        theirs.register(collector)
    with pytest.raises(ValueError):
        local.observer("only-one-label")


def test_folding_while_scraping_counts_every_observation_once() -> None:
    # the event loop appends (no lock) while another thread scrapes (folds under the lock)
    import threading

    local = LocalHistogram("delayq_y_seconds", "doc", ("event_type",), DURATION_BUCKETS)
    observe = local.observer("a")
    registry = CollectorRegistry()
    collector = LocalCollector()
    collector.add(local)
    registry.register(collector)
    done = threading.Event()
    counts: list[float] = []

    def scrape() -> None:
        while not done.is_set():
            s = samples(registry)
            counts.append(s["delayq_y_seconds_count", (("event_type", "a"),)])

    scraper = threading.Thread(target=scrape)
    scraper.start()
    n = 200_000
    for i in range(n):
        observe(0.003 if i % 2 else 7.0)
        if i % 5000 == 0:
            local.fold()  # the service's own folds, beside the scrapes
    done.set()
    scraper.join()
    final = samples(registry)
    assert final["delayq_y_seconds_count", (("event_type", "a"),)] == n
    assert final["delayq_y_seconds_bucket", (("event_type", "a"), ("le", "0.005"))] == n // 2
    assert final["delayq_y_seconds_sum", (("event_type", "a"),)] == pytest.approx(
        n // 2 * 7.0 + n // 2 * 0.003
    )
    assert counts == sorted(counts)  # a scrape never saw fewer than the one before


def test_the_service_folds_every_fold_every_runs() -> None:
    from delayq.context import Delivery
    from delayq.metrics import FOLD_EVERY, ServiceMetrics
    from delayq.observer import Observer
    from delayq.prometheus import PrometheusMetrics

    sink = PrometheusMetrics(CollectorRegistry())
    hooks = Observer().bind("t", ServiceMetrics(sink))
    delivery = Delivery("t", "e", 1, 1_000, 1_001_000, {}, enqueued_ms=900)
    pending = sink.bind_observe("handler_duration", event_type="t", outcome="success")
    assert pending is not None
    for _ in range(FOLD_EVERY * 2 + 10):
        hooks.finished(delivery, hooks.started(delivery), None)
    assert len(pending.__self__) == 10  # type: ignore[attr-defined]
    text = generate_latest(sink.registry).decode()
    assert (
        f'delayq_handler_duration_seconds_count{{event_type="t",group="default",outcome="success"}} {FOLD_EVERY * 2 + 10}.0'
        in text
    )
    assert not pending.__self__  # type: ignore[attr-defined]
