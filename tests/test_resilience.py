"""Leases, orphans, killed connections, a restarted Redis, and the service's lifecycle (issue 2)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from core_support import (
    Recorder,
    ServicePool,
    blocked_clients,
    drained,
    keys_of,
    redis_time_ms,
)

from delayq import Event, EventService, InMemoryMetrics, QueueCounts
from delayq.testing import RedisServer


class ResJob(Event, event_name="core-res-job"):
    """The main event type of these tests."""

    n: int = 0


class ResOther(Event, event_name="core-res-other"):
    """A second type, so more than one consumer blocks."""


@pytest.fixture
async def services(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix)
    yield pool
    await pool.aclose()


@pytest.fixture
async def raw(private_server: RedisServer):
    client = aioredis.Redis.from_url(private_server.url, protocol=2)
    yield client
    await client.aclose()


# --------------------------------------------------------------------------- leases


async def test_slow_handler_on_a_live_process_runs_once(services, wait_for) -> None:
    """visibility_timeout=1 and a 3 s handler: the lease is renewed, nobody else gets it."""

    async def slow(event: ResJob) -> None:
        await asyncio.sleep(3)

    metrics = InMemoryMetrics()
    recorders = [Recorder(slow), Recorder(slow)]
    for recorder in recorders:
        service = await services.start(visibility_timeout=1.0, metrics=metrics)
        service.add_handler(ResJob, recorder, concurrency=2)
    producer = services.producer()
    assert await producer.enqueue_with_delay(ResJob(id="slow"), 0)
    await wait_for(lambda: sum(r.finished for r in recorders) == 1, timeout=15)
    await wait_for(lambda: drained(producer, ResJob), timeout=5)
    assert sum(r.started for r in recorders) == 1
    assert metrics.total("leases_lost") == 0
    assert (await producer.stats_for(ResJob)).dead == 0


async def test_long_ready_backlog_is_not_delivered_twice(services, wait_for) -> None:
    """300 events wait up to ~3 s in the ready list with visibility_timeout=1."""

    async def work(event: ResJob) -> None:
        await asyncio.sleep(0.01)

    metrics = InMemoryMetrics()
    service = await services.start(visibility_timeout=1.0, metrics=metrics)
    recorder = Recorder(work)
    service.add_handler(ResJob, recorder, concurrency=1)
    total = 300
    assert (
        await service.enqueue_many([ResJob(id=f"b{i}", n=i) for i in range(total)])
        == [True] * total
    )
    await wait_for(recorder.handled(total), timeout=30)
    await wait_for(lambda: drained(service, ResJob), timeout=5)
    assert len(recorder.counts) == total
    assert set(recorder.counts.values()) == {1}
    assert [e.n for e in recorder.events] == list(range(total))  # FIFO
    assert max(d.lateness_ms for d in recorder.deliveries) > 1000  # they did wait that long
    assert metrics.total("moved") == 0  # nothing came back through the scheduler
    assert metrics.total("leases_lost") == 0  # renewals racing acks are no loss


async def test_orphaned_ready_entry_is_redelivered(
    services, redis_client, prefix, wait_for
) -> None:
    """An entry popped by a consumer that died before claiming it comes back after the lease."""
    service = await services.start(visibility_timeout=1.0)
    assert await service.enqueue_with_delay(ResJob(id="orphan"), 0)
    assert await service.enqueue_with_delay(ResJob(id="fine"), 0)
    k = keys_of(prefix, "core-res-job")
    entry = await redis_client.rpop(k.ready)  # "the consumer that died"
    popped_at = await redis_time_ms(redis_client)
    assert entry.endswith(b":orphan")
    recorder = Recorder()
    service.add_handler(ResJob, recorder)
    await wait_for(recorder.handled(2), timeout=10)
    assert recorder.ids == ["fine", "orphan"]
    orphan = recorder.deliveries[1]
    assert orphan.attempt == 1
    # given back only after the visibility timeout, in case its popper was just slow
    assert orphan.claimed_us / 1000 - popped_at >= 1000
    print(f"\norphan redelivered {orphan.claimed_us / 1000 - popped_at:.0f} ms after the pop")
    await wait_for(lambda: drained(service, ResJob), timeout=5)


# --------------------------------------------------------------------------- connections


async def _wait_idle(service: EventService, raw: aioredis.Redis, prefix: str, n: int, wait_for):
    """Wait until the service leads the scheduler, is subscribed and n consumers block."""
    await wait_for(lambda: service.is_scheduler_leader, timeout=10)

    async def ready() -> bool:
        subs = (await raw.pubsub_numsub(f"{{{prefix}}}:wakeup"))[0][1]
        return subs >= 1 and len(await blocked_clients(raw)) >= n

    await wait_for(ready, timeout=10)


async def test_client_kill_type_normal(private_server, raw, prefix, wait_for) -> None:
    pool = ServicePool(private_server.url, prefix)
    metrics = InMemoryMetrics()
    try:
        service = await pool.start(metrics=metrics)
        jobs, others = Recorder(), Recorder()
        service.add_handler(ResJob, jobs, concurrency=2)
        service.add_handler(ResOther, others)
        for round_ in range(3):
            await _wait_idle(service, raw, prefix, 2, wait_for)
            errors = metrics.total("redis_errors")
            killed = await raw.client_kill_filter(_type="normal", skipme=True)
            if round_ == 2:
                killed += await raw.client_kill_filter(_type="pubsub", skipme=True)
            assert killed >= 3  # two BRPOPs and the command connection at least
            assert await service.enqueue_with_delay(ResJob(id=f"now-{round_}"), 0)
            assert await service.enqueue_with_delay(ResJob(id=f"later-{round_}"), 0.2)
            assert await service.enqueue_with_delay(ResOther(id=f"o-{round_}"), 0)
            await wait_for(lambda r=round_: jobs.finished == 2 * (r + 1), timeout=15)
            await wait_for(lambda r=round_: others.finished == r + 1, timeout=15)
            # the clients' retries re-made the killed connections: no call failed
            assert metrics.total("redis_errors") == errors
        assert sorted(jobs.counts.values()) == [1] * 6
    finally:
        await pool.aclose()


async def test_client_kill_of_the_consumer_connections(private_server, raw, prefix, wait_for):
    pool = ServicePool(private_server.url, prefix)
    try:
        service = await pool.start()
        jobs, others = Recorder(), Recorder()
        service.add_handler(ResJob, jobs)
        service.add_handler(ResOther, others)
        for round_ in range(3):
            await _wait_idle(service, raw, prefix, 2, wait_for)
            for client in await blocked_clients(raw):
                assert await raw.client_kill_filter(_id=client["id"]) == 1
            assert await service.enqueue_with_delay(ResJob(id=f"j-{round_}"), 0)
            assert await service.enqueue_with_delay(ResOther(id=f"o-{round_}"), 0.1)
            await wait_for(lambda r=round_: jobs.finished == r + 1, timeout=15)
            await wait_for(lambda r=round_: others.finished == r + 1, timeout=15)
    finally:
        await pool.aclose()


@pytest.mark.redis_config(timeout="1")
async def test_idle_connections_closed_by_redis(private_server, raw, prefix, wait_for) -> None:
    """Redis's `timeout` closes idle connections; the service reconnects when it needs to."""
    pool = ServicePool(private_server.url, prefix)
    my_id = await raw.client_id()

    async def ids() -> set[str]:
        return {c["id"] for c in await raw.client_list() if c["id"] != str(my_id)}

    try:
        # the scheduler's command connection idles for up to 3 s between sweeps
        service = await pool.start(polling_timeout=0.5, scheduling_interval=3, lock_timeout=6)
        recorder = Recorder()
        service.add_handler(ResJob, recorder)
        await _wait_idle(service, raw, prefix, 1, wait_for)
        for i in range(2):
            before = await ids()

            async def some_closed(before: set[str] = before) -> bool:
                return bool(before - await ids())

            await wait_for(some_closed, timeout=10)  # Redis dropped an idle connection
            assert await service.enqueue_with_delay(ResJob(id=f"i{i}"), 0.1)
            await wait_for(recorder.handled(i + 1), timeout=10)
    finally:
        await pool.aclose()


