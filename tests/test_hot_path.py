"""The batching on delayq's hot paths keeps every caller's own result.

Concurrent single-event enqueues are coalesced into shared script calls
(``store.enqueueing.enqueue``); these tests check that each caller still gets its own
answer, that errors reach every caller, and that nothing is lost or doubled.
"""

from __future__ import annotations

import asyncio

import pytest

from delayq import EventService
from delayq.events import Event


class HotEvent(Event, event_name="hot-path"):
    """A test event."""

    n: int = 0


class OtherHotEvent(Event, event_name="hot-path-other"):
    """A second type, to mix types in one burst."""


@pytest.fixture
async def service(redis_url: str, prefix: str):
    svc = EventService.from_url(redis_url, prefix=prefix)
    try:
        yield svc
    finally:
        await svc.aclose()


async def test_concurrent_single_enqueues_each_get_their_own_code(service: EventService) -> None:
    # 300 callers at once: new ids, a duplicate of each, and replacements
    new = [service.enqueue_with_delay(HotEvent(id=f"e{i}", n=i), 3600) for i in range(300)]
    assert await asyncio.gather(*new) == [True] * 300
    again = [service.enqueue_with_delay(HotEvent(id=f"e{i}", n=-1), 3600) for i in range(300)]
    assert await asyncio.gather(*again) == [False] * 300  # kept: the first payload stays
    replaced = [
        service.enqueue_with_delay(HotEvent(id=f"e{i}", n=i + 1000), 3600, replace=True)
        for i in range(0, 300, 3)
    ]
    assert await asyncio.gather(*replaced) == [True] * 100
    counts = await service.stats_for(HotEvent)
    assert counts.scheduled == 300


async def test_one_burst_mixes_types_modes_and_duplicate_ids(service: EventService) -> None:
    calls = []
    for i in range(50):
        calls.append(service.enqueue_with_delay(HotEvent(id=f"d{i}"), 3600))
        calls.append(service.enqueue_with_delay(HotEvent(id=f"d{i}"), 3600))  # same id, same burst
        calls.append(
            service.enqueue_with_delay(OtherHotEvent(id=f"d{i}"), 0)
        )  # other type, due now
    results = await asyncio.gather(*calls)
    # per id and type, exactly one of the callers added it, in call order
    assert results == [True, False, True] * 50
    hot, other = await service.stats_for(HotEvent), await service.stats_for(OtherHotEvent)
    assert (hot.scheduled, hot.ready) == (50, 0)
    assert (other.scheduled, other.ready) == (0, 50)


async def test_sequential_calls_of_one_task_stay_in_order(service: EventService) -> None:
    assert await service.enqueue_with_delay(HotEvent(id="x", n=1), 3600)
    assert not await service.enqueue_with_delay(HotEvent(id="x", n=2), 3600)
    assert await service.cancel(HotEvent, "x")
    assert await service.enqueue_with_delay(HotEvent(id="x", n=3), 3600)


async def test_an_error_reaches_every_coalesced_caller(
    service: EventService, redis_client, prefix: str
) -> None:
    # a key of the wrong type makes the enqueue script refuse, for every caller in the burst
    await redis_client.set(f"{{{prefix}:hot-path}}:scheduled", "not a zset")
    calls = [service.enqueue_with_delay(HotEvent(id=f"w{i}"), 3600) for i in range(20)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, Exception) for r in results), results
    await redis_client.delete(f"{{{prefix}:hot-path}}:scheduled")
    assert await service.enqueue_with_delay(HotEvent(id="after"), 3600)


async def test_a_cancelled_caller_does_not_block_the_others(service: EventService) -> None:
    tasks = [
        asyncio.create_task(service.enqueue_with_delay(HotEvent(id=f"c{i}"), 3600))
        for i in range(20)
    ]
    tasks[5].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[5], asyncio.CancelledError)
    assert all(r is True for i, r in enumerate(results) if i != 5)
    # the cancelled caller's event was either not sent or sent whole: never half
    counts = await service.stats_for(HotEvent)
    assert counts.scheduled in (19, 20)
