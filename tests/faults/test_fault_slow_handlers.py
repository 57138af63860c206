"""Fault 5: slow, stuck and loop-blocking handlers.

* A handler slower than ``visibility_timeout`` on a live process keeps its lease (renewal)
  and is not handed to another consumer.
* A handler that exceeds ``handler_timeout`` is cancelled and retried, then dead-lettered.
* A handler that blocks the event loop (``time.sleep``) stops that process's lease renewals:
  when the block outlasts ``visibility_timeout``, the events in progress in that process are
  delivered again elsewhere (documented in docs/RELIABILITY.md); nothing else is duplicated
  and nothing is lost.
"""

from __future__ import annotations

import collections
import random

import anyio
from faultkit import Job, read_counter, read_records, reconcile

from delayq import EventService, fixed


async def test_handler_slower_than_visibility_runs_once(redis_url, prefix, wait_for):
    starts: collections.Counter[str] = collections.Counter()
    ends: collections.Counter[str] = collections.Counter()

    async def handle(job: Job) -> None:
        starts[job.id] += 1
        await anyio.sleep(job.sleep_ms / 1000)
        ends[job.id] += 1

    services = [
        EventService.from_url(
            redis_url,
            prefix=prefix,
            visibility_timeout=1,
            scheduling_interval=0.1,
            lock_timeout=0.5,
        )
        for _ in range(2)
    ]
    for s in services:
        s.add_handler(Job, handle, concurrency=4)
    async with services[0], services[1]:
        slow = [Job(id=f"slow-{i}", sleep_ms=3500) for i in range(4)]
        fast = [Job(id=f"fast-{i}", sleep_ms=5) for i in range(40)]
        assert all(await services[0].enqueue_many(slow + fast))
        await wait_for(lambda: len(ends) == 44, timeout=20)

        async def drained():
            c = await services[0].stats_for(Job)
            return c.scheduled == c.ready == c.in_flight == c.dead == 0

        await wait_for(drained, timeout=5)
    assert max(starts.values()) == 1, starts


async def test_handler_timeout_cancels_and_retries(redis_url, prefix, wait_for):
    attempts: collections.Counter[str] = collections.Counter()
    cancelled: collections.Counter[str] = collections.Counter()

    async def handle(job: Job) -> None:
        attempts[job.id] += 1
        if attempts[job.id] <= job.fail_times:
            try:
                await anyio.sleep(60)  # stuck
            except BaseException:
                cancelled[job.id] += 1
                raise

    service = EventService.from_url(
        redis_url,
        prefix=prefix,
        handler_timeout=0.3,
        retry_attempts=2,
        retry_backoff=fixed(0.05),
        scheduling_interval=0.1,
    )
    service.add_handler(Job, handle, concurrency=4)
    async with service:
        await service.enqueue_with_delay(Job(id="stuck-once", fail_times=1))
        await service.enqueue_with_delay(Job(id="stuck-always", fail_times=99))

        async def settled():
            c = await service.stats_for(Job)
            return c.scheduled == c.ready == c.in_flight == 0 and c.dead == 1

        await wait_for(settled, timeout=15)
        dead = await service.dead_letters(Job)
    assert attempts == {"stuck-once": 2, "stuck-always": 3}
    assert cancelled == {"stuck-once": 1, "stuck-always": 3}
    assert [d.id for d in dead] == ["stuck-always"]
    assert dead[0].attempts == 3
    assert dead[0].error.startswith("HandlerTimeout")


async def _blocking_run(
    redis_server_factory,
    pools,
    rec,
    prefix,
    run_id,
    wait_for,
    *,
    block_ms: int,
    visibility: float,
    blockers: int,
):
    queue = redis_server_factory()
    pool = pools(queue.url)
    await pool.wait_ready(
        rec,
        pool.spawn(
            "--concurrency",
            "1",
            "--visibility",
            str(visibility),
            "--scheduling-interval",
            "0.2",
            "--lock-timeout",
            "1",
            "--retry-attempts",
            "1",
            count=3,
        ),
    )
    rnd = random.Random(5)
    jobs = [(Job(id=f"n-{i}", sleep_ms=rnd.randint(0, 10)), rnd.uniform(0, 2)) for i in range(200)]
    jobs += [(Job(id=f"b-{i}", block_ms=block_ms), rnd.uniform(0, 2)) for i in range(blockers)]
    ids = [j.id for j, _ in jobs]
    producer = EventService.from_url(queue.url, prefix=prefix, enable_scheduling=False)
    async with producer:
        assert all(await producer.enqueue_many(jobs))

        async def all_done():
            return await rec.hlen(f"rec:{run_id}:end") >= len(ids)

        await wait_for(all_done, timeout=60, interval=0.1, message=pool.logs())

        async def drained():
            c = await producer.stats_for(Job)
            return c.scheduled == c.ready == c.in_flight == 0 and c

        counts = await wait_for(drained, timeout=30, interval=0.1)
        dead = {d.id: d.error for d in await producer.dead_letters(Job)}
    stalled = await read_counter(rec, run_id, "stalled")
    assert counts.dead == len(dead)
    return reconcile(ids, await read_records(rec, run_id), stalled), stalled, dead


async def test_loop_blocked_past_visibility_duplicates_only_stalled_events(
    redis_server_factory, pools, rec, prefix, run_id, wait_for
):
    result, stalled, dead = await _blocking_run(
        redis_server_factory,
        pools,
        rec,
        prefix,
        run_id,
        wait_for,
        block_ms=2500,
        visibility=1.0,
        blockers=3,
    )
    print(f"loop blocked 2.5s > visibility 1s: {result} stalled={dict(stalled)} dead={dead}")
    assert result.lost == []
    assert result.unexplained == []
    assert result.extra_runs >= 1  # the blocked events really ran again elsewhere
    # A handler that always blocks longer than the lease can never ack: after its last
    # delivery's lease expires it becomes a dead letter, although it ran to the end.
    assert set(dead) <= {i for i in stalled if i.startswith("b-")}
    assert all(e.startswith("LeaseExpired") for e in dead.values())


async def test_loop_blocked_within_visibility_duplicates_nothing(
    redis_server_factory, pools, rec, prefix, run_id, wait_for
):
    result, _, dead = await _blocking_run(
        redis_server_factory,
        pools,
        rec,
        prefix,
        run_id,
        wait_for,
        block_ms=400,
        visibility=2.0,
        blockers=6,
    )
    print(f"loop blocked 0.4s < visibility 2s: {result}")
    assert result.lost == []
    assert result.extra_runs == 0
    assert dead == {}
