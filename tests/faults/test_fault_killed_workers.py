"""Fault 1: worker processes killed with SIGKILL while events flow, and restarted.

Every event is handled, and an event runs more than once only if a process died while it
was in progress there (handler running, or finished but not yet acked).
"""

from __future__ import annotations

import random

import anyio
from faultkit import Job, read_records, reconcile

from delayq import EventService

N_EVENTS = 3000
WORKERS = 4


async def test_sigkilled_workers_lose_nothing(
    redis_server_factory, pools, rec, prefix, run_id, wait_for
):
    queue = redis_server_factory()
    pool = pools(queue.url)
    worker_args = (
        "--concurrency",
        "8",
        "--visibility",
        "2",
        "--scheduling-interval",
        "0.2",
        "--lock-timeout",
        "1",
    )
    await pool.wait_ready(rec, pool.spawn(*worker_args, count=WORKERS))

    rnd = random.Random(1)
    jobs = [
        (Job(id=f"k-{n}", seq=n, sleep_ms=rnd.randint(0, 30)), rnd.uniform(0, 4))
        for n in range(N_EVENTS)
    ]
    ids = [j.id for j, _ in jobs]
    producer = EventService.from_url(queue.url, prefix=prefix, enable_scheduling=False)
    async with producer:

        async def produce():
            for i in range(0, N_EVENTS, 250):
                assert all(await producer.enqueue_many(jobs[i : i + 250]))
                await anyio.sleep(0.25)

        async def kill_some():
            for _ in range(8):
                await anyio.sleep(rnd.uniform(0.3, 0.8))
                victim = rnd.choice(pool.alive)
                await pool.kill(rec, victim)
                await pool.wait_ready(rec, pool.spawn(*worker_args))

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            tg.start_soon(kill_some)

        async def all_done():
            return await rec.hlen(f"rec:{run_id}:end") >= N_EVENTS

        await wait_for(
            all_done, timeout=90, interval=0.2, message=f"every event handled\n{pool.logs()}"
        )

        async def drained():
            c = (await producer.stats())["fault-job"]
            return c.scheduled == c.ready == c.in_flight == 0 and c

        counts = await wait_for(drained, timeout=30, interval=0.1)
        assert counts.dead == 0

    result = reconcile(ids, await read_records(rec, run_id), pool.interrupted)
    print(f"killed workers: kills={pool.kills} {result}")
    assert pool.kills == 8
    assert result.lost == []
    assert result.handled == N_EVENTS
    assert result.unexplained == [], (result, pool.logs())
