"""Delivery: due times by Redis's clock, early wake-ups, concurrency, handler registry (issue 2)."""

from __future__ import annotations

import asyncio
import statistics

import pytest
from core_support import Recorder, ServicePool, drained, redis_time_ms

from delayq import Event


class DelJob(Event, event_name="core-del-job"):
    """The main event type of these tests."""

    n: int = 0


class DelOther(Event, event_name="core-del-other"):
    """A second type."""


@pytest.fixture
async def services(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix)
    yield pool
    await pool.aclose()


async def test_never_before_due_and_lateness_small(services, redis_client, wait_for) -> None:
    service = await services.start()
    recorder = Recorder()
    service.add_handler(DelJob, recorder, concurrency=8)
    delays_ms = [0, 1, 5, 20, 50, 100, 150, 200, 300, 450, 600, 800, 1000, 1200, 1500] * 2
    windows = {}
    for i, delay in enumerate(delays_ms):
        before = await redis_time_ms(redis_client)
        assert await service.enqueue_with_delay(DelJob(id=f"d{i}", n=delay), delay / 1000)
        after = await redis_time_ms(redis_client)
        windows[f"d{i}"] = (before + delay, after + delay + 1)
    await wait_for(recorder.handled(len(delays_ms)), timeout=15)
    lateness = []
    for d in recorder.deliveries:
        low, high = windows[d.id]
        # the due time is the one asked for, on Redis's clock ...
        assert low <= d.due_ms <= high, (d.id, low, d.due_ms, high)
        # ... and nobody saw the event before it
        assert d.claimed_us / 1000 >= d.due_ms, d
        assert d.lateness_ms >= 0, d
        assert d.attempt == 1
        lateness.append(d.lateness_ms)
    lateness.sort()
    p50 = statistics.median(lateness)
    print(
        f"\nlateness over {len(lateness)} events: p50 {p50:.1f} ms, "
        f"p90 {lateness[int(0.9 * len(lateness))]:.1f} ms, max {lateness[-1]:.1f} ms"
    )
    assert lateness[-1] < 1000
    assert sorted(recorder.counts.values()) == [1] * len(delays_ms)


async def test_scheduler_is_woken_early_by_other_instances(
    services, redis_client, wait_for, prefix
) -> None:
    """With scheduling_interval=30 a 0.2 s event from another process still comes on time."""
    service = await services.start(scheduling_interval=30, lock_timeout=60)
    recorder = Recorder()
    service.add_handler(DelJob, recorder)
    producer = services.producer()
    await wait_for(lambda: service.is_scheduler_leader, timeout=10)
    channel = f"{{{prefix}}}:wakeup"

    async def subscribed() -> bool:
        return (await redis_client.pubsub_numsub(channel))[0][1] >= 1

    await wait_for(subscribed, timeout=10)
    # warm-up: whatever the scheduler's first sweep catches, it sleeps up to 30 s after this
    assert await producer.enqueue_with_delay(DelJob(id="warm-up"), 0.1)
    await wait_for(recorder.handled(1), timeout=10)
    for i, enqueuer in enumerate([producer, service, producer]):
        before = await redis_time_ms(redis_client)
        assert await enqueuer.enqueue_with_delay(DelJob(id=f"early-{i}"), 0.2)
        await wait_for(recorder.handled(2 + i), timeout=5)
        d = recorder.deliveries[-1]
        assert d.id == f"early-{i}"
        assert d.due_ms >= before + 200
        assert 0 <= d.lateness_ms < 1000, d
        print(
            f"\nwoken early ({'producer' if enqueuer is producer else 'self'}): "
            f"lateness {d.lateness_ms:.1f} ms"
        )
    # a later event does not wake the scheduler again, an earlier one does
    assert await producer.enqueue_with_delay(DelJob(id="late"), 20)
    assert await producer.enqueue_with_delay(DelJob(id="earlier"), 0.3)
    await wait_for(lambda: "earlier" in recorder.ids, timeout=5)
    assert "late" not in recorder.ids
    assert await service.cancel(DelJob, "late")


