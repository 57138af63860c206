"""Flow limits on the 3-master Redis Cluster (issue 22): every key of a decision shares
the type's hash tag, so the claim script runs on one slot; a partitioned type's limits
are split between its partitions (spread over the masters), and the type-wide limit
holds because each partition's share holds (docs/FLOW.md, "Partitioned types").

The partitioned tests run three worker processes (``tests/flow_cluster_worker.py``)
that record each handler start with Redis's clock at its claim, and the fleet's running
count (an exact running maximum). No assert reads the wall clock.
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
from delayq.keys import PrefixKeys, TypeKeys
from delayq.partitions.shards import partition_of, shards
from delayq.testing import wait_for
from delayq.testing.cluster import RedisClusterServer

WORKER = Path(__file__).with_name("flow_cluster_worker.py")
ROOT = Path(__file__).resolve().parents[1]
OPTS = {"visibility_timeout": 5.0, "scheduling_interval": 0.2, "polling_timeout": 1.0}


class CFlow(Event, event_name="cflow-job"):
    n: int = 0


class CHot(Event, event_name="cflow-hot", partitions=6):
    n: int = 0


class PartJob(Event, event_name="cflow-part", partitions=6):
    """Same wire name and partitions as the workers' class."""

    n: int = 0


async def test_limits_and_pause_on_a_cluster(cluster: RedisClusterServer, prefix: str) -> None:
    running, peak, done = 0, 0, 0

    async def handle(event: CFlow) -> None:
        nonlocal running, peak, done
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1
        done += 1

    a = EventService.from_url(cluster.url, cluster=True, prefix=prefix, **OPTS)
    b = EventService.from_url(cluster.url, cluster=True, prefix=prefix, **OPTS)
    try:
        assert await a.set_limits(CFlow, concurrency=3) == FlowLimits(3)
        a.add_handler(CFlow, handle, concurrency=8)
        b.add_handler(CFlow, handle, concurrency=8)
        await a.start()
        await b.start()
        await a.enqueue_many([CFlow(id=str(i), n=i) for i in range(60)])
        await wait_for(lambda: done == 60, timeout=60)
        assert peak == 3  # two services, 16 local slots, 3 fleet-wide
        # the limits key lives on the type's slot, with its other keys
        client = aioredis.RedisCluster.from_url(cluster.url)
        try:
            tk = TypeKeys(prefix, "cflow-job")
            slots = {client.keyslot(k) for k in (*tk.view(), tk.limits(), tk.wake(), tk.dedup)}
            assert len(slots) == 1
        finally:
            await client.aclose()
        await a.pause(CFlow)
        assert (await b.stats_for(CFlow)).paused
        await a.enqueue_many([CFlow(id=f"p{i}") for i in range(5)])
        await asyncio.sleep(1.0)
        assert done == 60  # paused: nothing started
        await b.resume(CFlow)
        await wait_for(lambda: done == 65, timeout=30)
    finally:
        await b.aclose()
        await a.aclose()


# -- a partitioned type ------------------------------------------------------------------


@pytest.fixture
async def raw(cluster: RedisClusterServer) -> AsyncIterator[aioredis.RedisCluster]:
    client = aioredis.RedisCluster.from_url(cluster.url)
    yield client
    await client.aclose()


@pytest.fixture
async def service(cluster: RedisClusterServer, prefix: str) -> AsyncIterator[EventService]:
    svc = EventService.from_url(
        cluster.url, cluster=True, prefix=prefix, enable_scheduling=False, **OPTS
    )
    yield svc
    await svc.aclose()


