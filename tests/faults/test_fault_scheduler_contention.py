"""Fault 4: 8 services compete for the scheduler lock; the holder is frozen past the TTL.

The frozen holder (SIGSTOP) loses the lock to another process; when it resumes (SIGCONT) it
may still believe it leads for a moment. Each move is one atomic script, so no event is moved
to a ready list twice for one due time (every handler starts exactly once) and none is stuck.
"""

from __future__ import annotations

import collections
import os
import random
import signal

import redis.asyncio as aioredis
from faultkit import Job

from delayq import EventService, current_delivery

N_EVENTS = 2000
SCHEDULERS = 8


async def test_frozen_lock_holder_moves_nothing_twice(
    redis_server_factory, pools, rec, prefix, run_id, wait_for
):
    queue = redis_server_factory()
    pool = pools(queue.url)
    # scheduler-only processes: the consumers live in this test process and never freeze
    await pool.wait_ready(
        rec,
        pool.spawn(
            "--no-handler",
            "--scheduling-interval",
            "0.2",
            "--lock-timeout",
            "1",
            count=SCHEDULERS,
        ),
    )
    starts: collections.Counter[str] = collections.Counter()
    lateness: list[float] = []

    async def handle(job: Job) -> None:
        starts[job.id] += 1
        lateness.append(current_delivery().lateness_ms or 0.0)

    consumer = EventService.from_url(queue.url, prefix=prefix, enable_scheduling=False)
    consumer.add_handler(Job, handle, concurrency=16)
    rnd = random.Random(4)
    lock_key = f"{{{prefix}}}:scheduler-lock"
    frozen_pids = []
    qc = aioredis.Redis.from_url(queue.url, protocol=2)
    async with consumer:
        jobs = [(Job(id=f"s-{n}", seq=n), rnd.uniform(0.3, 8)) for n in range(N_EVENTS)]
        assert all(await consumer.enqueue_many(jobs))
        for _ in range(3):
            token = await wait_for(lambda: _holder(qc, lock_key), timeout=10)
            pid = int(await rec.hget(f"rec:{run_id}:tokens", token))
            os.kill(pid, signal.SIGSTOP)
            frozen_pids.append(pid)
            try:
                # frozen past the TTL: wait until another scheduler holds the lock and has
                # moved events
                await wait_for(lambda t=token: _other_holder(qc, lock_key, t), timeout=10)
                handled = sum(starts.values())
                await wait_for(lambda h=handled: sum(starts.values()) > h + 20, timeout=10)
            finally:
                os.kill(pid, signal.SIGCONT)

        await wait_for(
            lambda: len(starts) == N_EVENTS,
            timeout=30,
            message=f"every event handled\n{pool.logs()}",
        )

        async def drained():
            c = await consumer.stats_for(Job)
            return c.scheduled == c.ready == c.in_flight == c.dead == 0

        await wait_for(drained, timeout=10)
    await qc.aclose()
    twice = [i for i, n in starts.items() if n > 1]
    print(
        f"scheduler contention: events={N_EVENTS} freezes={len(frozen_pids)} "
        f"moved twice={len(twice)} max lateness={max(lateness):.0f}ms"
    )
    assert twice == []
    assert len(set(frozen_pids)) >= 2  # the lock really moved between processes


async def _holder(client, lock_key):
    token = await client.get(lock_key)
    return token.decode() if token else None


async def _other_holder(client, lock_key, token):
    current = await _holder(client, lock_key)
    return current is not None and current != token
