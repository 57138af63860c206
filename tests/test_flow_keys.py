"""Flow keys (issue 22): fair turns between keys, per-key concurrency and rate.

Fairness is counted in claims: each claim of a group takes the next number of its
``claims`` counter, so the order of starts is exact whatever the clock says.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery
from delayq.keys import TypeKeys
from delayq.testing import wait_for

FAST = {"visibility_timeout": 5.0, "scheduling_interval": 0.2, "lock_timeout": 1.0,
        "polling_timeout": 1.0, "shutdown_grace": 2.0}  # fmt: skip


class KeyJob(Event, event_name="key-job"):
    """An event served under a flow key given at enqueue."""

    n: int = 0


class TenantJob(Event, event_name="tenant-job", flow_key="tenant"):
    """An event whose ``tenant`` field is its flow key."""

    tenant: str = ""


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, protocol=2)
    yield client
    await client.aclose()


async def test_fair_turns_bound(redis_url: str, prefix: str) -> None:
    """Key A has 100,000 ready events, key B 10: with two keys in rotation, B's j-th event
    is among the first 2·j claims (one turn per key per round)."""
    starts: list[tuple[str | None, str]] = []

    async def handle(event: KeyJob) -> None:
        d = current_delivery()
        assert d is not None
        starts.append((d.flow_key, event.id))

    async with EventService.from_url(redis_url, prefix=prefix, **FAST) as producer:
        for first in range(0, 100_000, 20_000):
            await producer.enqueue_many(
                [KeyJob(id=f"a{i:06d}") for i in range(first, first + 20_000)], key="A"
            )
        await producer.enqueue_many([KeyJob(id=f"b{i:02d}") for i in range(10)], key="B")
        assert (await producer.stats_for(KeyJob)).ready == 100_010
    async with EventService.from_url(redis_url, prefix=prefix, **FAST) as svc:
        svc.add_handler(KeyJob, handle, concurrency=4)
        await svc.start()
        await wait_for(lambda: sum(k == "B" for k, _ in starts) == 10, timeout=30)
    b_positions = [i + 1 for i, (k, _) in enumerate(starts) if k == "B"]
    for j, position in enumerate(b_positions, 1):
        assert position <= 2 * j, (j, position, starts[:30])
    # each key in its own order
    assert [e for k, e in starts if k == "B"] == [f"b{i:02d}" for i in range(10)]
    a_ids = [e for k, e in starts if k == "A"]
    assert a_ids == sorted(a_ids) and a_ids[0] == "a000000"
