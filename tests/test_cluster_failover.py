"""Cluster master failovers under a steady stream (issue 37, defect 5 and its fault suite).

A 3-master cluster with a replica each (``cluster-node-timeout`` 2000 ms,
``cluster-require-full-coverage no`` as docs/RELIABILITY.md advises), two worker
processes (tests/cluster_fault_worker.py) handling ``cf-hot`` (6 partitions, two per
master) and this process enqueueing ~100 events/s, each due 0.3-1.2 s later. Each master
in turn, the ``{prefix}`` one (scheduler lock, schedulers' membership) included, is
killed with SIGKILL; its replica is promoted and the old master rejoins as a replica.
Then a ``CLUSTER FAILOVER``. Checked from the recorder (a plain Redis no fault touches):

- every enqueue that returned is handled, except what the kill took before the
  replica had it (asynchronous replication: polled from outside, see
  ``failover_kit.Replication``; the count is printed);
- a handler runs again only inside a fault's window (a lost ack or claim comes back
  through its lease);
- the partitions on masters the fault did not touch keep moving: their events due
  during the outage are handled before the replica is promoted (an ordering, read from
  the recorder: before the fix, a failure on the ``{prefix}`` node failed the whole
  pass of every partition and backed off up to 5 s, so they waited for the promotion).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
import redis.asyncio as aioredis
from failover_kit import (
    Fleet,
    Hot,
    Producer,
    Records,
    Replication,
    Tick,
    now_ms,
    shard_of,
    shard_ports,
)

from delayq import EventService
from delayq.testing import RedisServer, wait_for
from delayq.testing.cluster import ClusterFailover, RedisClusterServer
from delayq.testing.sentinel import RedisSentinelSet

NODE_TIMEOUT_MS = 2000
VISIBILITY_MS = 3000  # the workers' visibility_timeout
# an untouched partition's event due this long before the promotion must have been
# handled before it (its lateness is a few ms, up to ~0.5 s on a loaded 2-core host
# during the fault; before the fix, 3.6-6.4 s: it waited for the promotion)
MARGIN_MS = 1000
QUIET = ("moving partitions failed", "scheduler pass failed")


@pytest.fixture
def failover_cluster() -> Iterator[RedisClusterServer]:
    """A 3-master cluster with a replica per master (each test kills nodes)."""
    with RedisClusterServer(
        3, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS,
        config={"cluster-require-full-coverage": "no"},
    ) as cluster:  # fmt: skip
        yield cluster


@pytest.fixture
async def recorder() -> AsyncIterator[aioredis.Redis]:
    """The recorder the handlers write to, outside the cluster."""
    with RedisServer() as server:
        client = aioredis.Redis.from_url(server.url)
        try:
            yield client
        finally:
            await client.aclose()


@dataclass
class Phase:
    """One fault, on the recorder's clock (ms)."""

    kind: str
    touched: set[str]  # the shards on the failed master
    start_ms: int
    promoted_ms: int
    ok_ms: int
    acked_until: int  # enqueues that returned before this had reached the replica

    @classmethod
    def of(cls, kind: str, touched: set[str], fault: ClusterFailover, acked: int) -> Phase:
        wall = time.time() - time.monotonic()
        ms = [int((t + wall) * 1000) for t in (fault.started, fault.promoted, fault.ok)]
        return cls(kind, touched, ms[0], ms[1], ms[2], acked)


async def _steady(rec: aioredis.Redis, more: int = 100, timeout: float = 20.0) -> None:
    """Wait until ``more`` further events were handled (the stream flows)."""
    target = await rec.hlen("starts") + more
    await wait_for(lambda: _at_least(rec, target), timeout=timeout)


async def _at_least(rec: aioredis.Redis, n: int) -> bool:
    return int(await rec.hlen("starts")) >= n


async def _ticks_at_least(rec: aioredis.Redis, n: int) -> bool:
    records = await Records.read(rec)
    return sum(i.startswith("tick@") for i in records.starts) >= n


async def _fault(cluster: RedisClusterServer, prefix: str, kind: str, master: RedisServer) -> Phase:
    touched = {s for s, port in shard_ports(cluster, prefix).items() if port == master.port}
    assert len(touched) == 2
    if kind == "kill":
        replication = Replication(master.port, cluster.replica_of(master).port)
        replication.start()
        await asyncio.sleep(0.1)  # (a few polls before the kill)
        fault = await asyncio.to_thread(cluster.kill_master, master)
        await replication.stop()
        phase = Phase.of(kind, touched, fault, replication.acked_until)
        await asyncio.to_thread(cluster.rejoin, master)
    else:
        fault = await asyncio.to_thread(cluster.failover, master)
        phase = Phase.of(kind, touched, fault, 1 << 62)  # nothing may be lost
    return phase


