"""Prometheus metrics scraped over real HTTP after a known workload (issue 11).

The workload: successes, retries, a dead letter, an undecodable entry, a kept and a
replaced enqueue, a cancel, a future event and an overdue event nobody handles. The
scrape is parsed with prometheus-client's own text parser; every counter must equal
what happened, histogram counts must match the handler runs, and the queue-depth
collector must agree with ``stats()``. Its Redis cost per scrape is counted with MONITOR.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from core_support import ServicePool, keys_of, redis_time_ms
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from delayq import Event, InMemoryMetrics, fixed
from delayq.prometheus import PrometheusMetrics, make_asgi_app, serve
from delayq.testing import RedisServer


class PromOk(Event, event_name="obs-prom-ok"):
    """Always handled."""


class PromFlaky(Event, event_name="obs-prom-flaky"):
    """Fails on its first attempt."""


class PromDead(Event, event_name="obs-prom-dead"):
    """Always fails."""


class PromIdle(Event, event_name="obs-prom-idle"):
    """Nobody handles it."""


class PromFan(Event, event_name="obs-prom-fan"):
    """Handled by the default group; the audit group fails it."""


ROOT = Path(__file__).resolve().parent.parent

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name, frozenset(s.labels.items())] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def scrape(port: int) -> tuple[str, Samples]:
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return response.text, parse(response.text)


_MONITOR_LINE = re.compile(rb'^\+\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]+)"')


class Monitor:
    """Commands clients send (not those run inside scripts), up to a marker command."""

    def __init__(self, server: RedisServer):
        self.server = server

    async def __aenter__(self) -> Monitor:
        self.reader, self.writer = await asyncio.open_connection(self.server.host, self.server.port)
        self.writer.write(b"MONITOR\r\n")
        await self.writer.drain()
        assert await self.reader.readline() == b"+OK\r\n"
        return self

    async def counts(self) -> Counter[str]:
        """Send a marker through another connection; count what came before it."""
        marker = b"obs-monitor-marker"
        _, w = await asyncio.open_connection(self.server.host, self.server.port)
        w.write(b"ECHO " + marker + b"\r\n")
        await w.drain()
        counts: Counter[str] = Counter()
        while True:
            line = await asyncio.wait_for(self.reader.readline(), 10)
            if marker in line:
                break
            match = _MONITOR_LINE.match(line)
            assert match, line
            if match.group(1) != b"lua":
                counts[match.group(2).decode().upper()] += 1
        w.close()
        return counts

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def test_metrics_over_http_match_the_workload(
    private_server: RedisServer, prefix: str, wait_for
) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    pool = ServicePool(
        private_server.url, prefix, retry_attempts=2, retry_backoff=fixed(0.05), metrics=metrics
    )
    attempts: Counter[str] = Counter()

    async def ok(event: PromOk) -> None:
        attempts[event.id] += 1

    async def flaky(event: PromFlaky) -> None:
        attempts[event.id] += 1
        if attempts[event.id] == 1:
            raise RuntimeError("first attempt fails")

    async def dead(event: PromDead) -> None:
        attempts[event.id] += 1
        raise ValueError("always fails")

    try:
        service = await pool.start()
        producer = pool.producer()
        raw = service.store.redis
        service.add_handler(PromOk, ok, concurrency=4)
        service.add_handler(PromFlaky, flaky, concurrency=4)
        service.add_handler(PromDead, dead, concurrency=1)
        for i in range(5):
            assert await service.enqueue_with_delay(PromOk(id=f"ok-{i}"))
        assert (
            await service.enqueue_many([PromFlaky(id=f"flaky-{i}") for i in range(3)]) == [True] * 3
        )
        assert await service.enqueue_with_delay(PromDead(id="dead-1"))
        # kept, replaced, cancelled; one event for later; one due event nobody handles
        assert await service.enqueue_with_delay(PromOk(id="later-1"), 3600)
        assert not await service.enqueue_with_delay(PromOk(id="later-1"), 3600)
        assert await service.enqueue_with_delay(PromOk(id="later-1"), 7200, replace=True)
        assert await service.cancel(PromOk, "later-1")
        assert await service.enqueue_with_delay(PromOk(id="future-1"), 3600)
        assert await service.enqueue_with_delay(PromIdle(id="idle-1"))
        # a child waiting for its parent (after=[...]): the waiting gauge
        assert await service.enqueue_with_delay(
            PromIdle(id="child-1"), after=[(PromOk, "future-1")]
        )
        # an undecodable entry, due now
        k = keys_of(prefix, PromOk.event_name)
        now = await redis_time_ms(raw)
        await raw.hset(k.events, "garbage-1", b'["truncated')
        await raw.zadd(k.scheduled, {"garbage-1": now})

        def counter(name: str, event_type: str) -> float:
            return (
                registry.get_sample_value(
                    f"delayq_{name}_total", {"event_type": event_type, "group": "default"}
                )
                or 0
            )

        async def settled() -> bool:
            counts = await service.stats()
            return (
                counter("succeeded", "obs-prom-ok") == 5
                and counter("succeeded", "obs-prom-flaky") == 3
                and counts["obs-prom-dead"].dead == 1
                and counts["obs-prom-ok"].dead == 1
                and counts["obs-prom-idle"].ready == 1
                and all(c.in_flight == 0 for c in counts.values())
            )

        await wait_for(settled, timeout=20)
        stats = await service.stats()
        async with serve(
            0, host="127.0.0.1", service=producer, registry=registry, cache_seconds=0
        ) as srv:
            text, samples = await scrape(srv.port)
    finally:
        await pool.aclose()

    # -- counters: exactly what happened --------------------------------------------------
    expected_counters = {
        ("enqueued", "obs-prom-ok", "new"): 7,  # 5 + later-1 + future-1
        ("enqueued", "obs-prom-ok", "kept"): 1,
        ("enqueued", "obs-prom-ok", "replaced"): 1,
        ("enqueued", "obs-prom-flaky", "new"): 3,
        ("enqueued", "obs-prom-dead", "new"): 1,
        ("enqueued", "obs-prom-idle", "new"): 2,  # idle-1, child-1 (waiting)
    }
    for (name, event_type, outcome), n in expected_counters.items():
        assert (
            value(samples, f"delayq_{name}_total", event_type=event_type, outcome=outcome) == n
        ), (name, event_type, outcome)
    per_type = {
        "cancelled": {"obs-prom-ok": 1},
        "delivered": {"obs-prom-ok": 6, "obs-prom-flaky": 6, "obs-prom-dead": 3},
        "succeeded": {"obs-prom-ok": 5, "obs-prom-flaky": 3},
        "failed": {"obs-prom-ok": 1, "obs-prom-flaky": 3, "obs-prom-dead": 3},
        "retried": {"obs-prom-flaky": 3, "obs-prom-dead": 2},
        "dead_lettered": {"obs-prom-ok": 1, "obs-prom-dead": 1},
        "decode_errors": {"obs-prom-ok": 1},
    }
    types = ["obs-prom-ok", "obs-prom-flaky", "obs-prom-dead", "obs-prom-idle"]
    for name, by_type in per_type.items():
        # the counters of deliveries have a group label ("default": handlers without a group)
        labels = {"group": "default"} if name != "cancelled" else {}
        for event_type in types:
            got = value(samples, f"delayq_{name}_total", event_type=event_type, **labels)
            assert got == by_type.get(event_type, 0), (name, event_type, got)
    for name in ("leases_lost", "stale_outcomes", "redis_errors"):
        assert sum(v for (n, _), v in samples.items() if n == f"delayq_{name}_total") == 0
    assert attempts == Counter(
        {**{f"ok-{i}": 1 for i in range(5)}, **{f"flaky-{i}": 2 for i in range(3)}, "dead-1": 3}
    )

    # -- histograms: one observation per handler run -------------------------------------
    runs = {
        ("obs-prom-ok", "success"): 5,
        ("obs-prom-flaky", "failure"): 3,
        ("obs-prom-flaky", "success"): 3,
        ("obs-prom-dead", "failure"): 3,
    }
    for (event_type, outcome), n in runs.items():
        labels = {"event_type": event_type, "outcome": outcome, "group": "default"}
        assert value(samples, "delayq_handler_duration_seconds_count", **labels) == n
        assert value(samples, "delayq_handler_duration_seconds_bucket", **labels, le="+Inf") == n
    lateness = {"obs-prom-ok": 5, "obs-prom-flaky": 6, "obs-prom-dead": 3}
    done = {"obs-prom-ok": 5, "obs-prom-flaky": 3}
    for event_type in types:
        assert value(
            samples, "delayq_lateness_seconds_count", event_type=event_type, group="default"
        ) == lateness.get(event_type, 0)
        assert value(
            samples, "delayq_enqueue_to_done_seconds_count", event_type=event_type, group="default"
        ) == done.get(event_type, 0)
    # the documented buckets: 1 ms ... 6 h for lateness, up to 7 days for enqueue_to_done
    les = {dict(labels)["le"] for (n, labels) in samples if n == "delayq_lateness_seconds_bucket"}
    assert {"0.001", "21600.0", "+Inf"} <= les
    for event_type in ("obs-prom-ok", "obs-prom-flaky", "obs-prom-dead"):
        assert (
            value(samples, "delayq_handlers_in_flight", event_type=event_type, group="default") == 0
        )

    # -- the queue depth agrees with stats() ---------------------------------------------
    for event_type, counts in stats.items():
        for state in ("scheduled", "ready", "in_flight", "dead"):
            got = value(samples, "delayq_queue_events", event_type=event_type, state=state)
            assert got == getattr(counts, state), (event_type, state)
    assert value(samples, "delayq_queue_events", event_type="obs-prom-ok", state="scheduled") == 1
    assert value(samples, "delayq_queue_due_events", event_type="obs-prom-ok") == 0
    assert value(samples, "delayq_queue_oldest_overdue_seconds", event_type="obs-prom-ok") == 0
    assert value(samples, "delayq_queue_due_events", event_type="obs-prom-idle") == 1
    assert (
        0 < value(samples, "delayq_queue_oldest_overdue_seconds", event_type="obs-prom-idle") < 120
    )
    assert value(samples, "delayq_queue_up") == 1
    assert value(samples, "delayq_waiting", event_type="obs-prom-idle") == 1
    assert value(samples, "delayq_waiting", event_type="obs-prom-ok") == 0
    # names follow the conventions: counters end in _total, durations in _seconds
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if family.type == "histogram":
            assert family.name.endswith("_seconds")


async def test_queue_depth_costs_a_few_commands_per_type_and_is_cached(
    private_server: RedisServer, prefix: str
) -> None:
    """One read per cache period, shared by concurrent scrapes; its commands counted."""
    pool = ServicePool(private_server.url, prefix)
    try:
        producer = pool.producer()
        for event_type in (PromOk, PromFlaky, PromDead):
            assert await producer.enqueue_with_delay(event_type(id="x"), 3600)
        app = make_asgi_app(producer, registry=CollectorRegistry(), cache_seconds=30)
        assert app.collector is not None
        await producer.stats()  # loads the counts script: what follows is the steady state
        async with Monitor(private_server) as monitor:
            await app.render()
            first = await monitor.counts()
            # concurrent and later scrapes within cache_seconds: no Redis command at all
            await asyncio.gather(*(app.render() for _ in range(5)))
            cached = await monitor.counts()
        app.close()
    finally:
        await pool.aclose()
    print(f"\nqueue depth, 3 types: {sum(first.values())} commands per read: {dict(first)}")
    assert app.collector.reads == 1
    assert cached == Counter()
    # service.stats(): SMEMBERS, then one read-only script call per type, pipelined; and
    # each type's delivery groups (none here: nothing more); the live workers' heartbeats
    # (one ZRANGE, and one MGET when a worker is alive: none here); the batch shards in
    # use: one SMEMBERS (none here: nothing more). 8 commands before batches, 9 with them
    assert first == Counter({"SMEMBERS": 2, "EVALSHA": 3, "HGETALL": 3, "ZRANGE": 1})


async def test_delivery_groups_are_labelled(
    private_server: RedisServer, prefix: str, wait_for
) -> None:
    registry = CollectorRegistry()
    pool = ServicePool(private_server.url, prefix, metrics=PrometheusMetrics(registry))

    async def ok(event: PromFan) -> None:
        pass

    async def audit(event: PromFan) -> None:
        raise RuntimeError("audit fails")

    try:
        service = pool.make()
        service.add_handler(PromFan, ok)
        service.add_handler(PromFan, audit, group="audit", retry_attempts=1, retry_backoff=fixed(0))
        await service.start()

        async def registered() -> bool:
            return "audit" in await service.groups(PromFan)

        await wait_for(registered)
        producer = pool.producer()
        await producer.enqueue_many([PromFan(id=f"f{i}") for i in range(2)])
        assert await producer.enqueue_with_delay(PromOk(id="later"), 3600)

        async def settled() -> bool:
            counts = await service.group_stats(PromFan)
            return counts["audit"].dead == 2 and counts["default"].in_flight == 0

        await wait_for(settled, timeout=20)
        async with serve(
            0, host="127.0.0.1", service=producer, registry=registry, cache_seconds=0
        ) as srv:
            _, samples = await scrape(srv.port)
    finally:
        await pool.aclose()

    fan = {"event_type": "obs-prom-fan"}
    for group, succeeded, failed in (("default", 2, 0), ("audit", 0, 4)):
        labels = {**fan, "group": group}
        assert value(samples, "delayq_delivered_total", **labels) == succeeded + failed
        assert value(samples, "delayq_succeeded_total", **labels) == succeeded
        assert value(samples, "delayq_failed_total", **labels) == failed
        assert value(samples, "delayq_handlers_in_flight", **labels) == 0
        assert value(samples, "delayq_lateness_seconds_count", **labels) == succeeded + failed
    assert value(samples, "delayq_retried_total", **fan, group="audit") == 2
    assert value(samples, "delayq_dead_lettered_total", **fan, group="audit") == 2
    assert value(samples, "delayq_enqueued_total", **fan, outcome="new") == 2  # per type
    # no event_type "type:group" folding for a sink that takes group=
    assert not [k for k in samples if any(v.startswith("obs-prom-fan:") for _, v in k[1])]
    # the queue depth per group, for the type with named groups only
    for group, dead in (("default", 0), ("audit", 2)):
        labels = {**fan, "group": group}
        assert value(samples, "delayq_queue_group_events", **labels, state="dead") == dead
        assert value(samples, "delayq_queue_group_events", **labels, state="ready") == 0
    assert not [
        k for k in samples
        if k[0] == "delayq_queue_group_events" and ("event_type", "obs-prom-ok") in k[1]
    ]  # fmt: skip
    assert value(samples, "delayq_queue_events", event_type="obs-prom-ok", state="scheduled") == 1
    assert value(samples, "delayq_queue_events", **fan, state="dead") == 0


async def test_asgi_app_mounts_in_fastapi(private_server: RedisServer, prefix: str) -> None:
    fastapi = pytest.importorskip("fastapi")
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry, namespace="shop")
    pool = ServicePool(private_server.url, prefix, metrics=metrics)
    try:
        producer = pool.producer()
        assert await producer.enqueue_with_delay(PromOk(id="a"), 3600)
        web = fastapi.FastAPI()
        metrics_app = make_asgi_app(producer, registry=registry, namespace="shop")
        web.mount("/metrics", metrics_app)
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            response = await client.get("/metrics/")
            openmetrics = await client.get(
                "/metrics/", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
            )
            post = await client.post("/metrics/")
        metrics_app.close()
    finally:
        await pool.aclose()
    assert response.status_code == 200
    samples = parse(response.text)
    assert value(samples, "shop_enqueued_total", event_type="obs-prom-ok", outcome="new") == 1
    assert value(samples, "shop_queue_events", event_type="obs-prom-ok", state="scheduled") == 1
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.rstrip().endswith("# EOF")
    assert post.status_code == 405


def test_sinks_without_observe_keep_working() -> None:
    """A sink written before observe() existed is wrapped, not refused."""
    from delayq import EventService

    class Old:
        def __init__(self) -> None:
            self.calls: list[Any] = []

        def increment(self, name: str, value: int = 1, *, event_type: str = "") -> None:
            self.calls.append((name, value))

        def gauge(self, name: str, value: float, *, event_type: str = "") -> None:
            self.calls.append((name, value))

    import redis.asyncio as aioredis

    old = Old()
    service = EventService(aioredis.Redis(), metrics=old)
    sink = service.options.metrics
    sink.observe("lateness", 0.5, event_type="x")  # dropped, no error
    sink.increment("enqueued", 2, event_type="x")
    assert old.calls == [("enqueued", 2)]
    assert sink.calls is old.calls  # attributes reach the user's object
    with pytest.raises(TypeError, match="increment"):
        EventService(aioredis.Redis(), metrics=object())
    memory = InMemoryMetrics()
    assert EventService(aioredis.Redis(), metrics=memory).options.metrics is memory


async def test_every_metric_is_documented_and_the_dashboard_uses_real_ones() -> None:
    import json

    from prometheus_client import generate_latest

    from delayq import QueueCounts
    from delayq.prometheus import QueueDepthCollector

    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    for name in (
        "enqueued", "kept", "replaced", "cancelled", "moved", "delivered", "succeeded", "failed",
        "retried", "dead_lettered", "decode_errors", "leases_lost", "stale_outcomes",
        "redis_errors", "batch_completions_ignored",
    ):  # fmt: skip
        metrics.increment(name, event_type="t")
    metrics.gauge("in_flight", 1, event_type="t")
    for name in ("lateness", "handler_duration", "enqueue_to_done"):
        metrics.observe(name, 0.01, event_type="t", outcome="success")

    async def fake_read(service: Any) -> dict[str, QueueCounts]:
        return {"t": QueueCounts(1, 2, 3, 4, due=2, backlog_age=1.5)}

    async def fake_groups(service: Any, names: list[str]) -> dict[str, dict[str, QueueCounts]]:
        return {"t": {"default": QueueCounts(1, 2, 3, 4), "audit": QueueCounts(1, 0, 0, 1)}}

    collector = QueueDepthCollector(None, read=fake_read, read_groups=fake_groups)  # type: ignore[arg-type]
    registry.register(collector)
    await collector.refresh()
    exposition = generate_latest(registry).decode()
    # (the text format's `_created` samples parse as families of their own)
    families = {
        f.name
        for f in text_string_to_metric_families(exposition)
        if not f.name.endswith("_created")
    }
    doc = (ROOT / "docs" / "OBSERVABILITY.md").read_text()
    for family in families:
        documented = family + ("_total" if f"`{family}_total`" in doc else "")
        assert f"`{documented}`" in doc, family
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"delayq_[a-z_]+", e)}
    for metric in used:
        base = re.sub(r"_(total|bucket|count|sum)$", "", metric)
        assert base in families, metric
    assert {"delayq_queue_oldest_overdue_seconds", "delayq_lateness_seconds_bucket"} <= used


def test_every_counter_counted_is_declared_exported_and_documented() -> None:
    """Each counter name the library counts (``increment("x", ...)``, ``bind_increment``,
    the enqueue outcomes) is named in delayq/metrics.py's docstring, exported by
    PrometheusMetrics with its own help text, and in docs/OBSERVABILITY.md's table."""
    import ast

    from delayq import metrics as metrics_module
    from delayq.operations.enqueueing import _OUTCOMES
    from delayq.prometheus.sink import _COUNTERS

    counted = set(_OUTCOMES.values())
    for path in (ROOT / "delayq").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("increment", "bind_increment")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                counted.add(node.args[0].value)
    assert {"enqueued", "redis_errors", "batch_completions_ignored"} <= counted
    declared = metrics_module.__doc__ or ""
    doc = (ROOT / "docs" / "OBSERVABILITY.md").read_text()
    for name in sorted(counted):
        assert f"``{name}``" in declared, f"{name}: not named in delayq/metrics.py"
        assert name in _COUNTERS, f"{name}: not in delayq/prometheus/sink.py's _COUNTERS"
        assert f"| `delayq_{_COUNTERS[name][0]}_total` |" in doc, f"{name}: not documented"


