"""The scheduler: one leader per prefix, takeover, bounded moves (issue 2, behaviour 4)."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest
from core_support import Recorder, ServicePool, drained

from delayq import Event, InMemoryMetrics


class SchedJob(Event, event_name="core-sched-job"):
    """The event type of these tests."""

    n: int = 0


@pytest.fixture
async def services(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix)
    yield pool
    await pool.aclose()


async def test_one_leader_at_a_time_and_takeover(services, redis_client, prefix, wait_for) -> None:
    a = await services.start()
    b = await services.start()
    c = await services.start(enable_scheduling=False)
    group = [a, b, c]
    await wait_for(lambda: a.is_scheduler_leader or b.is_scheduler_leader, timeout=10)
    assert not c.is_scheduler_leader
    lock = f"{{{prefix}}}:scheduler-lock"
    # sample for a while (several lock renewals): never two leaders
    deadline = time.monotonic() + 1.5
    leaders_seen = set()
    while time.monotonic() < deadline:
        leaders = [s for s in group if s.is_scheduler_leader]
        assert len(leaders) <= 1
        leaders_seen.update(id(s) for s in leaders)
        await asyncio.sleep(0.01)  # sampling, not waiting for anything
        ttl = await redis_client.pttl(lock)
        assert 0 < ttl <= 1000  # lock_timeout=1.0: a short TTL, always set
    assert len(leaders_seen) == 1
    leader, follower = (a, b) if a.is_scheduler_leader else (b, a)

    recorder = Recorder()
    follower.add_handler(SchedJob, recorder)
    await leader.aclose()  # releases the lock
    assert not leader.is_scheduler_leader
    await wait_for(lambda: follower.is_scheduler_leader, timeout=5)
    # the new leader moves due events
    assert await c.enqueue_with_delay(SchedJob(id="after-takeover"), 0.2)
    await wait_for(recorder.handled(1), timeout=5)
    assert recorder.deliveries[0].lateness_ms >= 0


async def test_takeover_when_the_leader_vanishes_without_release(
    services, redis_client, prefix, wait_for
) -> None:
    """A leader that dies without releasing: the lock's TTL runs out and another takes over."""
    a = await services.start()
    await wait_for(lambda: a.is_scheduler_leader, timeout=10)
    lock = f"{{{prefix}}}:scheduler-lock"
    token = await redis_client.get(lock)
    assert token
    b = await services.start()
    recorder = Recorder()
    b.add_handler(SchedJob, recorder)
    # a's scheduler stops (a crash would do the same), leaving its lock behind
    a._scheduler.stop()  # type: ignore[union-attr]  # no public way to crash one
    await redis_client.set(lock, token, px=1000)  # as if a had never released it
    await wait_for(lambda: b.is_scheduler_leader, timeout=5)
    assert await redis_client.get(lock) != token
    assert await b.enqueue_with_delay(SchedJob(id="x"), 0.1)
    await wait_for(recorder.handled(1), timeout=5)


async def test_moves_are_bounded_batches(services, wait_for) -> None:
    total = 5000
    metrics = InMemoryMetrics()
    service = services.make(scheduling_batch_size=100, metrics=metrics)
    moves: list[int] = []
    move_due = service.store.scheduling.move_due

    async def recording_move_due(*args, **kwargs):
        result = await move_due(*args, **kwargs)
        moves.append(result.moved)
        return result

    service.store.scheduling.move_due = recording_move_due  # observe, don't change
    recorder = Recorder()
    service.add_handler(SchedJob, recorder, concurrency=50)
    await service.start()
    await wait_for(lambda: service.is_scheduler_leader, timeout=10)
    results = await service.enqueue_many(
        [SchedJob(id=f"b{i}", n=i) for i in range(total)], delay=0.3
    )
    assert results == [True] * total
    await wait_for(recorder.handled(total), timeout=60)
    await wait_for(lambda: drained(service, SchedJob), timeout=10)
    assert len(recorder.counts) == total
    assert set(recorder.counts.values()) == {1}
    assert sum(moves) == total
    assert max(moves) <= 100
    assert metrics.total("moved") == total
    for d in recorder.deliveries:
        assert d.claimed_us / 1000 >= d.due_ms
    lateness = sorted(d.lateness_ms for d in recorder.deliveries)
    print(
        f"\n{total} events due together, batches of 100: {len([m for m in moves if m])} moves, "
        f"lateness p50 {lateness[total // 2]:.0f} ms, max {lateness[-1]:.0f} ms"
    )


class OtherJob(Event, event_name="core-sched-other"):
    """Another type, due while SchedJob's burst is moved."""


async def test_a_burst_takes_turns_with_other_types(services, redis_client, wait_for) -> None:
    """A type with thousands due at once moves one batch per look, so another type's event
    due at the same instant is moved after one batch of the burst, not after all of it."""
    burst = 3000
    producer = services.producer()
    start_s, _ = await redis_client.time()
    assert await producer.enqueue_many([SchedJob(id=f"x{i}") for i in range(burst)], delay=1.5)
    assert await producer.enqueue_with_delay(OtherJob(id="probe"), 1.5)

    async def all_due() -> bool:
        return (await redis_client.time())[0] >= start_s + 3  # whole seconds: due for sure

    await wait_for(all_due, timeout=10)
    service = services.make(scheduling_batch_size=100)
    moves: list[list] = []  # [type, moved], in the order the calls started
    move_due = service.store.scheduling.move_due

    async def recording_move_due(type_name, *args, **kwargs):
        call = [type_name, 0]
        moves.append(call)  # the leader's drainer runs beside the passes: their replies
        result = await move_due(type_name, *args, **kwargs)  # may come back in any order
        call[1] = result.moved
        return result

    service.store.scheduling.move_due = recording_move_due  # observe, don't change
    await service.start()

    async def moved_all() -> bool:
        counts = await producer.stats_for(SchedJob)
        return counts.scheduled == 0 and (await producer.stats_for(OtherJob)).scheduled == 0

    await wait_for(moved_all, timeout=60)
    burst_moves = [i for i, (name, n) in enumerate(moves) if name == SchedJob.event_name and n]
    (probe_move,) = [i for i, (name, n) in enumerate(moves) if name == OtherJob.event_name and n]
    assert sum(moves[i][1] for i in burst_moves) == burst
    # before: the whole burst (30 batches) first; now: at most one batch of it first
    assert len([i for i in burst_moves if i < probe_move]) <= 1


