"""``delayq_batches{state=open|waiting|stuck}``: the batches not done yet, counted through
``service.batch_counts()`` at scrape time (no cap); the batch shards' relay work as the
``event_type="delayq:batch"`` series of the relay gauges; a prefix without batches costs
one ``SMEMBERS``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import TypeVar

import pytest
from core_support import ServicePool
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from test_prometheus import Monitor

from delayq import BATCH_TYPE, BatchCounts, Event, EventService
from delayq.keyspace.shards import batch_shard
from delayq.prometheus import QueueDepthCollector, make_asgi_app, read_batches
from delayq.testing import RedisServer


class PromMember(Event, event_name="obs-prom-member"):
    """A batch member."""


T = TypeVar("T")


class PromDone(Event, event_name="obs-prom-batch-done"):
    """A batch's callback."""


def _family(exposition: str | tuple[bytes, str], name: str) -> dict[str, float]:
    text = exposition if isinstance(exposition, str) else exposition[0].decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == name]
    label = "state" if name == "delayq_batches" else "event_type"
    return {s.labels[label]: s.value for s in family.samples}


def _gauge(exposition: str | tuple[bytes, str]) -> dict[str, float]:
    return _family(exposition, "delayq_batches")


@pytest.fixture
async def service(private_server: RedisServer, prefix: str) -> AsyncIterator[EventService]:
    pool = ServicePool(private_server.url, prefix)
    try:
        yield await pool.start(heartbeat_interval=0)
    finally:
        await pool.aclose()


async def test_open_waiting_and_stuck_batches_are_counted(service: EventService, wait_for) -> None:
    app = make_asgi_app(service, registry=CollectorRegistry(), cache_seconds=0)
    assert _gauge(await app.render()) == {"open": 0, "waiting": 0, "stuck": 0}
    async with service.batch(name="done") as done:  # empty: done when closed
        pass
    assert (await service.batch_info(done.id)).state == "done"
    assert _gauge(await app.render()) == {"open": 0, "waiting": 0, "stuck": 0}
    for n in range(2):
        async with service.batch() as waiting:
            await waiting.enqueue_with_delay(PromMember(id=f"w{n}"), 3600)
    async with service.batch() as open_:
        await open_.enqueue_with_delay(PromMember(id="o1"), 3600)
        assert _gauge(await app.render()) == {"open": 1, "waiting": 2, "stuck": 0}
    assert _gauge(await app.render()) == {"open": 0, "waiting": 3, "stuck": 0}
    app.close()
    # waiting with no member finished for longer than batch_stuck_after: stuck
    registry = CollectorRegistry()
    collector = QueueDepthCollector(
        service, cache_seconds=0, batch_stuck_after=timedelta(milliseconds=50)
    )
    registry.register(collector)

    async def stuck() -> bool:
        await collector.refresh()
        return _gauge(generate(registry)) == {"open": 0, "waiting": 0, "stuck": 3}

    await wait_for(stuck)
    counts = await read_batches(service)
    assert (counts.open, counts.waiting, counts.stuck, counts.done) == (0, 3, 0, 1)
    assert [b.id for b in await service.batches("stuck", stuck_after=0.05)] == [
        b.id for b in await service.batches("waiting")
    ]