async def test_serve_answers_only_metrics_and_stops_cleanly() -> None:
    registry = CollectorRegistry()
    PrometheusMetrics(registry).increment("enqueued", 3, event_type="t")
    async with serve(0, host="127.0.0.1", registry=registry) as srv:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.port}", timeout=10) as client:
            ok = await client.get("/metrics")
            root = await client.get("/")
            head = await client.head("/metrics")
            missing = await client.get("/other")
            post = await client.post("/metrics")
        # a client that connects and says nothing is cut off when the server stops
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    assert await reader.read() == b""
    writer.close()
    assert value(parse(ok.text), "delayq_enqueued_total", event_type="t", outcome="new") == 3
    assert root.status_code == 200 and root.text == ok.text
    assert head.status_code == 200 and head.content == b""
    assert missing.status_code == 404
    assert post.status_code == 405


async def test_handler_counters_exist_at_zero_and_slots_show_busy_vs_capacity(
    private_server: RedisServer, prefix: str, wait_for: Any
) -> None:
    """add_handler makes every counter of its type and group exist with 0 (so
    ``increase(...) > 0`` sees the first dead letter), the per-process capacity gauge;
    the collector exports the live workers and their slots, busy and total."""
    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    pool = ServicePool(
        private_server.url, prefix, metrics=PrometheusMetrics(registry), heartbeat_interval=0.1
    )
    release = asyncio.Event()
    running = 0

    async def slow(event: PromFan) -> None:
        nonlocal running
        running += 1
        await release.wait()

    async def ok(event: PromFan) -> None:
        pass

    fan = {"event_type": "obs-prom-fan"}
    try:
        service = pool.make()
        service.add_handler(PromFan, slow, concurrency=7)
        service.add_handler(PromFan, ok, concurrency=3, group="audit")
        samples = parse(generate_latest(registry).decode())  # nothing has happened yet
        for group in ("default", "audit"):
            labels = frozenset({**fan, "group": group}.items())
            for name in (
                "delivered", "succeeded", "failed", "retried", "dead_lettered", "decode_errors",
                "leases_lost", "stale_outcomes",
            ):  # fmt: skip
                assert samples[f"delayq_{name}_total", labels] == 0, (name, group)
        assert samples["delayq_redis_errors_total", frozenset(fan.items())] == 0
        assert value(samples, "delayq_handler_concurrency", **fan, group="default") == 7
        assert value(samples, "delayq_handler_concurrency", **fan, group="audit") == 3

        await service.start()
        app = make_asgi_app(service, registry=registry, cache_seconds=0)
        await service.enqueue_many([PromFan(id=f"b{i}") for i in range(2)])
        await wait_for(lambda: running == 2, timeout=15)

        async def busy() -> bool:
            s = parse((await app.render())[0].decode())
            return value(s, "delayq_workers_busy", **fan, group="default") == 2

        await wait_for(busy, timeout=15)
        samples = parse((await app.render())[0].decode())
        assert value(samples, "delayq_workers") == 1
        assert value(samples, "delayq_workers_concurrency", **fan, group="default") == 7
        assert value(samples, "delayq_workers_concurrency", **fan, group="audit") == 3
        assert value(samples, "delayq_handlers_in_flight", **fan, group="default") == 2
        release.set()
        assert await service.remove_handler(PromFan, group="audit")
        samples = parse((await app.render())[0].decode())
        assert value(samples, "delayq_handler_concurrency", **fan, group="audit") == 0
        app.close()
    finally:
        release.set()
        await pool.aclose()


