"""Flow control (issue 22): fleet-wide concurrency and rate limits, pause and resume.

Several worker processes (``tests/flow_worker.py``) share one prefix; they record every
handler start with Redis's clock at its claim, and the fleet's running count. No
assert reads the wall clock: the rate checks use Redis's own clock at each claim.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from delayq import Event, EventService, FlowLimits, Rate
from delayq.flow.limits import parse_rate
from delayq.keys import PrefixKeys, TypeKeys
from delayq.partitions.shards import shards
from delayq.testing import wait_for

WORKER = Path(__file__).with_name("flow_worker.py")
ROOT = Path(__file__).resolve().parents[1]
FAST = {"visibility_timeout": 5.0, "scheduling_interval": 0.2, "lock_timeout": 1.0,
        "polling_timeout": 1.0, "shutdown_grace": 2.0}  # fmt: skip


class FlowJob(Event, event_name="flow-job"):
    """Same wire name and shape as the workers' class."""

    n: int = 0


class Workers:
    """Worker processes on one prefix; every one is ended when the test ends."""

    def __init__(self, url: str, prefix: str, logs: Path):
        self.url, self.prefix, self.logs = url, prefix, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, mode: str = "work", *extra: str) -> None:
        with open(self.logs / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, str(WORKER), self.url, self.prefix, name, mode, *extra],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def workers(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(redis_url, prefix, tmp_path)
    yield w
    w.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, protocol=2)
    yield client
    await client.aclose()


@pytest.fixture
async def service(redis_url: str, prefix: str) -> AsyncIterator[EventService]:
    svc = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False, **FAST)
    yield svc
    await svc.aclose()


async def started(raw: aioredis.Redis, prefix: str, names: list[str]) -> None:
    async def all_ready() -> bool:
        return int(await raw.scard(f"{prefix}-test:ready")) == len(names)

    await wait_for(all_ready, timeout=30, message="workers started")


async def starts(raw: aioredis.Redis, prefix: str) -> list[tuple[int, str, str]]:
    """Every handler start: (claimed_us on Redis's clock, id, worker)."""
    out = []
    for entry in await raw.lrange(f"{prefix}-test:starts", 0, -1):
        us, rest = entry.decode().split(":", 1)
        event_id, name = rest.rsplit(":", 1)
        out.append((int(us), event_id, name))
    return sorted(out)


async def done(raw: aioredis.Redis, prefix: str) -> int:
    return int(await raw.hlen(f"{prefix}-test:done"))


async def live_leases(raw: aioredis.Redis, prefix: str) -> int:
    sec, usec = await raw.time()
    now_ms = sec * 1000 + usec // 1000
    inflight = TypeKeys(prefix, "flow-job").inflight
    return int(await raw.zcount(inflight, f"({now_ms}", "+inf"))


async def enqueue(service: EventService, n: int, start: int = 0) -> None:
    await service.enqueue_many([(FlowJob(id=f"e{i:05d}", n=i), 0) for i in range(start, start + n)])


# -- the API ---------------------------------------------------------------------------


def test_parse_rate() -> None:
    assert parse_rate("100/s") == Rate(100, 1000, 10)
    assert parse_rate("6000/min") == Rate(6000, 60_000, 10)
    assert parse_rate("5/10s") == Rate(5, 10_000, 1)
    assert parse_rate("100/s burst 20") == Rate(100, 1000, 20)
    assert parse_rate(" 3 / h ") == Rate(3, 3_600_000, 1)
    for bad in ("", "100", "100/fortnight", "0/s", "-1/s", "1/s burst 0", "x/s"):
        with pytest.raises(ValueError):
            parse_rate(bad)
    with pytest.raises(TypeError):
        parse_rate(100)  # type: ignore[arg-type]