def generate(registry: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()


async def test_a_prefix_without_batches_costs_one_smembers(
    private_server: RedisServer, prefix: str
) -> None:
    """No batch: one ``SMEMBERS`` (the batch shards in use: none), for the counts and for a
    listing alike; with batches, one ``batch_counts.lua`` per batch shard in use,
    pipelined, and a listing reads each shard once and each batch listed once."""
    pool = ServicePool(private_server.url, prefix)
    try:
        service = pool.producer()  # nothing in the background: every command is ours
        async with Monitor(private_server) as monitor:
            assert await read_batches(service) == BatchCounts(0, 0, 0, 0, 0, 0.0, 0)
            assert await service.batches() == []
            none = await monitor.counts()
        assert none == {"SMEMBERS": 2}
        async with service.batch() as batch:
            await batch.enqueue_with_delay(PromMember(id="m"), 3600)
        await read_batches(service)  # loads the scripts: what follows is the steady state
        await service.batches()
        async with Monitor(private_server) as monitor:
            counts = await read_batches(service)
            (listed,) = await service.batches()
            some = await monitor.counts()
    finally:
        await pool.aclose()
    assert (counts.open, counts.waiting, counts.stuck, counts.shards) == (0, 1, 0, 1)
    assert listed.id == batch.id
    # the counts: SMEMBERS, batch_counts.lua; the listing: SMEMBERS, batch_list.lua,
    # batch_info.lua
    assert some == {"SMEMBERS": 2, "EVALSHA": 3}


async def test_counts_do_not_stop_at_a_thousand(service: EventService, wait_for) -> None:
    """1,001 batches open at once and as many waiting: counted, not listed."""
    n = 1001
    room = asyncio.Semaphore(32)  # (the client's connection pool is bounded)

    async def bounded(step: Awaitable[T]) -> T:
        async with room:
            return await step

    async with AsyncExitStack() as stack:
        opened = await asyncio.gather(
            *(bounded(stack.enter_async_context(service.batch())) for _ in range(n))
        )
        counts = await service.batch_counts()
        assert (counts.open, counts.waiting, counts.stuck) == (n, 0, 0)
        await asyncio.gather(
            *(
                bounded(b.enqueue_with_delay(PromMember(id=f"k{i}"), 3600))
                for i, b in enumerate(opened)
            )
        )
    counts = await read_batches(service)
    assert (counts.open, counts.waiting, counts.stuck, counts.done) == (0, n, 0, 0)
    assert counts.shards == len({batch_shard(b.id) for b in opened})

    # a waiting batch idle past stuck_after counts as stuck, not as waiting
    async def all_stuck() -> bool:
        counts = await service.batch_counts(stuck_after=timedelta(milliseconds=1))
        return (counts.open, counts.waiting, counts.stuck) == (0, 0, n)

    await wait_for(all_stuck)
    # a listing carries a few failed ids at most; batch_info() up to 1,000 (not here)
    assert len(await service.batches(limit=1000)) == 1000


async def test_relay_gauges_show_the_batch_shards(
    private_server: RedisServer, prefix: str, wait_for
) -> None:
    """A done batch whose completion no relay hands on (no worker runs): the batch shards'
    relay backlog and lag, labelled ``event_type="delayq:batch"``; gone once a worker's
    relay hands it to the callback."""
    pool = ServicePool(private_server.url, prefix)
    try:
        producer = pool.producer()
        app = make_asgi_app(producer, registry=CollectorRegistry(), cache_seconds=0)
        assert BATCH_TYPE not in _family(await app.render(), "delayq_relay_backlog")
        async with producer.batch(on_complete=PromDone(id="cb")) as batch:
            pass  # empty: done when closed, its completion waits for the relay
        assert (await producer.batch_info(batch.id)).state == "done"

        async def lagging() -> bool:
            exposition = await app.render()
            backlog = _family(exposition, "delayq_relay_backlog")
            return backlog.get(BATCH_TYPE) == 1 and (
                _family(exposition, "delayq_relay_lag_seconds")[BATCH_TYPE] > 0
            )

        await wait_for(lagging)

        async def done(event: PromDone) -> None:
            pass

        worker = pool.make()
        worker.add_handler(PromDone, done)
        await worker.start()

        async def relayed() -> bool:
            exposition = await app.render()
            return _family(exposition, "delayq_relay_backlog")[BATCH_TYPE] == 0 and (
                _family(exposition, "delayq_relay_lag_seconds")[BATCH_TYPE] == 0
            )

        await wait_for(relayed)
        app.close()
    finally:
        await pool.aclose()


async def test_listing_and_counts_on_a_cluster(cluster, prefix: str) -> None:
    """The batch shards spread over the 3 masters: one listing and one count read every
    shard in use, each on its node."""
    service = EventService.from_url(
        cluster.url, cluster=True, prefix=prefix, enable_scheduling=False
    )
    try:
        assert await service.batches() == []
        opened = []
        for n in range(24):  # enough to use most of the 16 shards
            async with service.batch(name=f"c{n}") as batch:
                if n % 2:
                    await batch.enqueue_with_delay(PromMember(id=f"c{n}"), 3600)
            opened.append(batch.id)
        in_use = {batch_shard(b) for b in opened}
        assert len(in_use) > 8
        listed = await service.batches(limit=1000)
        assert sorted(b.id for b in listed) == sorted(opened)
        created = [b.created_at for b in listed]
        assert created == sorted(created, reverse=True)  # newest first
        counts = await service.batch_counts()
        assert (counts.open, counts.waiting, counts.stuck, counts.done) == (0, 12, 0, 12)
        assert counts.shards == len(in_use)
    finally:
        await service.aclose()