async def test_dead_letters_made_by_the_scheduler_carry_their_group(
    private_server: RedisServer, prefix: str, wait_for: Any
) -> None:
    """A lease of a named group that expires on its last delivery becomes that group's
    dead letter in the scheduler: counted with group="audit", not "default"."""
    registry = CollectorRegistry()
    pool = ServicePool(private_server.url, prefix, metrics=PrometheusMetrics(registry))
    try:
        service = await pool.start()
        assert await service.register_group(PromFan, "audit", retry_attempts=0)
        assert await service.enqueue_with_delay(PromFan(id="lost"))
        store = service.store

        async def claimed() -> bool:  # a worker of the audit group that claims, then dies
            _, got = await store.deliveries.claim(PromFan.event_name, [], 1, 300, group="audit")
            return bool(got)

        await wait_for(claimed, timeout=15)

        async def dead() -> bool:
            return (await service.group_stats(PromFan))["audit"].dead == 1

        await wait_for(dead, timeout=15)
        async with serve(
            0, host="127.0.0.1", service=service, registry=registry, cache_seconds=0
        ) as srv:
            _, samples = await scrape(srv.port)
    finally:
        await pool.aclose()
    fan = {"event_type": "obs-prom-fan"}
    assert value(samples, "delayq_dead_lettered_total", **fan, group="audit") == 1
    assert value(samples, "delayq_dead_lettered_total", **fan, group="default") == 0