async def test_limits_roundtrip(service: EventService, raw: aioredis.Redis, prefix: str) -> None:
    assert await service.limits(FlowJob) == FlowLimits()
    got = await service.set_limits(FlowJob, concurrency=5, rate="50/s")
    assert got == FlowLimits(5, Rate(50, 1000, 5)) == await service.limits("flow-job")
    # a limit not given is kept; None removes one
    assert await service.set_limits(FlowJob, rate=None) == FlowLimits(5)
    await service.pause(FlowJob)
    assert await service.limits(FlowJob) == FlowLimits(5, None, paused=True)
    assert (await service.stats_for(FlowJob)).paused
    await service.resume(FlowJob)
    await service.set_limits(FlowJob, concurrency=None)
    # no limit left: the key is gone, so claims pay one EXISTS and nothing else
    assert not await raw.exists(TypeKeys(prefix, "flow-job").limits())
    assert not (await service.stats_for(FlowJob)).paused
    for bad in ({"concurrency": 0}, {"concurrency": True}, {"concurrency": 1.5}, {"rate": "fast"}):
        with pytest.raises((ValueError, TypeError)):
            await service.set_limits(FlowJob, **bad)  # type: ignore[arg-type]
    # per-key limits (tests/test_flow_keys.py runs them): stored, read back, removed
    got = await service.set_limits(FlowJob, per_key_concurrency=1, per_key_rate="5/s")
    assert got == FlowLimits(per_key_concurrency=1, per_key_rate=Rate(5, 1000, 1))
    assert await service.set_limits(FlowJob, per_key_concurrency=None, per_key_rate=None) == (
        FlowLimits()
    )
    assert not await raw.exists(TypeKeys(prefix, "flow-job").limits())
    # a group's limits are its own
    await service.set_limits(FlowJob, concurrency=2, group="audit")
    assert await service.limits(FlowJob) == FlowLimits()
    assert await service.limits(FlowJob, group="audit") == FlowLimits(2)


def _hot(partitions: int) -> type[Event]:
    # the same class (module and qualname) redefined with another count: what a deploy does
    class Hot(Event, event_name="flow-hot", partitions=partitions):
        n: int = 0

    return Hot


async def _shares(raw: aioredis.Redis, prefix: str, partitions: int) -> list[int]:
    keys = PrefixKeys(prefix)
    return [int(await raw.hget(keys.for_shard(s).limits(), "concurrency") or 0)
            for s in shards("flow-hot", partitions)]  # fmt: skip


async def test_partitioned_type_limits_split(
    service: EventService, raw: aioredis.Redis, prefix: str
) -> None:
    """A partitioned type's limit is split between its partitions (tests/test_flow_cluster.py
    runs it on a cluster); a limit below the partition count is refused."""
    hot = _hot(4)
    with pytest.raises(ValueError, match="4 partitions"):
        await service.set_limits(hot, concurrency=3)
    assert await service.set_limits(hot, concurrency=6) == FlowLimits(6)
    assert await _shares(raw, prefix, 4) == [2, 2, 1, 1]
    await service.pause(hot)
    assert await service.limits(hot) == FlowLimits(6, paused=True)
    assert (await service.stats_for(hot)).paused


async def test_limits_follow_a_partition_count_change(
    redis_url: str, raw: aioredis.Redis, prefix: str
) -> None:
    """A new layout (a deploy with another partition count) gets the type's limits at once,
    split over the shards of both layouts; once the old layout is retired, the limit is
    split over the new one alone. The shares never add up to more than the limit."""
    old, new = _hot(4), _hot(2)
    a = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False, **FAST)
    b = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False, **FAST)
    try:
        await a.enqueue_many([(old(id=f"o{i}"), 60) for i in range(10)])
        await a.set_limits(old, concurrency=8, rate="40/s")
        await a.pause(old)
        assert await _shares(raw, prefix, 4) == [2, 2, 2, 2]
        await b.enqueue_with_delay(new(id="fresh"), 60)  # registers the 2-partition layout
        shares = await _shares(raw, prefix, 4) + await _shares(raw, prefix, 2)
        assert shares == [2, 2, 1, 1, 1, 1] and sum(shares) == 8
        assert await b.limits(new) == FlowLimits(8, Rate(40, 1000, 4), paused=True)
        await b.resume(new)
        result = await b.repartition(new, wait=20)
        assert result.retired == (4,)
        assert await _shares(raw, prefix, 2) == [4, 4]
        assert await b.limits(new) == FlowLimits(8, Rate(40, 1000, 4))
    finally:
        await b.aclose()
        await a.aclose()


# -- several processes -----------------------------------------------------------------


