"""Priority levels with several worker processes (``tests/priority_worker.py``) on a real
Redis, and on the 3-master cluster with a partitioned type (issue 34): levels are served in
order under load, aging lets a level-9 event through while level 0 is saturated, retries keep
their level, and priority holds within each partition.

The workers log each handler's start to a Redis list; the order of that list is the order in
which handlers started across the fleet. A claim never takes more entries than its free
handler slots, so an entry can start before a more urgent one claimed after it only while
those slots are busy: the checks allow at most two claims' worth of slots of inversion.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from priority_worker import Fleet, FleetPart
from redis.asyncio.cluster import RedisCluster

from delayq import EventService
from delayq.keys import TypeKeys
from delayq.partitions.shards import partition_of
from delayq.testing import wait_for
from delayq.testing.cluster import RedisClusterServer

WORKER = Path(__file__).with_name("priority_worker.py")
ROOT = Path(__file__).resolve().parents[1]


class Workers:
    """Starts worker processes and makes sure every one has ended when the test does."""

    def __init__(self, url: str, prefix: str, logs: Path, cluster: bool = False):
        self.url, self.prefix, self.logs, self.cluster = url, prefix, logs, cluster
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *extra: str) -> None:
        flags = ["--cluster"] if self.cluster else []
        with open(self.logs / f"{name}.log", "wb") as log:  # the child keeps its own copy
            self.procs[name] = subprocess.Popen(
                [sys.executable, str(WORKER), self.url, self.prefix, name, *flags, *extra],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return "\n".join(
            f"--- {name}\n" + (self.logs / f"{name}.log").read_text(errors="replace")
            for name in self.procs
        )

    async def stop_all(self, timeout: float = 15.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in self.procs.values()):
            if time.monotonic() > deadline:
                raise AssertionError("a worker ignored SIGTERM:\n" + self.output())
            await asyncio.sleep(0.05)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def workers(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(redis_url, prefix, tmp_path)
    try:
        yield w
    finally:
        w.close()


def _parse(entries: list[bytes]) -> list[tuple[str, int, int, str, int]]:
    """The log as (id, level, attempt, worker, unix ms), in handler start order."""
    out = []
    for entry in entries:
        event_id, level, attempt, name, ms = entry.decode().split("|")
        out.append((event_id, int(level), int(attempt), name, int(ms)))
    return out


def _worst_inversion(levels: list[int]) -> int:
    """The most entries of a less urgent level started before any one entry."""
    worst = 0
    for i, level in enumerate(levels):
        worst = max(worst, sum(1 for earlier in levels[:i] if earlier > level))
    return worst


async def _start(workers: Workers, client: Any, names: list[str], *extra: str) -> None:
    for name in names:
        workers.start(name, *extra)
    ready_key = "{" + workers.prefix + "-test}:ready"

    async def all_ready() -> bool:
        return await client.scard(ready_key) == len(names)

    await wait_for(all_ready, timeout=30, message="workers did not start:\n" + workers.output())


async def _log(client: Any, prefix: str) -> list[tuple[str, int, int, str, int]]:
    return _parse(await client.lrange("{" + prefix + "-test}:log", 0, -1))


async def test_levels_are_served_in_order_by_several_workers(
    redis_url: str, prefix: str, workers: Workers, redis_client: aioredis.Redis
) -> None:
    """3 processes x 2 handler slots; 300 events enqueued least urgent first while the type
    is paused, then resumed: every process serves them level by level."""
    await _start(workers, redis_client, ["w1", "w2", "w3"], "--sleep-ms", "3")
    producer = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    async with producer:
        await producer.pause(Fleet)
        for level in range(9, -1, -1):  # oldest first: due order alone would serve 9 first
            await producer.enqueue_many(
                [Fleet(id=f"{level}-{k}", level=level) for k in range(30)], priority=level
            )
        assert (await producer.stats_for(Fleet)).ready_by_priority == {n: 30 for n in range(10)}
        await producer.resume(Fleet)

        async def all_done() -> bool:
            return len(await _log(redis_client, prefix)) >= 300

        await wait_for(all_done, timeout=60, message=workers.output())
    await workers.stop_all()
    log = await _log(redis_client, prefix)
    assert sorted(e[0] for e in log) == sorted(f"{n}-{k}" for n in range(10) for k in range(30))
    assert len({e[3] for e in log}) == 3  # every process served
    levels = [e[1] for e in log]
    # 6 handler slots: at most two claims' worth of less urgent entries before any entry
    assert _worst_inversion(levels) <= 12, levels
    # and within a level, due order (each level was enqueued in k order)
    for level in range(10):
        ks = [int(e[0].split("-")[1]) for e in log if e[1] == level]
        assert _worst_inversion(ks) <= 12, (level, ks)


async def test_aging_lets_a_level_9_event_through_while_level_0_is_saturated(
    redis_url: str, prefix: str, workers: Workers, redis_client: aioredis.Redis
) -> None:
    """priority_aging=250 ms: a level-9 event competes as level 0 after 9 periods (2.25 s)
    and, due before every level-0 event, is then next. Level 0 gets new events faster than
    the two workers handle them the whole time."""
    aging = 0.25
    await _start(workers, redis_client, ["a1", "a2"], "--sleep-ms", "20")
    producer = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    async with producer:
        await producer.set_limits(Fleet, priority_aging=timedelta(seconds=aging))
        await producer.pause(Fleet)
        enqueued = time.time()
        await producer.enqueue_with_delay(Fleet(id="old", level=9), priority=9)
        await producer.enqueue_many([Fleet(id=f"z-{i}") for i in range(200)])
        await producer.resume(Fleet)
        feeding = True

        async def feed() -> None:  # ~500 level-0 events/s, the workers handle ~200/s
            n = 0
            while feeding:
                await producer.enqueue_many([Fleet(id=f"f-{n + i}") for i in range(25)])
                n += 25
                await asyncio.sleep(0.05)

        feeder = asyncio.create_task(feed())
        try:

            async def old_started() -> bool:
                return any(e[0] == "old" for e in await _log(redis_client, prefix))

            await wait_for(old_started, timeout=20, message=workers.output())
        finally:
            feeding = False
            await feeder
        ready = (await producer.stats_for(Fleet)).ready  # all at level 0 now
        await producer.pause(Fleet)  # the rest of the backlog is not this test's
    await workers.stop_all()
    log = await _log(redis_client, prefix)
    index = next(i for i, e in enumerate(log) if e[0] == "old")
    waited = log[index][4] / 1000 - enqueued
    # before 8 periods it competes as level 1 or worse, and level 0 was never empty
    assert 8 * aging - 0.1 <= waited <= 9 * aging + 1.5, waited
    assert index >= 100 and all(e[1] == 0 for e in log[:index])  # level 0 was served
    assert ready > 50  # and still saturated when the level-9 event went


async def test_retries_keep_their_level_across_workers(
    redis_url: str, prefix: str, workers: Workers, redis_client: aioredis.Redis
) -> None:
    """Each event's first delivery fails: its retry (after a 50 ms backoff, moved by the
    workers' schedulers) goes back to its own level's list, and still before less urgent
    work that was waiting all along."""
    await _start(workers, redis_client, ["r1", "r2"], "--sleep-ms", "2")
    producer = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    keys = TypeKeys(prefix, Fleet.event_name)
    async with producer:
        await producer.pause(Fleet)
        await producer.enqueue_many([Fleet(id=f"bg-{i}", level=9) for i in range(400)], priority=9)
        await producer.enqueue_many(
            [Fleet(id=f"u-{i}", level=2, fail=True) for i in range(20)], priority=2
        )
        await producer.resume(Fleet)

        async def retried() -> bool:
            return sum(1 for e in await _log(redis_client, prefix) if e[2] == 2) >= 20

        await wait_for(retried, timeout=30, message=workers.output())
        await producer.pause(Fleet)
    await workers.stop_all()
    log = await _log(redis_client, prefix)
    retries = [e for e in log if e[2] == 2]
    assert sorted(e[0] for e in retries) == sorted(f"u-{i}" for i in range(20))
    # every delivery of the level-2 events came from level 2's list: 20 pushes, 20 retries
    assert int(await redis_client.hget(keys.meta, "pushed:2") or 0) == 40
    # the retries went before the level-9 backlog, which was far from drained
    last_retry = max(i for i, e in enumerate(log) if e[2] == 2)
    assert sum(1 for e in log[:last_retry] if e[1] == 9) < 400 - 100


async def test_priority_holds_within_each_partition_on_a_cluster(
    cluster: RedisClusterServer, prefix: str, tmp_path: Path
) -> None:
    """A type with 3 partitions on the 3-master cluster: each partition serves its own
    levels in order (there is no order across partitions)."""
    workers = Workers(cluster.url, prefix, tmp_path, cluster=True)
    client = RedisCluster.from_url(cluster.url)
    try:
        await _start(workers, client, ["c1", "c2"], "--sleep-ms", "3")
        producer = EventService.from_url(
            cluster.url, cluster=True, prefix=prefix, enable_scheduling=False
        )
        async with producer:
            await producer.pause(FleetPart)
            for level in range(9, -1, -1):
                await producer.enqueue_many(
                    [FleetPart(id=f"{level}-{k}", level=level) for k in range(24)],
                    priority=level,
                )
            counts = await producer.stats_for(FleetPart)
            assert counts.ready_by_priority == {n: 24 for n in range(10)}
            await producer.resume(FleetPart)

            async def all_done() -> bool:
                return len(await _log(client, prefix)) >= 240

            await wait_for(all_done, timeout=60, message=workers.output())
        await workers.stop_all()
        log = await _log(client, prefix)
        assert len({e[0] for e in log}) == 240
        for partition in range(3):
            levels = [e[1] for e in log if partition_of(e[0], 3) == partition]
            assert len(levels) > 40  # the ids spread over the partitions
            # 4 handler slots in the fleet: two claims' worth at most
            assert _worst_inversion(levels) <= 8, (partition, levels)
    finally:
        workers.close()
        await client.aclose()
