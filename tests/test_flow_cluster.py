"""Flow limits on the 3-master Redis Cluster (issue 22): every key of a decision shares
the type's hash tag, so the claim script runs on one slot; partitioned types are refused."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from delayq import Event, EventService, FlowLimits
from delayq.keys import TypeKeys
from delayq.testing import wait_for
from delayq.testing.cluster import RedisClusterServer


class CFlow(Event, event_name="cflow-job"):
    n: int = 0


class CHot(Event, event_name="cflow-hot", partitions=6):
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

    opts = {"visibility_timeout": 5.0, "scheduling_interval": 0.2, "polling_timeout": 1.0}
    a = EventService.from_url(cluster.url, cluster=True, prefix=prefix, **opts)
    b = EventService.from_url(cluster.url, cluster=True, prefix=prefix, **opts)
    try:
        with pytest.raises(ValueError, match="partitioned"):
            await a.set_limits(CHot, concurrency=2)
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
        svc.add_handler(CHot, handle, concurrency=4)
        await svc.start()
        await wait_for(lambda: sum(k == "small" for k, _ in starts) == 12, timeout=60)
        # 6 partitions, each with big, small and '' in rotation: small's 12 come within
        # 12 x 3 turns per partition plus the partitions' share of slots (loose bound)
        assert len(starts) <= 6 * 3 * 12 // 2 + 6 * 4, len(starts)
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