async def test_at_most_concurrency_handlers(services, wait_for) -> None:
    async def slow(event: DelJob) -> None:
        await asyncio.sleep(0.02)

    service = await services.start()
    recorder = Recorder(slow)
    other = Recorder(slow)
    service.add_handler(DelJob, recorder, concurrency=4)
    service.add_handler(DelOther, other, concurrency=1)
    await service.enqueue_many([DelJob(id=f"c{i}") for i in range(60)])
    await service.enqueue_many([DelOther(id=f"o{i}") for i in range(10)])
    await wait_for(lambda: recorder.finished == 60 and other.finished == 10, timeout=20)
    assert recorder.max_running == 4
    assert other.max_running == 1
    await wait_for(lambda: drained(service, DelJob), timeout=5)
    assert sorted(recorder.counts.values()) == [1] * 60


async def test_events_without_a_handler_stay_queued(services, wait_for) -> None:
    service = await services.start(visibility_timeout=1.0)
    others = Recorder()
    service.add_handler(DelOther, others)
    await service.enqueue_many([DelJob(id=f"q{i}") for i in range(3)])
    await service.enqueue_many([DelJob(id=f"s{i}") for i in range(2)], delay=0.1)

    async def all_ready() -> bool:
        return (await service.stats_for(DelJob)).ready == 5

    await wait_for(all_ready, timeout=10)
    # time passes (beyond the visibility timeout); the service is busy with other types
    await asyncio.sleep(1.5)
    assert await service.enqueue_with_delay(DelOther(id="alive"), 0)
    await wait_for(others.handled(1), timeout=5)
    counts = await service.stats_for(DelJob)
    assert (counts.scheduled, counts.ready, counts.in_flight, counts.dead) == (0, 5, 0, 0)

    recorder = Recorder()
    service.add_handler(DelJob, recorder, concurrency=2)
    await wait_for(recorder.handled(5), timeout=10)
    await wait_for(lambda: drained(service, DelJob), timeout=5)
    assert sorted(recorder.ids) == ["q0", "q1", "q2", "s0", "s1"]


async def test_add_handler_after_start(services, wait_for) -> None:
    service = await services.start()
    assert await service.enqueue_with_delay(DelJob(id="before"), 0)
    assert await service.enqueue_with_delay(DelJob(id="delayed"), 0.2)
    recorder = Recorder()
    service.add_handler(DelJob, recorder)
    assert await service.enqueue_with_delay(DelJob(id="after"), 0)
    await wait_for(recorder.handled(3), timeout=10)
    assert sorted(recorder.ids) == ["after", "before", "delayed"]


async def test_remove_handler_waits_and_stops_consuming(services, wait_for) -> None:
    gate = asyncio.Event()

    async def blocked(event: DelJob) -> None:
        await gate.wait()

    service = await services.start()
    first = Recorder(blocked)
    service.add_handler(DelJob, first, concurrency=2)
    await service.enqueue_many([DelJob(id="a"), DelJob(id="b")])
    await wait_for(lambda: first.running == 2, timeout=10)

    removing = asyncio.create_task(service.remove_handler(DelJob))
    await asyncio.sleep(0.2)
    assert not removing.done()  # waits for the in-flight handlers
    gate.set()
    assert await asyncio.wait_for(removing, timeout=10) is True
    assert first.finished == 2
    # their acks went through
    await wait_for(lambda: drained(service, DelJob), timeout=5)
    assert not await service.remove_handler(DelJob)

    # no consumer any more: new events stay queued
    await service.enqueue_many([DelJob(id="c"), DelJob(id="d")])
    assert await service.enqueue_with_delay(DelJob(id="e"), 0.1)

    async def three_ready() -> bool:
        return (await service.stats_for(DelJob)).ready == 3

    await wait_for(three_ready, timeout=10)
    assert first.started == 2

    # a handler again: it takes them
    second = Recorder()
    service.add_handler(DelJob, second)
    await wait_for(second.handled(3), timeout=10)
    assert sorted(second.ids) == ["c", "d", "e"]
    assert first.started == 2


async def test_remove_handler_before_start(services, wait_for) -> None:
    service = services.make()
    recorder = Recorder()
    service.add_handler(DelJob, recorder)
    assert await service.remove_handler(DelJob)
    assert not await service.remove_handler(DelJob)
    await service.start()
    assert await service.enqueue_with_delay(DelJob(id="x"), 0)

    async def ready() -> bool:
        return (await service.stats_for(DelJob)).ready == 1

    await wait_for(ready, timeout=5)
    assert recorder.started == 0