def _may_be_lost(event_id: str, returned_at: int, phases: list[Phase]) -> bool:
    """Whether a kill took the event before the master's replica had it."""
    return any(
        p.kind == "kill" and shard_of(event_id) in p.touched
        and p.acked_until <= returned_at <= p.promoted_ms
        for p in phases
    )  # fmt: skip


def _check(producer: Producer, records: Records, phases: list[Phase]) -> dict[str, int]:
    returned = producer.returned
    # 1. handled, but for what a kill took before the replica had it
    lost = [i for i in returned if records.starts[i] == 0]
    for event_id in lost:
        assert _may_be_lost(event_id, returned[event_id][1], phases), (
            f"{event_id} had reached the replica, yet was lost")  # fmt: skip
    # 2. runs again only inside a fault's window
    for event_id, ms in records.extra_starts:
        t0 = phases[0].start_ms
        assert any(p.start_ms <= ms <= p.ok_ms + VISIBILITY_MS + 3000 for p in phases), (
            event_id, shard_of(event_id), "runs at", ms - t0,
            "first", records.first_start[event_id] - t0,
            "due/returned", [x - t0 for x in returned.get(event_id, (0, 0))],
            "phases", [(p.kind, sorted(p.touched), p.start_ms - t0, p.ok_ms - t0) for p in phases],
        )  # fmt: skip
    # 3. the untouched partitions kept moving while the failed master was away
    untouched_due = untouched_waited = 0
    for p in phases:
        if p.kind != "kill":
            continue
        # each event's due time on the queue's clock: its start less its own lateness (the
        # producer's note is early by its enqueue call, which a loaded host stretches)
        due_at = {i: records.first_start[i] - records.lateness[i] for i in returned
                  if i in records.first_start}  # fmt: skip
        due = [i for i, d in due_at.items()
               if shard_of(i) not in p.touched and p.start_ms < d <= p.promoted_ms - MARGIN_MS]  # fmt: skip
        assert len(due) > 50, (p, len(due))
        waited = sorted((records.lateness[i], i) for i in due
                        if records.first_start[i] >= p.promoted_ms)  # fmt: skip
        # before the fix all of them waited (154 of 154). Some may on a loaded host: a
        # CI lane at load 14 saw 46 of 130 wait, ~2.5 s late, when the promotion took
        # longer than the scheduler's lease (the lock's time to live). How late they are
        # is benchmarks/cluster_failover.py's figure, not this test's
        assert len(waited) <= 0.5 * len(due), (
            f"phase {p.kind} at {p.start_ms}, promoted {p.promoted_ms}: {len(waited)} of {len(due)} untouched events waited for the promotion: {waited[-5:]}")  # fmt: skip
        untouched_due += len(due)
        untouched_waited += len(waited)
    return {"returned": len(returned), "lost": len(lost), "extra": len(records.extra_starts),
            "untouched_waited": untouched_waited,
            "untouched_due_in_outage": untouched_due, "failed_enqueues": producer.failed}  # fmt: skip


@pytest.mark.slow
async def test_kill_each_master_in_turn_then_a_planned_failover(
    failover_cluster: RedisClusterServer, recorder: aioredis.Redis, prefix: str
) -> None:
    cluster = failover_cluster
    rec_url = f"redis://127.0.0.1:{recorder.connection_pool.connection_kwargs['port']}/0"
    fleet = Fleet(cluster.url, rec_url, prefix, cluster=True)
    producer = Producer(EventService.from_url(cluster.url, cluster=True, prefix=prefix,
                                              enable_scheduling=False))  # fmt: skip
    phases: list[Phase] = []
    try:
        fleet.spawn(2)
        await fleet.ready(recorder)
        prefix_master = cluster.node_for_key("{" + prefix + "}")
        order = [prefix_master] + [m for m in cluster.masters() if m is not prefix_master]
        async with asyncio.TaskGroup() as tg:
            tg.create_task(producer.run())
            for master in order:
                await _steady(recorder)
                phases.append(await _fault(cluster, prefix, "kill", master))
            await _steady(recorder)
            phases.append(await _fault(cluster, prefix, "failover",
                                       cluster.node_for_key("{" + prefix + "}")))  # fmt: skip
            await _steady(recorder)
            producer.stop()

        async def settled() -> bool:
            records = await Records.read(recorder)
            return all(records.starts[i] or _may_be_lost(i, at, phases)
                       for i, (_, at) in producer.returned.items())  # fmt: skip

        await wait_for(settled, timeout=60, interval=0.2)
        # a lost ack or claim of the last fault comes back when its lease ends
        last = max(p.ok_ms for p in phases) + VISIBILITY_MS + 1000
        await wait_for(lambda: now_ms() > last, timeout=VISIBILITY_MS / 1000 + 30)
        records = await Records.read(recorder)
        figures = _check(producer, records, phases)
        print(figures, [(p.kind, p.promoted_ms - p.start_ms) for p in phases])
        logs = fleet.tail(10**7)
        for text in QUIET:  # no pass failed as a whole (a failure is its partition's alone)
            assert text not in logs, logs[-6000:]
    finally:
        producer.stop()
        fleet.close()
        await producer.service.aclose()


