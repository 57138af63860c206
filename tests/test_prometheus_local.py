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
