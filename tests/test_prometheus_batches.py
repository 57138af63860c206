"""``delayq_batches{state=open|waiting|stuck}``: the batches not done yet, read through
``service.batches()`` at scrape time; a prefix without batches costs one listing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from core_support import ServicePool
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from test_prometheus import Monitor

from delayq import Event, EventService
from delayq.keyspace.shards import BATCH_SHARDS
from delayq.prometheus import QueueDepthCollector, make_asgi_app, read_batches
from delayq.testing import RedisServer


class PromMember(Event, event_name="obs-prom-member"):
    """A batch member."""


def _gauge(exposition: str | tuple[bytes, str]) -> dict[str, float]:
    text = exposition if isinstance(exposition, str) else exposition[0].decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "delayq_batches"]
    return {s.labels["state"]: s.value for s in family.samples}


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
    assert await read_batches(service) == {"open": 0, "waiting": 3, "stuck": 0}


def generate(registry: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()


async def test_a_prefix_without_batches_costs_one_listing(
    private_server: RedisServer, service: EventService
) -> None:
    """No batch: one ``service.batches(limit=1)`` (a read-only script per batch shard);
    with batches, the open and waiting listings too."""
    await service.batches(limit=1)  # loads the listing script: what follows is steady
    async with Monitor(private_server) as monitor:
        assert await read_batches(service) == {"open": 0, "waiting": 0, "stuck": 0}
        none = await monitor.counts()
    assert none == {"EVALSHA": BATCH_SHARDS}
    async with service.batch() as batch:
        await batch.enqueue_with_delay(PromMember(id="m"), 3600)
    await read_batches(service)  # loads the batch_info script
    async with Monitor(private_server) as monitor:
        assert await read_batches(service) == {"open": 0, "waiting": 1, "stuck": 0}
        some = await monitor.counts()
    # the probe (a listing and the one batch's info), the open and the waiting listings
    assert some == {"EVALSHA": 3 * BATCH_SHARDS + 2}
