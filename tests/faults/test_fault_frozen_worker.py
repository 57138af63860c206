"""A worker frozen past its leases, thawed while another process runs its events again.

The frozen process (SIGSTOP) holds 8 events whose handlers are under way; their leases
expire, and a second process gets them all and keeps its handlers running (held by the
test). Then the first is thawed (SIGCONT): its handlers find their time is up and succeed,
and their acks reach Redis while the newer deliveries still run. Those acks change nothing
(the events stay in flight, held by the second process, whose acks later remove them all),
and the thawed process counts them as ``stale_outcomes``, not ``succeeded``.
tests/faults/test_fault_network.py has the same freeze under a steady stream of events.
"""

from __future__ import annotations

import os
import signal
import time

import anyio.to_thread
from faultkit import Job, rec_key
from netfaults import read_metrics

from delayq import EventService

K = 8
SLEEP_S = 1.5


async def test_stale_acks_of_a_thawed_worker_leave_the_newer_deliveries_alone(
    redis_server_factory, pools, rec, prefix, run_id, wait_for
):
    queue = redis_server_factory()
    pool = pools(queue.url)
    args = ("--visibility", "1", "--no-scheduler", "--metrics", "--concurrency", "16")
    (frozen,) = pool.spawn(*args)
    await pool.wait_ready(rec, [frozen])
    starts, ends = rec_key(run_id, "start"), rec_key(run_id, "end")
    ids = [f"z-{n}" for n in range(K)]

    async def started(times: int) -> bool:
        counts = await rec.hmget(starts, ids)
        return all(c is not None and int(c) >= times for c in counts)

    # the scheduler runs here, never frozen (its visibility timeout is the one its orphan
    # rule applies: an entry the frozen process's BRPOP took comes back after it)
    producer = EventService.from_url(
        queue.url, prefix=prefix, scheduling_interval=0.2, visibility_timeout=1
    )
    async with producer:
        await producer.enqueue_many([Job(id=i, sleep_ms=int(SLEEP_S * 1000)) for i in ids])
        await wait_for(lambda: started(1), timeout=20)
        os.kill(frozen.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            assert await pool.mark_interrupted(rec, frozen.pid) == set(ids)
            gate = rec_key(run_id, "go")
            (other,) = pool.spawn(*args, "--hold", gate)
            await pool.wait_ready(rec, [other])
            # the leases expire (1 s) and the other process runs every event again
            await wait_for(lambda: started(2), timeout=20, message=pool.logs())
            # frozen longer than its handlers' sleep: they end as soon as it is thawed
            await wait_for(lambda: time.monotonic() - frozen_at > SLEEP_S + 0.1, timeout=10)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        inprog = rec_key(run_id, f"inprog:{frozen.pid}")

        async def acked() -> bool:  # its acks went through
            return await rec.scard(inprog) == 0

        await wait_for(acked, timeout=20)
        assert await rec.hlen(ends) == K  # the frozen process's runs, all succeeded
        counts = await producer.stats_for(Job)
        assert counts.in_flight == K  # the newer deliveries still hold every event
        await rec.set(gate, 1)

        async def all_ended_twice() -> bool:
            return await rec.hvals(ends) == [b"2"] * K

        await wait_for(all_ended_twice, timeout=20)

        async def drained() -> bool:
            c = await producer.stats_for(Job)
            return c.scheduled == c.ready == c.in_flight == c.dead == 0

        await wait_for(drained, timeout=20)
    await anyio.to_thread.run_sync(pool.stop_all)
    thawed, newer = (
        await read_metrics(rec, run_id, frozen.pid),
        await read_metrics(rec, run_id, other.pid),
    )
    assert (thawed["succeeded"], thawed["stale_outcomes"]) == (0, K), thawed
    assert (newer["succeeded"], newer["stale_outcomes"], newer["leases_lost"]) == (K, 0, 0)
