"""Bounded work per Redis call on the consumer side (issue 20, item 5: a script blocks
every other client while it runs)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from core_support import ServicePool

from delayq import Event
from delayq.runtime.consumer import CLAIM_MAX
from delayq.runtime.settlement import ACK_MAX


class BoundJob(Event, event_name="core-bound-job"):
    """The event type of these tests."""


@pytest.fixture
async def services(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix)
    yield pool
    await pool.aclose()


async def test_claims_and_acks_are_bounded_however_many_slots_are_free(services, wait_for) -> None:
    """With 1,000 slots free and 1,000 events ready, no claim call takes more than
    CLAIM_MAX entries and no ack call settles more than ACK_MAX, yet every event runs once."""
    n = 1000
    producer = services.producer()
    assert all(await producer.enqueue_many([BoundJob(id=f"b{i}") for i in range(n)]))
    release = asyncio.Event()
    seen: list[str] = []

    async def handle(event: BoundJob) -> None:
        seen.append(event.id)
        await release.wait()  # every handler ends in the same turn: acks pile up

    service = services.make()
    claims: list[int] = []
    acks: list[int] = []
    claim, ack = service.store.deliveries.claim_limited, service.store.deliveries.ack

    async def recording_claim(shard: str, popped: Any, more: int, *args: Any, **kw: Any) -> Any:
        claims.append(len(popped) + more)
        return await claim(shard, popped, more, *args, **kw)

    async def recording_ack(shard: str, done: Any, **kw: Any) -> int:
        done = list(done)
        acks.append(len(done))
        return await ack(shard, done, **kw)

    service.store.deliveries.claim_limited = recording_claim  # type: ignore[method-assign]  # observe only
    service.store.deliveries.ack = recording_ack  # type: ignore[method-assign]
    service.add_handler(BoundJob, handle, concurrency=n)
    await service.start()
    await wait_for(lambda: len(seen) == n, timeout=30)
    release.set()

    async def all_acked() -> bool:
        return (await producer.stats_for(BoundJob)).in_flight == 0 and sum(acks) >= n

    await wait_for(all_acked, timeout=30)
    assert sorted(seen) == sorted(f"b{i}" for i in range(n))
    assert max(claims) <= CLAIM_MAX and len(claims) >= n // CLAIM_MAX
    assert max(acks) <= ACK_MAX and sum(acks) == n
    assert len(acks) >= n // ACK_MAX  # the pile was split, not sent whole
