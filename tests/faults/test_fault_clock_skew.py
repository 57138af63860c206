"""Fault 7: processes whose clocks disagree by minutes.

The producer (this test process) runs 10 minutes fast, the worker process (consumers and
scheduler) 10 minutes slow. Delays are counted on Redis's clock, so events are delivered on
time. ``enqueue_at`` names an absolute instant, so it trusts the caller's clock: an instant
computed from a clock 10 minutes fast is 10 minutes late (documented).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import redis.asyncio as aioredis
from faultkit import Job

from delayq import EventService
from delayq.keys import TypeKeys

SKEW = 600.0


async def test_delays_follow_redis_clock_when_clients_disagree(
    redis_server_factory, pools, rec, prefix, run_id, wait_for, monkeypatch
):
    queue = redis_server_factory()
    pool = pools(queue.url)
    await pool.wait_ready(
        rec,
        pool.spawn(
            "--clock-skew",
            str(-SKEW),
            "--record-lateness",
            "--scheduling-interval",
            "0.5",
        ),
    )
    real_time, real_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real_time() + SKEW)
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + int(SKEW * 1e9))
    producer = EventService.from_url(queue.url, prefix=prefix, enable_scheduling=False)
    admin = aioredis.Redis.from_url(queue.url, protocol=2)
    async with producer:
        jobs = [(Job(id=f"skew-{i}"), 1 + i * 0.05) for i in range(40)]
        t0 = time.monotonic()
        assert all(await producer.enqueue_many(jobs))

        async def all_done():
            return await rec.hlen(f"rec:{run_id}:end") >= len(jobs)

        await wait_for(all_done, timeout=30, interval=0.1, message=pool.logs())
        elapsed = time.monotonic() - t0

        # enqueue_at trusts the caller's clock for the instant it names
        fast_now = datetime.fromtimestamp(time.time(), timezone.utc)  # 10 minutes fast
        assert await producer.enqueue_at(Job(id="at"), fast_now + timedelta(seconds=1))
        redis_now_s, _ = await admin.time()
        due = await admin.zscore(TypeKeys(prefix, Job.event_name).scheduled, "at")
        assert due is not None
        ahead = due / 1000 - redis_now_s
    await admin.aclose()
    late = [float(x) for x in await rec.lrange(f"rec:{run_id}:late", 0, -1)]
    print(
        f"clock skew ±{SKEW:.0f}s: {len(late)} events, lateness max {max(late):.0f} ms "
        f"(Redis clock), all done {elapsed:.1f}s after enqueue; enqueue_at(now+1s) from the "
        f"fast clock is due {ahead:.0f}s ahead on Redis's clock"
    )
    # a 10-minute error would show up as ~600000 ms of lateness (or no delivery at all)
    assert max(late) < SKEW * 1000 / 10
    assert SKEW < ahead < SKEW + 10