TICK_EVERY = 0.5  # the schedule's interval (s)
LIMIT = 6  # the fleet-wide concurrency limit of cf-hot (one per partition)


@pytest.fixture(params=["cluster", "sentinel"])
def queue(request: pytest.FixtureRequest) -> Iterator[RedisClusterServer | RedisSentinelSet]:
    """A cluster with replicas, or a Sentinel set."""
    if request.param == "cluster":
        with RedisClusterServer(
            3, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS,
            config={"cluster-require-full-coverage": "no"},
        ) as cluster:  # fmt: skip
            yield cluster
    else:
        with RedisSentinelSet() as sentinels:
            yield sentinels


@pytest.mark.slow
async def test_schedules_and_limits_through_planned_failovers(
    queue: RedisClusterServer | RedisSentinelSet, recorder: aioredis.Redis, prefix: str
) -> None:
    """A schedule every 0.5 s and a fleet-wide ``concurrency=6`` on a saturated type,
    through two planned failovers (``CLUSTER FAILOVER`` of the ``{prefix}`` master, then
    of another; or two ``SENTINEL FAILOVER``\\ s): each slot fires once, none is missed,
    and no more than 6 handlers ever run at once, as the recorder counts them."""
    is_cluster = isinstance(queue, RedisClusterServer)
    rec_url = f"redis://127.0.0.1:{recorder.connection_pool.connection_kwargs['port']}/0"
    fleet = Fleet(queue.url, rec_url, prefix, cluster=is_cluster, handler_ms=100.0)
    service = EventService.from_url(queue.url, cluster=is_cluster, prefix=prefix,
                                    enable_scheduling=False)  # fmt: skip
    # ~60 events/s, each handler 100 ms: more than 6 at once would run if the limit let them
    producer = Producer(service, rate=60.0, delay=(0.05, 0.3))
    try:
        await service.set_limits(Hot, concurrency=LIMIT)
        # "allow": a fire does not wait for the previous one (a skip is no fault's doing)
        await service.schedule("tick", Tick, every=TICK_EVERY, overlap="allow",
                               catch_up=timedelta(seconds=30))  # fmt: skip
        fleet.spawn(2)
        await fleet.ready(recorder)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(producer.run())
            await _steady(recorder, 60)
            for _ in range(2):
                if isinstance(queue, RedisClusterServer):
                    master = queue.node_for_key("{" + prefix + "}")
                    if _:  # the second: a master the {prefix} keys do not live on
                        master = next(m for m in queue.masters() if m is not master)
                    await asyncio.to_thread(queue.failover, master)
                else:
                    old = queue.master()
                    await asyncio.to_thread(queue.failover)
                    await wait_for(lambda o=old: queue.master() is not o, timeout=30)
                    await asyncio.to_thread(queue.wait_stable)
                await _steady(recorder, 60)
            # the producer's pace sets the run's length, not the schedule's: fast failovers
            # left room for only 9 slots; run on until the schedule has fired enough
            await wait_for(lambda: _ticks_at_least(recorder, 12), timeout=30, interval=0.2)
            producer.stop()

        async def handled() -> bool:
            records = await Records.read(recorder)
            return all(records.starts[i] for i in producer.returned)

        await wait_for(handled, timeout=60, interval=0.2)
        records = await Records.read(recorder)
        ticks = sorted(i for i in records.starts if i.startswith("tick@"))
        slots = sorted(datetime.fromisoformat(i.split("@", 1)[1]).timestamp() for i in ticks)
        print({"hot": len(producer.returned), "ticks": len(ticks),
               "max_running": records.max_running, "extra": len(records.extra_starts)})  # fmt: skip
        assert len(slots) >= 10
        # every slot between the first and the last fired, each once
        steps = {round((b - a) / TICK_EVERY) for a, b in itertools.pairwise(slots)}
        assert steps == {1}, ticks
        assert all(records.starts[i] == 1 for i in ticks), records.starts
        # the limit held, measured from outside; and it was reached (the test had teeth)
        assert records.max_running["cf-hot"] == LIMIT, records.max_running
        # planned failovers lose nothing and run nothing twice
        assert not records.extra_starts, records.extra_starts[:10]
    finally:
        producer.stop()
        fleet.close()
        await service.aclose()