async def test_a_type_due_during_a_burst_batch_does_not_wait_for_it(
    services, redis_client, wait_for
) -> None:
    """The leader drains a burst beside its passes: while one of the burst's batches is
    under way (held here until the other type's event is moved), another type's event that
    comes due is moved; before, the pass waited for the burst's batch first."""
    producer = services.producer()
    start_s, _ = await redis_client.time()
    assert await producer.enqueue_many([SchedJob(id=f"y{i}") for i in range(300)], delay=0.5)

    async def all_due() -> bool:
        return (await redis_client.time())[0] >= start_s + 2  # whole seconds: due for sure

    await wait_for(all_due, timeout=10)
    service = services.make(scheduling_batch_size=100)
    move_due = service.store.scheduling.move_due
    other_moved = asyncio.Event()
    burst_calls = 0
    held: list[bool] = []

    async def gated_move_due(type_name, *args, **kwargs):
        nonlocal burst_calls
        if type_name == SchedJob.event_name:
            burst_calls += 1
            if burst_calls == 2:  # the burst's second batch waits for the other type
                with anyio.move_on_after(10):
                    await other_moved.wait()
                held.append(other_moved.is_set())
        result = await move_due(type_name, *args, **kwargs)
        if type_name == OtherJob.event_name and result.moved:
            other_moved.set()
        return result

    service.store.scheduling.move_due = gated_move_due  # holds one call back; changes no result
    await service.start()
    await wait_for(lambda: burst_calls >= 2, timeout=10)
    assert await producer.enqueue_with_delay(OtherJob(id="during"), 0.2)

    async def moved_all() -> bool:
        counts = await producer.stats_for(SchedJob)
        return counts.scheduled == 0 and (await producer.stats_for(OtherJob)).scheduled == 0

    await wait_for(moved_all, timeout=30)
    assert held == [True]


async def test_lock_steal_is_a_compare_and_set(services, redis_client, prefix) -> None:
    store = services.producer().store
    lock = f"{{{prefix}}}:scheduler-lock"
    assert await store.scheduling.take_lock("leader", 60_000) == (True, None)
    assert await store.scheduling.take_lock("standby-1", 60_000) == (False, "leader")
    # a standby that saw another token cannot take it; one that saw the holder's can
    assert not await store.scheduling.steal_lock("someone-else", "standby-2", 60_000)
    assert await store.scheduling.steal_lock("leader", "standby-1", 1_000)
    assert await redis_client.get(lock) == b"standby-1"
    assert 0 < await redis_client.pttl(lock) <= 1_000
    # the second standby saw the dead leader too: too late, the lock moved on
    assert not await store.scheduling.steal_lock("leader", "standby-2", 60_000)
    assert await store.scheduling.take_lock("leader", 60_000) == (False, "standby-1")
    # free: anyone takes it
    assert await store.scheduling.release_lock("standby-1")
    assert await store.scheduling.steal_lock("leader", "standby-2", 60_000)
    assert await redis_client.get(lock) == b"standby-2"


async def test_release_tells_the_standbys(services, redis_client, prefix, wait_for) -> None:
    # lock and interval far longer than the test: the standby can only lead through the
    # release message
    a = await services.start(lock_timeout=120)
    await wait_for(lambda: a.is_scheduler_leader, timeout=10)
    b = await services.start(lock_timeout=120, scheduling_interval=60)
    channel = f"{{{prefix}}}:wakeup"

    async def both_listening() -> bool:
        ((_, n),) = await redis_client.pubsub_numsub(channel)
        return n == 2

    await wait_for(both_listening, timeout=10)
    assert not b.is_scheduler_leader
    await a.aclose()
    await wait_for(lambda: b.is_scheduler_leader, timeout=5)


async def test_a_standby_left_with_a_leaders_wakeup_sleeps(services, wait_for) -> None:
    """A leader that hears a wake-up and loses the lock before its next pass stands by with
    that wake-up pending (the state two Sentinel failovers in a row left a worker in). It
    must still sleep between its looks: it used to loop without awaiting anything, holding
    up its process's event loop for an interval at a time (enqueues took 1-2 s each)."""
    a = await services.start()
    b = await services.start()
    await wait_for(lambda: a.is_scheduler_leader or b.is_scheduler_leader, timeout=10)
    standby = b if a.is_scheduler_leader else a
    scheduler = standby._scheduler
    assert scheduler is not None
    passes = 0
    standby_pass = scheduler._standby_pass

    async def counted() -> float:
        nonlocal passes
        passes += 1
        return await standby_pass()

    scheduler._standby_pass = counted  # type: ignore[method-assign]
    scheduler._woken.add("core-sched-job")
    scheduler._interrupt()
    await asyncio.sleep(1.0)  # a window to count passes in (2,422,128 of them before)
    # the pending wake-up is a look takeover_delay from now, then passes every interval
    # or so (FAST: 0.2 s), not a pass per loop turn
    assert not scheduler._woken
    assert passes <= 60, passes
