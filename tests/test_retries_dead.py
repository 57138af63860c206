"""Retries, handler timeouts, dead letters, requeue and purge, undecodable entries (issue 2)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from core_support import Recorder, ServicePool, drained, keys_of, redis_time_ms

from delayq import Event, EventService, InMemoryMetrics, QueueCounts, fixed
from delayq.codec import Codec


class RetJob(Event, event_name="core-ret-job"):
    """The main event type of these tests."""

    n: int = 0


class ShapeOld(Event, event_name="core-ret-shape-old"):
    """What ``core-ret-shape`` events looked like before a deploy changed the class."""

    amount: str


class ShapeNew(Event, event_name="core-ret-shape"):
    """The class as it is now: ``amount`` became an int."""

    amount: int


@pytest.fixture
async def services(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix, retry_backoff=fixed(0.05))
    yield pool
    await pool.aclose()


def dead_count(service: EventService, event_type: type[Event], n: int):
    async def check() -> bool:
        return (await service.stats_for(event_type)).dead == n

    return check


async def test_retries_then_dead_letter(services, redis_client, wait_for) -> None:
    async def boom(event: RetJob) -> None:
        raise RuntimeError(f"boom {len(recorder.events)}")

    metrics = InMemoryMetrics()
    service = await services.start(retry_attempts=2, metrics=metrics)
    recorder = Recorder(boom)
    service.add_handler(RetJob, recorder)
    before = await redis_time_ms(redis_client)
    assert await service.enqueue_with_delay(RetJob(id="x", n=7), 0, context={"k": "v"})
    await wait_for(dead_count(service, RetJob, 1), timeout=10)
    after = await redis_time_ms(redis_client)
    assert recorder.started == 3
    assert [d.attempt for d in recorder.deliveries] == [1, 2, 3]
    # each retry waited for its backoff, on Redis's clock
    for prev, nxt in zip(recorder.deliveries, recorder.deliveries[1:]):
        assert nxt.claimed_us - prev.claimed_us >= 50_000
    (dead,) = await service.dead_letters(RetJob)
    assert dead.id == "x"
    assert dead.event == RetJob(id="x", n=7)
    assert dead.context == {"k": "v"}
    assert dead.attempts == 3
    assert dead.error == "RuntimeError: boom 3"
    assert dead.decode_error is None
    assert dead.failed_at.tzinfo is not None
    assert before <= dead.failed_at.timestamp() * 1000 <= after + 1
    counts = await service.stats_for(RetJob)
    assert (counts.scheduled, counts.ready, counts.in_flight, counts.dead) == (0, 0, 0, 1)
    assert metrics.total("retried") == 2
    assert metrics.total("dead_lettered") == 1
    # a dead letter is not delivered again by itself
    assert await service.enqueue_with_delay(RetJob(id="marker"), 0.2)
    await wait_for(lambda: "marker" in recorder.ids, timeout=10)
    assert recorder.counts["x"] == 3


async def test_returning_false_retries(services, wait_for) -> None:
    async def false_twice(event: RetJob) -> bool | None:
        if event.id == "always":
            return False
        return None if recorder.counts[event.id] > 2 else False

    service = await services.start(retry_attempts=2)
    recorder = Recorder(false_twice)
    service.add_handler(RetJob, recorder, concurrency=2)
    assert await service.enqueue_with_delay(RetJob(id="third-time-lucky"), 0)
    assert await service.enqueue_with_delay(RetJob(id="always"), 0)
    await wait_for(dead_count(service, RetJob, 1), timeout=10)
    await wait_for(lambda: drained(service, RetJob), timeout=10)
    assert recorder.counts == {"third-time-lucky": 3, "always": 3}
    (dead,) = await service.dead_letters(RetJob)
    assert dead.id == "always"
    assert dead.error.startswith("ReturnedFalse")


async def test_no_retries_with_retry_attempts_zero(services, wait_for) -> None:
    async def fail(event: RetJob) -> None:
        raise ValueError("bad input")

    service = await services.start(retry_attempts=0)
    recorder = Recorder(fail)
    service.add_handler(RetJob, recorder)
    assert await service.enqueue_with_delay(RetJob(id="once"), 0)
    await wait_for(dead_count(service, RetJob, 1), timeout=10)
    assert recorder.started == 1
    (dead,) = await service.dead_letters(RetJob)
    assert (dead.attempts, dead.error) == (1, "ValueError: bad input")


async def test_handler_timeout_cancels_and_counts_as_failure(services, wait_for) -> None:
    cancelled = []

    async def slow(event: RetJob) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(event.id)
            raise

    service = await services.start(retry_attempts=1, handler_timeout=0.2)
    recorder = Recorder(slow)
    service.add_handler(RetJob, recorder)
    assert await service.enqueue_with_delay(RetJob(id="slow"), 0)
    await wait_for(dead_count(service, RetJob, 1), timeout=10)
    assert cancelled == ["slow", "slow"]
    (dead,) = await service.dead_letters(RetJob)
    assert dead.attempts == 2
    assert dead.error.startswith("HandlerTimeout"), dead.error
    # the consumer goes on
    await service.remove_handler(RetJob)
    fast = Recorder()
    service.add_handler(RetJob, fast)
    assert await service.enqueue_with_delay(RetJob(id="fast"), 0)
    await wait_for(fast.handled(1), timeout=10)


async def test_requeue_and_purge_dead_letters(services, redis_client, prefix, wait_for) -> None:
    healthy = False

    async def flaky(event: RetJob) -> None:
        if not healthy:
            raise RuntimeError("down")

    service = await services.start(retry_attempts=1)
    recorder = Recorder(flaky)
    service.add_handler(RetJob, recorder, concurrency=5)
    ids = [f"d{i}" for i in range(5)]
    assert await service.enqueue_many([RetJob(id=i, n=n) for n, i in enumerate(ids)]) == [True] * 5
    await wait_for(dead_count(service, RetJob, 5), timeout=10)
    assert recorder.started == 10
    dead = await service.dead_letters(RetJob)
    assert sorted(d.id for d in dead) == ids
    assert all(d.attempts == 2 and d.error == "RuntimeError: down" for d in dead)
    assert len(await service.dead_letters(RetJob, limit=2)) == 2
    assert len(await service.dead_letters(RetJob, limit=2, offset=4)) == 1

    # dead letters are not pending events: enqueueing the same id keeps the dead letter
    assert not await service.enqueue_with_delay(RetJob(id="d0"), 0)

    healthy = True
    # requeue some by id (unknown and pending ids are ignored)
    assert await service.enqueue_with_delay(RetJob(id="pending"), 60)
    assert await service.requeue_dead_letters(RetJob, ids=["d0", "nope", "pending"]) == 1
    await wait_for(lambda: recorder.finished == 11, timeout=10)
    assert recorder.deliveries[-1].id == "d0"
    assert recorder.deliveries[-1].attempt == 1  # attempts start over

    async def counts_now() -> bool:  # once the ack went through
        return await service.stats_for(RetJob) == QueueCounts(1, 0, 0, 4)

    await wait_for(counts_now, timeout=5)

    # requeue with a delay
    before = await redis_time_ms(redis_client)
    assert await service.requeue_dead_letters(RetJob, ids=["d1"], delay=timedelta(seconds=0.3)) == 1
    await wait_for(lambda: recorder.finished == 12, timeout=10)
    assert recorder.deliveries[-1].due_ms >= before + 300

    # purge one by id, then requeue all the rest
    assert await service.purge_dead_letters(RetJob, ids=["d2", "nope", "pending"]) == 1
    assert await service.requeue_dead_letters(RetJob) == 2
    await wait_for(lambda: recorder.finished == 14, timeout=10)
    assert sorted(recorder.ids[-2:]) == ["d3", "d4"]
    assert all(d.attempt == 1 for d in recorder.deliveries[-2:])
    assert await service.requeue_dead_letters(RetJob) == 0

    # fail some again and purge them all
    healthy = False
    assert await service.requeue_dead_letters(RetJob) == 0
    await service.enqueue_many([RetJob(id=f"p{i}") for i in range(3)])
    await wait_for(dead_count(service, RetJob, 3), timeout=10)
    assert await service.purge_dead_letters(RetJob) == 3
    assert await service.dead_letters(RetJob) == []
    assert await service.purge_dead_letters(RetJob) == 0
    k = keys_of(prefix, "core-ret-job")
    # only the pending event is left in Redis
    assert await redis_client.hkeys(k.events) == [b"pending"]
    assert await redis_client.hlen(k.attempts) == 0
    assert await redis_client.hlen(k.errors) == 0
    assert await service.cancel(RetJob, "pending")


async def test_undecodable_entries_become_dead_letters(
    services, redis_client, prefix, wait_for
) -> None:
    """Garbage written by someone else, queued both ways, ends in dead letters; others go on."""
    k = keys_of(prefix, "core-ret-job")
    service = await services.start(retry_attempts=3)
    recorder = Recorder()
    service.add_handler(RetJob, recorder, concurrency=2)
    assert await service.enqueue_with_delay(RetJob(id="good-1"), 0)
    await wait_for(recorder.handled(1), timeout=10)

    # 1. written into the events hash and pushed onto the ready list like push_ready does
    now = await redis_time_ms(redis_client)
    seq = await redis_client.hincrby(k.meta, "pushed", 1)
    await redis_client.hset(k.events, "garbage-ready", b"\xff\x00 not an envelope")
    await redis_client.zadd(k.queued, {"garbage-ready": seq})
    await redis_client.lpush(k.ready, f"{now}:garbage-ready")
    # 2. written into the events hash and the schedule, due now
    await redis_client.hset(k.events, "garbage-scheduled", b'["truncated')
    await redis_client.zadd(k.scheduled, {"garbage-scheduled": now})
    # 3. a JSON envelope whose payload does not fit the class
    await redis_client.hset(k.events, "wrong-shape", b'[{"id": "wrong-shape", "n": "x"}, null, 0]')
    await redis_client.zadd(k.scheduled, {"wrong-shape": now})
    assert await service.enqueue_with_delay(RetJob(id="good-2"), 0)

    await wait_for(dead_count(service, RetJob, 3), timeout=10)
    await wait_for(lambda: "good-2" in recorder.ids, timeout=10)
    dead = {d.id: d for d in await service.dead_letters(RetJob)}
    assert set(dead) == {"garbage-ready", "garbage-scheduled", "wrong-shape"}
    for d in dead.values():
        assert d.error.startswith("DecodeError"), d.error
        assert d.event is None
        assert d.decode_error
        assert d.attempts == 1  # not retried: it would fail the same way
    assert dead["garbage-ready"].raw == b"\xff\x00 not an envelope"
    assert await service.enqueue_with_delay(RetJob(id="good-3"), 0)
    await wait_for(recorder.handled(3), timeout=10)
    assert sorted(recorder.ids) == ["good-1", "good-2", "good-3"]
    assert await service.purge_dead_letters(RetJob) == 3


async def test_event_whose_class_changed_shape(services, wait_for) -> None:
    """Events queued by an older deploy that no longer validate go to dead letters."""
    producer = services.producer()
    store = producer.store
    codec = Codec()
    items = [
        (f"old-{i}", codec.encode(ShapeOld(id=f"old-{i}", amount="12.50")), 0) for i in range(2)
    ]
    assert await store.enqueueing.enqueue(
        "core-ret-shape", items, absolute=False, replace=False
    ) == [1, 1]
    assert await producer.enqueue_with_delay(ShapeNew(id="new", amount=5), 0)

    service = await services.start()
    recorder = Recorder()
    service.add_handler(ShapeNew, recorder)
    await wait_for(dead_count(service, ShapeNew, 2), timeout=10)
    await wait_for(recorder.handled(1), timeout=10)
    assert recorder.events == [ShapeNew(id="new", amount=5)]
    for d in await service.dead_letters(ShapeNew):
        assert d.error.startswith("DecodeError") and "amount" in d.error, d.error
        assert d.event is None and d.raw
    assert (await service.stats_for(ShapeNew)).ready == 0


async def test_backoff_is_applied(services, wait_for) -> None:
    """retry_backoff receives the failed delivery count; timedelta results work too."""
    seen = []

    def backoff(attempt: int) -> timedelta:
        seen.append(attempt)
        return timedelta(milliseconds=100 * attempt)

    async def fail(event: RetJob) -> None:
        raise RuntimeError("again")

    service = await services.start(retry_attempts=2, retry_backoff=backoff)
    recorder = Recorder(fail)
    service.add_handler(RetJob, recorder)
    assert await service.enqueue_with_delay(RetJob(id="b"), 0)
    await wait_for(dead_count(service, RetJob, 1), timeout=10)
    assert seen == [1, 2]
    first, second, third = recorder.deliveries
    assert second.claimed_us - first.claimed_us >= 100_000
    assert third.claimed_us - second.claimed_us >= 200_000
    assert second.due_ms >= first.claimed_us // 1000 + 100