@pytest.mark.redis_config(appendonly="yes")
async def test_redis_restart_under_a_running_service(private_server, prefix, wait_for) -> None:
    metrics = InMemoryMetrics()
    pool = ServicePool(private_server.url, prefix, visibility_timeout=1.0)
    try:
        service = await pool.start(metrics=metrics)
        recorder = Recorder()
        service.add_handler(ResJob, recorder, concurrency=4)
        assert await service.enqueue_with_delay(ResJob(id="before-handled"), 0)
        await wait_for(recorder.handled(1), timeout=10)
        await service.enqueue_many([ResJob(id=f"before-{i}") for i in range(3)], delay=1.0)

        private_server.kill()
        await wait_for(lambda: metrics.total("redis_errors") > 0, timeout=10)
        private_server.start()  # same port, AOF reloaded

        await wait_for(recorder.handled(4), timeout=20)
        await service.enqueue_many([ResJob(id=f"after-{i}") for i in range(3)], delay=0.1)
        assert await service.enqueue_with_delay(ResJob(id="after-now"), 0)
        await wait_for(recorder.handled(8), timeout=20)
        await wait_for(lambda: drained(service, ResJob), timeout=10)
        assert sorted(recorder.ids) == sorted(
            ["before-handled", "after-now"]
            + [f"before-{i}" for i in range(3)]
            + [f"after-{i}" for i in range(3)]
        )
        assert set(recorder.counts.values()) == {1}
    finally:
        await pool.aclose()