def test_the_dashboard_filters_every_query_by_type_and_shows_groups_failures_and_slots() -> None:
    import json

    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for expr in exprs:
        for metric in re.findall(r"delayq_[a-z_]+(?:\{[^}]*\})?", expr):
            if metric != "delayq_workers":  # the only one without an event_type label
                assert '{event_type=~"$event_type"' in metric, expr
    by_group = " ".join(e for e in exprs if "by (event_type, group" in e)
    for metric in (
        "delayq_failed_total", "delayq_retried_total", "delayq_dead_lettered_total",
        "delayq_succeeded_total", "delayq_queue_group_events", "delayq_workers_busy",
        "delayq_workers_concurrency",
    ):  # fmt: skip
        assert metric in by_group, metric
    assert "max(delayq_workers)" in exprs


async def test_enqueue_outcome_series_appear_with_their_first_outcome(
    private_server: RedisServer, prefix: str
) -> None:
    """The enqueue counters are bound once per type and outcome (issue 20), each at its
    first use, so the series appear when they did before: with the first such outcome."""
    registry = CollectorRegistry()
    pool = ServicePool(private_server.url, prefix, metrics=PrometheusMetrics(registry))

    def outcomes() -> dict[str, float]:
        return {
            s.labels["outcome"]: s.value
            for family in registry.collect()
            for s in family.samples
            if s.name == "delayq_enqueued_total" and s.labels["event_type"] == "obs-prom-ok"
        }

    try:
        producer = pool.producer()
        assert await producer.enqueue_with_delay(PromOk(id="a"), 3600)
        assert outcomes() == {"new": 1.0}
        assert not await producer.enqueue_with_delay(PromOk(id="a"), 3600)
        assert await producer.enqueue_with_delay(PromOk(id="b"), 3600)
        assert outcomes() == {"new": 2.0, "kept": 1.0}
    finally:
        await pool.aclose()