@pytest.fixture
def workers(
    cluster: RedisClusterServer, prefix: str, tmp_path: Path
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def stop() -> None:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    yield procs
    stop()


def _start(procs: dict[str, subprocess.Popen[bytes]], url: str, prefix: str, logs: Path,
           names: list[str], *extra: str) -> None:  # fmt: skip
    for name in names:
        with open(logs / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, str(WORKER), url, prefix, name, *extra],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip


def _t(prefix: str) -> str:
    return "{" + prefix + "-test}"


async def _started(raw: aioredis.RedisCluster, prefix: str, n: int) -> None:
    async def all_ready() -> bool:
        return int(await raw.scard(f"{_t(prefix)}:ready")) == n

    await wait_for(all_ready, timeout=60, message="workers started")


async def _done(raw: aioredis.RedisCluster, prefix: str) -> int:
    return int(await raw.hlen(f"{_t(prefix)}:done"))


async def _starts(raw: aioredis.RedisCluster, prefix: str) -> list[tuple[int, str, str]]:
    out = []
    for entry in await raw.lrange(f"{_t(prefix)}:starts", 0, -1):
        us, rest = entry.decode().split(":", 1)
        event_id, name = rest.rsplit(":", 1)
        out.append((int(us), event_id, name))
    return sorted(out)


async def _enqueue(service: EventService, n: int, start: int = 0) -> None:
    await service.enqueue_many([(PartJob(id=f"e{i:05d}", n=i), 0) for i in range(start, start + n)])


async def test_partitioned_limits_are_split(
    service: EventService, raw: aioredis.RedisCluster, prefix: str
) -> None:
    """Each partition (on its own master) stores its share and the type's figure; the
    shares add up to the limit; limits() reads back what was set."""
    shard_list = shards("cflow-part", 6)
    limit_keys = [PrefixKeys(prefix).for_shard(s).limits() for s in shard_list]
    assert len({raw.keyslot(k) for k in limit_keys}) == 6
    got = await service.set_limits(PartJob, concurrency=9, rate="30/s")
    assert got == FlowLimits(9, Rate(30, 1000, 3)) == await service.limits("cflow-part")
    stored = [{k.decode(): v.decode() for k, v in (await raw.hgetall(k)).items()}
              for k in limit_keys]  # fmt: skip
    assert [int(f["concurrency"]) for f in stored] == [2, 2, 2, 1, 1, 1]
    # the bucket of 30/s is 3 starts; each of 6 partitions needs 1: 6 in force
    assert sum(int(f["burst"]) for f in stored) == 6
    # each partition: 30 starts per 6 s, i.e. 5/s, together 30/s
    assert {(f["rate_n"], f["rate_ms"]) for f in stored} == {("30", "6000")}
    with pytest.raises(ValueError, match="partitions"):
        await service.set_limits(PartJob, concurrency=5)  # below 6 partitions: 0 for some
    assert await service.set_limits(PartJob, rate=None) == FlowLimits(9)
    await service.pause(PartJob)
    assert all([await raw.hget(k, "paused") == b"1" for k in limit_keys])
    assert (await service.stats_for(PartJob)).paused
    assert await service.limits(PartJob) == FlowLimits(9, None, paused=True)
    await service.resume(PartJob)
    await service.set_limits(PartJob, concurrency=None)
    assert not any([await raw.exists(k) for k in limit_keys])


@pytest.mark.slow
async def test_partitioned_concurrency_fleet_wide(
    cluster: RedisClusterServer, service: EventService, raw: aioredis.RedisCluster,
    prefix: str, workers: dict[str, subprocess.Popen[bytes]], tmp_path: Path,
) -> None:  # fmt: skip
    """Concurrency 9 over 6 partitions and 3 processes × 8 local slots: never more than 9
    running fleet-wide (sampled continuously, and an exact running maximum), and a
    backlog spread over every partition uses (nearly) all 9."""
    await service.set_limits(PartJob, concurrency=9)
    _start(workers, cluster.url, prefix, tmp_path, ["a", "b", "c"], "--ms", "40")
    await _started(raw, prefix, 3)
    n = 360
    await _enqueue(service, n)
    samples: list[tuple[int, int]] = []  # (running, done)

    async def sampled() -> bool:
        running = int(await raw.get(f"{_t(prefix)}:running") or 0)
        handled = await _done(raw, prefix)
        samples.append((running, handled))
        return handled == n

    await wait_for(sampled, timeout=180, interval=0.005, message="all handled")
    peak = int(await raw.get(f"{_t(prefix)}:max"))
    assert max(r for r, _ in samples) <= 9 and peak <= 9, (peak, samples)
    assert peak >= 8, peak  # every partition at its share at once (or all but one)
    # shares 2, 2, 2, 1, 1, 1 and about 60 events per partition: until about half are
    # done every partition has a backlog and all 9 slots are in use; then the share-2
    # partitions run dry first (a limit that is not a multiple of the partition count
    # drains the partitions unevenly)
    busy = [r for r, d in samples if n // 20 <= d <= n * 2 // 5]
    print(f"peak {peak}, mean running while every partition is busy {sum(busy) / len(busy):.2f}")
    # (7.5 on a quiet machine, 5.2 at load 14, 4.4 in a CI run of three lanes at once:
    # the ack → wake token → claim hand-over of a freed slot takes longer on a loaded
    # machine). "Fully used" is the peak above; this bound only catches a limit that
    # starves its partitions (a share stuck at 0 or a lost wake-up: about 1-2 running)
    assert sum(busy) / len(busy) >= 3.0, (sum(busy) / len(busy), samples)
    assert {s[2] for s in await _starts(raw, prefix)} == {"a", "b", "c"}


@pytest.mark.slow
async def test_partitioned_rate_fleet_wide(
    cluster: RedisClusterServer, service: EventService, raw: aioredis.RedisCluster,
    prefix: str, workers: dict[str, subprocess.Popen[bytes]], tmp_path: Path,
) -> None:  # fmt: skip
    """30/s (bucket 12) over 6 partitions and 3 processes: no window above the summed
    buckets, and 30/s while every partition has a backlog."""
    # a bucket of 2 per partition: with 1 (the default's 3, raised to 6) a partition
    # loses the lateness of each wake-up of its consumers (24.7/s at load 8 here), as an
    # unpartitioned type with a bucket of 1 does
    limits = await service.set_limits(PartJob, rate="30/s burst 12")
    assert limits.rate is not None
    burst, interval_ms = limits.rate.burst, limits.rate.interval_ms
    _start(workers, cluster.url, prefix, tmp_path, ["a", "b", "c"], "--ms", "5")
    await _started(raw, prefix, 3)
    n = 180
    await _enqueue(service, n)

    async def all_done() -> bool:
        return await _done(raw, prefix) == n

    await wait_for(all_done, timeout=90, interval=0.05)
    got = await _starts(raw, prefix)
    times = [s[0] for s in got]
    assert len(times) == n
    # each partition's GCRA allows b_k + w / I_k (+1: the claim's ms rounding); summed,
    # burst + w / interval, + 1 per partition
    for i in range(n):
        for j in range(i + 1, n):
            w_ms = (times[j] - times[i]) / 1000
            if w_ms > 2000:
                break
            assert j - i + 1 <= burst + w_ms / interval_ms + 6, (i, j, w_ms)
    # while every partition still has a backlog (until the first runs dry) the type
    # runs at its full rate; a partition with fewer events finishes earlier
    last = {}
    for us, event_id, _ in got:
        last[partition_of(event_id, 6)] = us
    until = min(last.values())
    span_s = (until - times[0]) / 1e6
    within = sum(1 for t in times if t <= until)
    per_s = (within - burst) / span_s
    print(f"rate over {span_s:.2f} s with every partition busy: {per_s:.1f}/s")
    assert 25 <= per_s <= 31, per_s


@pytest.mark.slow
async def test_partitioned_pause_under_load_and_resume(
    cluster: RedisClusterServer, service: EventService, raw: aioredis.RedisCluster,
    prefix: str, workers: dict[str, subprocess.Popen[bytes]], tmp_path: Path,
) -> None:  # fmt: skip
    """pause() writes every partition: no handler starts after it returns (except for
    events claimed before); resume brings every partition back."""
    _start(workers, cluster.url, prefix, tmp_path, ["a", "b", "c"], "--ms", "20",
           "--concurrency", "4")  # fmt: skip
    await _started(raw, prefix, 3)
    await _enqueue(service, 300)

    async def some_done() -> bool:
        return await _done(raw, prefix) > 30

    await wait_for(some_done, timeout=60)
    await service.pause(PartJob)
    sec, usec = await raw.time(target_nodes=aioredis.RedisCluster.RANDOM)  # one machine's clock
    paused_at_us = sec * 1_000_000 + usec
    assert (await service.stats_for(PartJob)).paused
    await _enqueue(service, 30, start=300)  # still accepted while paused
    last = {"n": -1, "t": 0.0}

    async def quiet() -> bool:
        n, now = await _done(raw, prefix), time.monotonic()
        if n != last["n"]:
            last.update(n=n, t=now)
            return False
        return now - last["t"] >= 1.5

    await wait_for(quiet, timeout=30, interval=0.1)
    late = [s for s in await _starts(raw, prefix) if s[0] > paused_at_us]
    assert late == []
    assert int(last["n"]) < 330
    await service.resume(PartJob)
    assert not (await service.stats_for(PartJob)).paused

    async def all_done() -> bool:
        return await _done(raw, prefix) == 330

    await wait_for(all_done, timeout=60, interval=0.05)


async def test_flow_keys_on_a_cluster_with_a_partitioned_type(
    cluster: RedisClusterServer, prefix: str
) -> None:
    """Keyed events of a partitioned type on the 3-master cluster: each partition rotates
    over its own keys (all its flow-key state on its slot), every event is handled once,
    and a small key is not held up by a big one in any partition."""
    starts: list[tuple[str | None, str]] = []

    async def handle(event: CHot) -> None:
        from delayq import current_delivery

        d = current_delivery()
        assert d is not None
        starts.append((d.flow_key, event.id))

    opts = {"visibility_timeout": 5.0, "scheduling_interval": 0.2, "polling_timeout": 1.0}
    svc = EventService.from_url(cluster.url, cluster=True, prefix=prefix, **opts)
    try:
        await svc.enqueue_many([CHot(id=f"a{i}") for i in range(3000)], key="big")
        await svc.enqueue_many([CHot(id=f"b{i}") for i in range(12)], key="small")
        # no key: key "" (a plain enqueue to a keyed type goes through the scheduler)
        await svc.enqueue_many([CHot(id=f"n{i}") for i in range(12)])
        assert (await svc.stats_for(CHot)).due == 3024
        # every event ready before any handler runs: the bound below is on the rotation,
        # not on how far the scheduler's batches (250 a call) run ahead of the handlers
        async with EventService.from_url(cluster.url, cluster=True, prefix=prefix, **opts):

            async def all_ready() -> bool:
                return (await svc.stats_for(CHot)).ready == 3024

            await wait_for(all_ready, timeout=60)
        svc.add_handler(CHot, handle, concurrency=4)
        await svc.start()
        await wait_for(lambda: sum(k == "small" for k, _ in starts) == 12, timeout=60)
        # each partition rotates over its keys (big, small, ''): among that partition's
        # starts, small's j-th comes within 3·j, plus the handler slots (4) that claims
        # in flight may hold. (Across partitions the order depends on which partition's
        # fetcher gets the free slots first, which a loaded machine shuffles: one CI run
        # saw 264 starts in all before small's 12th; that bound is only "not starved".)
        by_partition: dict[int, list[str | None]] = {}
        for key, event_id in starts:
            by_partition.setdefault(partition_of(event_id, 6), []).append(key)
        for partition, keys in by_partition.items():
            smalls = [i + 1 for i, key in enumerate(keys) if key == "small"]
            for j, position in enumerate(smalls, 1):
                assert position <= 3 * j + 4, (partition, j, position, keys[:40])
        assert len(starts) < 1000, len(starts)
        await wait_for(lambda: len(starts) == 3024, timeout=120)
        assert len({e for _, e in starts}) == 3024
        client = aioredis.RedisCluster.from_url(cluster.url)
        try:
            tk = TypeKeys(prefix, "cflow-hot", 0, 6)
            keys = (*tk.view(), tk.limits(), tk.fkeys, *tk.key_lines())
            assert len({client.keyslot(k) for k in keys}) == 1
        finally:
            await client.aclose()
    finally:
        await svc.aclose()