# --------------------------------------------------------------------------- lifecycle


async def test_lifecycle_basics(redis_url: str, prefix: str, wait_for) -> None:
    recorder = Recorder()
    async with EventService.from_url(redis_url, prefix=prefix, scheduling_interval=0.2) as service:
        service.add_handler(ResJob, recorder)
        await service.start()  # starting twice is harmless
        assert await service.enqueue_with_delay(ResJob(id="ctx"), 0)
        await wait_for(recorder.handled(1), timeout=10)
    await service.aclose()  # closing twice is harmless
    await service.aclose()
    with pytest.raises(RuntimeError):
        await service.start()
    with pytest.raises(RuntimeError):
        service.add_handler(ResOther, Recorder())

    never_started = EventService.from_url(redis_url, prefix=prefix)
    await never_started.aclose()
    await never_started.aclose()

    # a producer-only service needs no start
    producer = EventService.from_url(redis_url, prefix=prefix)
    try:
        assert await producer.enqueue_with_delay(ResJob(id="queued"), 0)
    finally:
        await producer.aclose()


async def test_aclose_lets_running_handlers_finish(services, wait_for) -> None:
    async def work(event: ResJob) -> None:
        await asyncio.sleep(0.3)

    service = await services.start(shutdown_grace=5)
    recorder = Recorder(work)
    service.add_handler(ResJob, recorder, concurrency=2)
    await service.enqueue_many([ResJob(id="a"), ResJob(id="b")])
    await wait_for(lambda: recorder.running == 2, timeout=10)
    await service.aclose()
    assert recorder.finished == 2
    checker = services.producer()
    assert await checker.stats_for(ResJob) == QueueCounts(0, 0, 0, 0)


async def test_aclose_leaves_unfinished_events_to_their_leases(services, wait_for) -> None:
    cancelled = []
    stuck = asyncio.Event()

    async def stuck_handler(event: ResJob) -> None:
        try:
            await stuck.wait()  # never set
        except asyncio.CancelledError:
            cancelled.append(event.id)
            raise

    first = await services.start(shutdown_grace=0.2, visibility_timeout=1.0)
    recorder = Recorder(stuck_handler)
    first.add_handler(ResJob, recorder)
    assert await first.enqueue_with_delay(ResJob(id="unfinished"), 0)
    await wait_for(lambda: recorder.started == 1, timeout=10)
    await first.aclose()
    assert cancelled == ["unfinished"]
    second = await services.start(visibility_timeout=1.0)
    counts = await second.stats_for(ResJob)
    # still in Redis: leased, or already given back by the scheduler
    assert (counts.in_flight + counts.ready, counts.dead) == (1, 0)
    after = Recorder()
    second.add_handler(ResJob, after)
    await wait_for(after.handled(1), timeout=10)
    assert after.ids == ["unfinished"]
    assert after.deliveries[0].attempt == 2
    await wait_for(lambda: drained(second, ResJob), timeout=5)