async def test_relay_backlog_and_lag_show_a_completion_not_handed_on(
    redis_url: str, prefix: str, wait_for
) -> None:
    """No worker runs the relay here: a cancelled parent's completion stays due, counted in
    its type's relay backlog, its age growing."""
    pool = ServicePool(redis_url, prefix)
    try:
        producer = pool.producer()
        await producer.enqueue_with_delay(PromOk(id="parent"), 3600)
        assert await producer.enqueue_with_delay(
            PromIdle(id="child"), 0, after=[(PromOk, "parent")]
        )
        app = make_asgi_app(producer, registry=CollectorRegistry(), cache_seconds=0)
        samples = parse((await app.render())[0].decode())
        assert value(samples, "delayq_relay_backlog", event_type="obs-prom-ok") == 0
        assert await producer.cancel(PromOk, "parent")
        samples = parse((await app.render())[0].decode())
        assert value(samples, "delayq_relay_backlog", event_type="obs-prom-ok") == 1
        assert value(samples, "delayq_relay_backlog", event_type="obs-prom-idle") == 0

        async def lagging() -> bool:
            s = parse((await app.render())[0].decode())
            return value(s, "delayq_relay_lag_seconds", event_type="obs-prom-ok") >= 0.2

        await wait_for(lagging, timeout=10)
        stats = await producer.stats_for(PromOk)
        assert stats.relay_backlog == 1 and stats.relay_lag >= 0.2
        app.close()
    finally:
        await pool.aclose()
