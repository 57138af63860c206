"""EventService on a real 3-master Redis Cluster: same code, keys spread by type."""

from __future__ import annotations

import redis
from redis.crc import key_slot

from delayq import Event, EventService, fixed
from delayq.keys import TypeKeys
from delayq.testing import wait_for
from delayq.testing.cluster import RedisClusterServer


class ClusterOrder(Event, event_name="cluster-order"):
    n: int


class ClusterInvoice(Event, event_name="cluster-invoice"):
    n: int


class ClusterRefund(Event, event_name="cluster-refund"):
    n: int


def _spread_prefix(base: str, types: tuple[type[Event], ...]) -> str:
    """A prefix under which the types' keys live on as many different nodes as types."""
    for i in range(10_000):
        candidate = f"{base}-{i}"
        slots = {key_slot(TypeKeys(candidate, t.event_name).scheduled.encode()) for t in types}
        if len({slot * 3 // 16384 for slot in slots}) == len(types):
            return candidate
    raise AssertionError("no spreading prefix found")


async def test_events_of_several_types_are_delivered_across_nodes(
    cluster: RedisClusterServer, prefix: str
) -> None:
    types = (ClusterOrder, ClusterInvoice, ClusterRefund)
    prefix = _spread_prefix(prefix, types)
    client = redis.cluster.RedisCluster.from_url(cluster.url)
    try:
        nodes = {
            client.get_node_from_key(TypeKeys(prefix, t.event_name).events).port for t in types
        }
    finally:
        client.close()
    assert len(nodes) == 3  # one hash tag per type: types live on different nodes
    seen: dict[str, set[str]] = {t.event_name: set() for t in types}

    def handler_for(name: str):  # type: ignore[no-untyped-def]
        async def handle(event: Event) -> None:
            seen[name].add(event.id)

        return handle

    async with EventService.from_url(cluster.url, cluster=True, prefix=prefix) as service:
        for t in types:
            service.add_handler(t, handler_for(t.event_name), concurrency=4)
        for t in types:
            results = await service.enqueue_many(
                [(t(id=f"{t.event_name}-{i}", n=i), 0.05 * (i % 5)) for i in range(300)]
            )
            assert all(results)
        assert not await service.enqueue_with_delay(ClusterOrder(id="cluster-order-1", n=1), 0)
        await wait_for(lambda: all(len(s) == 300 for s in seen.values()), timeout=20)
        stats = await service.stats()
    assert {name: (c.scheduled, c.ready, c.in_flight, c.dead) for name, c in stats.items()} == {
        t.event_name: (0, 0, 0, 0) for t in types
    }


async def test_retries_dead_letters_and_requeue_on_a_cluster(
    cluster: RedisClusterServer, prefix: str
) -> None:
    attempts: dict[str, int] = {}

    async def flaky(event: ClusterOrder) -> bool:
        attempts[event.id] = attempts.get(event.id, 0) + 1
        return attempts[event.id] > 3

    async with EventService.from_url(
        cluster.url, cluster=True, prefix=prefix, retry_attempts=1, retry_backoff=fixed(0.05)
    ) as service:
        service.add_handler(ClusterOrder, flaky)
        await service.enqueue_with_delay(ClusterOrder(id="o-1", n=1), 0.1)

        async def dead() -> int:
            return (await service.stats_for(ClusterOrder)).dead

        await wait_for(dead, timeout=10)
        (letter,) = await service.dead_letters(ClusterOrder)
        assert (letter.id, letter.attempts) == ("o-1", 2)
        assert letter.error.startswith("ReturnedFalse")
        assert await service.requeue_dead_letters(ClusterOrder) == 1
        await wait_for(lambda: attempts["o-1"] == 4, timeout=10)

        async def settled() -> bool:
            c = await service.stats_for(ClusterOrder)
            return (c.scheduled, c.ready, c.in_flight, c.dead) == (0, 0, 0, 0)

        await wait_for(settled, timeout=10)