async def test_concurrency_fleet_wide(
    workers: Workers, service: EventService, raw: aioredis.Redis, prefix: str
) -> None:
    """3 processes × 8 local slots, a fleet limit of 5: never more than 5 running
    (sampled continuously, and as an exact running maximum), and 5 are used."""
    await service.set_limits(FlowJob, concurrency=5)
    names = ["a", "b", "c"]
    for name in names:
        workers.start(name, "work", "--ms", "40", "--concurrency", "8")
    await started(raw, prefix, names)
    n = 200
    await enqueue(service, n)
    samples: list[int] = []

    async def sampled() -> bool:
        samples.append(await live_leases(raw, prefix))
        return await done(raw, prefix) == n

    await wait_for(sampled, timeout=120, interval=0.005, message="all handled")
    assert max(samples) <= 5
    assert int(await raw.get(f"{prefix}-test:max")) == 5  # exact: the limit is reached
    busy = [s for s in samples[len(samples) // 10 : -len(samples) // 5]]
    # fully used: while the backlog lasts most samples see every slot taken
    assert sum(busy) / len(busy) >= 4.0, (sum(busy) / len(busy), samples)
    assert {s[2] for s in await starts(raw, prefix)} == set(names)  # every process took a share


async def test_rate_fleet_wide(
    workers: Workers, service: EventService, raw: aioredis.Redis, prefix: str
) -> None:
    """50/s over 3 processes: 50 ± a few per second, never a burst above the bucket."""
    rate = parse_rate("50/s")
    await service.set_limits(FlowJob, rate=rate)
    names = ["a", "b", "c"]
    for name in names:
        workers.start(name, "work", "--ms", "5", "--concurrency", "8")
    await started(raw, prefix, names)
    n = 250
    await enqueue(service, n)
    await wait_for(lambda: done(raw, prefix), timeout=5)  # started
    await wait_for(lambda: _equals(done(raw, prefix), n), timeout=60, interval=0.05)
    times = [s[0] for s in await starts(raw, prefix)]
    assert len(times) == n
    # GCRA on Redis's clock: in any window of w ms at most burst + w / interval starts
    # (+1 for the claims' ms rounding)
    for i in range(n):
        for j in range(i + 1, n):
            w_ms = (times[j] - times[i]) / 1000
            if w_ms > 2000:
                break
            assert j - i + 1 <= rate.burst + w_ms / rate.interval_ms + 1, (i, j, w_ms)
    # the steady rate: the first bucket aside, 50/s within a few
    span_s = (times[-1] - times[rate.burst]) / 1e6
    per_s = (n - 1 - rate.burst) / span_s
    print(f"rate over {span_s:.2f} s: {per_s:.1f}/s")
    assert 45 <= per_s <= 50.5, per_s
    assert {s[2] for s in await starts(raw, prefix)} == set(names)


async def _equals(value: object, expected: object) -> bool:
    assert asyncio.iscoroutine(value)
    return await value == expected


async def test_sigkilled_worker_slots_come_back(
    workers: Workers, service: EventService, raw: aioredis.Redis, prefix: str
) -> None:
    """A worker holding both slots of a limit of 2 is SIGKILLed: its leases expire after
    the visibility timeout, the slots return, and another worker handles everything."""
    await service.set_limits(FlowJob, concurrency=2)
    workers.start("hung", "hang", "--visibility", "2")
    await started(raw, prefix, ["hung"])
    await enqueue(service, 10)
    await wait_for(lambda: _equals(live_leases(raw, prefix), 2), timeout=20)
    workers.start("good", "work", "--ms", "5", "--visibility", "2")
    await started(raw, prefix, ["hung", "good"])
    await asyncio.sleep(0.5)  # the good worker is up and finds no free slot
    assert await done(raw, prefix) == 0
    proc = workers.procs["hung"]
    proc.kill()
    proc.wait()
    # the slots come back when the leases expire (2 s): everything gets handled
    await wait_for(lambda: _equals(done(raw, prefix), 10), timeout=30, interval=0.05)
    assert int(await raw.get(f"{prefix}-test:max")) <= 2
    assert await raw.llen(f"{prefix}-test:hung") == 2  # it held both slots, and no more


async def test_pause_under_load_and_resume(
    workers: Workers, service: EventService, raw: aioredis.Redis, prefix: str
) -> None:
    """No handler starts after pause() returns, except for events claimed before; events
    are still accepted while paused; resume brings the throughput back."""
    names = ["a", "b"]
    for name in names:
        workers.start(name, "work", "--ms", "20", "--concurrency", "4")
    await started(raw, prefix, names)
    await enqueue(service, 300)
    await wait_for(lambda: _gt(done(raw, prefix), 30), timeout=30)
    await service.pause(FlowJob)
    sec, usec = await raw.time()
    paused_at_us = sec * 1_000_000 + usec
    assert (await service.stats_for(FlowJob)).paused
    await enqueue(service, 20, start=300)  # still accepted while paused
    # running handlers finish (a batch claimed just before pause() may still start them
    # a moment after `running` reads 0 on a loaded machine); then nothing moves for 1.5 s
    last = {"n": -1, "t": 0.0}

    async def quiet() -> bool:
        n, now = await done(raw, prefix), time.monotonic()
        if n != last["n"]:
            last.update(n=n, t=now)
            return False
        return now - last["t"] >= 1.5

    await wait_for(quiet, timeout=30, interval=0.1)
    handled = int(last["n"])
    late = [s for s in await starts(raw, prefix) if s[0] > paused_at_us]
    assert late == []  # every start after pause() belongs to a claim made before it
    assert handled < 320
    await service.resume(FlowJob)
    await wait_for(lambda: _equals(done(raw, prefix), 320), timeout=60, interval=0.05)


async def _gt(value: object, floor: int) -> bool:
    assert asyncio.iscoroutine(value)
    return await value > floor


async def test_limits_change_at_run_time(
    workers: Workers, service: EventService, raw: aioredis.Redis, prefix: str
) -> None:
    """A running fleet obeys a changed limit without restarting."""
    await service.set_limits(FlowJob, concurrency=1)
    names = ["a", "b"]
    for name in names:
        workers.start(name, "work", "--ms", "30", "--concurrency", "6")
    await started(raw, prefix, names)
    await enqueue(service, 400)
    await wait_for(lambda: _gt(done(raw, prefix), 20), timeout=30)
    assert int(await raw.get(f"{prefix}-test:max")) == 1
    await service.set_limits(FlowJob, concurrency=4)
    await wait_for(lambda: _equals(raw.get(f"{prefix}-test:max"), b"4"), timeout=10)
    await service.set_limits(FlowJob, concurrency=None)  # no limit: each process's 6
    await wait_for(lambda: _equals(done(raw, prefix), 400), timeout=60, interval=0.05)
    assert int(await raw.get(f"{prefix}-test:max")) > 4


async def test_throttled_metrics_reach_prometheus(redis_url: str, prefix: str) -> None:
    """Held-back claims are counted and timed, and a paused consumer shows in a gauge."""
    from prometheus_client import CollectorRegistry

    from delayq.prometheus import PrometheusMetrics

    registry = CollectorRegistry()
    svc = EventService.from_url(
        redis_url, prefix=prefix, metrics=PrometheusMetrics(registry), **FAST
    )
    handled: list[str] = []

    async def handle(event: FlowJob) -> None:
        handled.append(event.id)

    try:
        await svc.pause(FlowJob)
        svc.add_handler(FlowJob, handle, concurrency=2)
        await svc.start()
        await enqueue(svc, 3)
        labels = {"event_type": "flow-job"}

        def paused_gauge() -> bool:
            return registry.get_sample_value("delayq_paused", labels) == 1.0

        await wait_for(paused_gauge, timeout=15)
        assert handled == []
        await svc.resume(FlowJob)
        await wait_for(lambda: len(handled) == 3, timeout=15)
        await wait_for(lambda: registry.get_sample_value("delayq_paused", labels) == 0.0)
        group = {**labels, "group": "default"}
        assert registry.get_sample_value("delayq_throttled_total", group) >= 1
        waited = registry.get_sample_value(
            "delayq_throttled_time_seconds_count", {**group, "outcome": "paused"}
        )
        assert waited is not None and waited >= 1
    finally:
        await svc.aclose()


async def test_a_groups_limits_are_its_own(redis_url: str, prefix: str) -> None:
    """A concurrency limit on one delivery group holds there and nowhere else."""
    svc = EventService.from_url(redis_url, prefix=prefix, **FAST)
    running = {"default": 0, "audit": 0}
    peak = dict(running)
    done = dict(running)

    def handler(group: str):  # type: ignore[no-untyped-def]
        async def handle(event: FlowJob) -> None:
            running[group] += 1
            peak[group] = max(peak[group], running[group])
            await asyncio.sleep(0.02)
            running[group] -= 1
            done[group] += 1

        return handle

    try:
        await svc.set_limits(FlowJob, concurrency=1, group="audit")
        svc.add_handler(FlowJob, handler("default"), concurrency=6)
        svc.add_handler(FlowJob, handler("audit"), concurrency=6, group="audit")
        await svc.start()
        await wait_for(lambda: _equals(svc.groups(FlowJob), ["audit", "default"]), timeout=10)
        await enqueue(svc, 40)
        await wait_for(lambda: done == {"default": 40, "audit": 40}, timeout=60)
        assert peak["audit"] == 1 and peak["default"] > 1
    finally:
        await svc.aclose()


async def test_a_failure_frees_its_slot_with_a_wake_token(
    service: EventService, raw: aioredis.Redis, prefix: str
) -> None:
    """A failed delivery of a type with a concurrency limit wakes one waiting consumer at
    once, as an ack does (without it the waiter would sleep its 1 s fallback); a type
    without limits gets no token."""
    store = service.store
    wake = TypeKeys(prefix, "flow-job").wake()
    await enqueue(service, 3)
    # no limit: a failure pushes nothing
    _, (first,), _ = await store.deliveries.claim_limited("flow-job", [], 1, 5000)
    assert await store.deliveries.fail("flow-job", first, dead=False, delay_ms=0, error="E: x") == 1
    assert not await raw.exists(wake)
    await service.set_limits(FlowJob, concurrency=1)
    await raw.delete(wake)  # set_limits wakes every waiter: start from an empty list
    _, (held,), _ = await store.deliveries.claim_limited("flow-job", [], 1, 5000)
    _, claimed, throttle = await store.deliveries.claim_limited("flow-job", [], 1, 5000)
    assert claimed == [] and throttle is not None and throttle.reason == "concurrency"
    # a retry frees the slot: one token, which the next waiter's BLPOP takes at once
    assert (
        await store.deliveries.fail("flow-job", held, dead=False, delay_ms=60_000, error="E: x")
        == 1
    )
    assert await raw.llen(wake) == 1
    assert await store.deliveries.wait_for_flow("flow-job", 5.0)
    # and so does a dead letter
    _, (held,), throttle = await store.deliveries.claim_limited("flow-job", [], 1, 5000)
    assert throttle is None
    assert await store.deliveries.fail("flow-job", held, dead=True, delay_ms=0, error="E: x") == 2
    assert await raw.llen(wake) == 1


async def test_concurrency_gauges_reach_prometheus(redis_url: str, prefix: str) -> None:
    """A claim held back by the fleet-wide concurrency limit shows the live leases against
    the limit (``delayq_fleet_in_flight`` / ``delayq_concurrency_limit``) and its wait is
    timed with outcome ``concurrency``."""
    from prometheus_client import CollectorRegistry

    from delayq.prometheus import PrometheusMetrics

    registry = CollectorRegistry()
    svc = EventService.from_url(
        redis_url, prefix=prefix, metrics=PrometheusMetrics(registry), **FAST
    )
    release = asyncio.Event()
    handled: list[str] = []

    async def handle(event: FlowJob) -> None:
        await release.wait()
        handled.append(event.id)

    labels = {"event_type": "flow-job"}
    try:
        await svc.set_limits(FlowJob, concurrency=1)
        svc.add_handler(FlowJob, handle, concurrency=4)
        await svc.start()
        await enqueue(svc, 3)

        def gauges() -> bool:
            return (registry.get_sample_value("delayq_fleet_in_flight", labels) == 1.0
                    and registry.get_sample_value("delayq_concurrency_limit", labels) == 1.0)  # fmt: skip

        await wait_for(gauges, timeout=15)
        release.set()
        await wait_for(lambda: len(handled) == 3, timeout=15)
        waited = registry.get_sample_value(
            "delayq_throttled_time_seconds_count",
            {**labels, "group": "default", "outcome": "concurrency"},
        )
        assert waited is not None and waited >= 1
        assert (
            registry.get_sample_value("delayq_throttled_total", {**labels, "group": "default"}) >= 1
        )
    finally:
        await svc.aclose()


async def test_a_partitioned_types_gauges_add_up(redis_url: str, prefix: str) -> None:
    """On a partitioned type each held-back claim sees one partition's leases and share:
    the gauges add them up to the type's figures."""
    from prometheus_client import CollectorRegistry

    from delayq.prometheus import PrometheusMetrics

    hot = _hot(4)
    registry = CollectorRegistry()
    svc = EventService.from_url(
        redis_url, prefix=prefix, metrics=PrometheusMetrics(registry), **FAST
    )
    release = asyncio.Event()

    async def handle(event: Event) -> None:
        await release.wait()

    labels = {"event_type": "flow-hot"}
    try:
        await svc.set_limits(hot, concurrency=8)  # 2 per partition
        svc.add_handler(hot, handle, concurrency=32)
        await svc.start()
        await svc.enqueue_many([hot(id=f"h{i}") for i in range(80)])

        def gauges() -> bool:
            return (registry.get_sample_value("delayq_fleet_in_flight", labels) == 8.0
                    and registry.get_sample_value("delayq_concurrency_limit", labels) == 8.0)  # fmt: skip

        await wait_for(gauges, timeout=15)
        release.set()
    finally:
        await svc.aclose()
