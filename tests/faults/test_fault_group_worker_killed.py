"""Fault: SIGKILL of one delivery group's worker mid-handler (issue 13).

Two groups of one type, each in its own OS processes: the default group and "audit". The
audit worker is killed while its handlers run; its events come back (after the lease) to
audit alone. The default group's handler runs each event exactly once, nothing is lost in
either group, and once both are done nothing of the events is left in Redis.
"""

from __future__ import annotations

from faultkit import Job, WorkerPool, read_records, reconcile

from delayq import EventService
from delayq.keys import TypeKeys

N_EVENTS = 40
ARGS = ("--concurrency", "8", "--visibility", "2", "--scheduling-interval", "0.2")


async def test_sigkill_of_one_groups_worker_redelivers_to_that_group_only(
    redis_server_factory, pools, recorder_server, rec, prefix, run_id, wait_for
):
    queue = redis_server_factory()
    billing = pools(queue.url)
    audit = WorkerPool(url=queue.url, rec_url=recorder_server.url, prefix=prefix, run=f"{run_id}-a")
    producer = EventService.from_url(queue.url, prefix=prefix, enable_scheduling=False)
    try:
        async with producer:
            assert await producer.register_group(Job, "audit")
            await billing.wait_ready(rec, billing.spawn(*ARGS))
            first = audit.spawn(*ARGS, "--group", "audit", "--no-scheduler")
            await audit.wait_ready(rec, first)
            jobs = [Job(id=f"g-{n}", seq=n, sleep_ms=1500) for n in range(N_EVENTS)]
            ids = [j.id for j in jobs]
            assert all(await producer.enqueue_many(jobs, delay=0.1))

            async def audit_busy() -> bool:
                return await rec.scard(f"rec:{run_id}-a:inprog:{first[0].pid}") >= 8

            await wait_for(audit_busy, timeout=15, interval=0.02)
            killed = await audit.kill(rec, first[0])
            assert killed
            await audit.wait_ready(rec, audit.spawn(*ARGS, "--group", "audit", "--no-scheduler"))

            async def both_done() -> bool:
                return (
                    await rec.hlen(f"rec:{run_id}:end") >= N_EVENTS
                    and await rec.hlen(f"rec:{run_id}-a:end") >= N_EVENTS
                )

            await wait_for(
                both_done, timeout=60, interval=0.2,
                message=f"both groups handle everything\n{billing.logs()}\n{audit.logs()}",
            )  # fmt: skip

            async def drained() -> bool:
                stats = await producer.group_stats(Job)
                return all(c.scheduled == c.ready == c.in_flight == 0 for c in stats.values())

            await wait_for(drained, timeout=20, interval=0.1)
            keys = TypeKeys(prefix, Job.event_name)
            assert await producer.store.redis.hlen(keys.events) == 0
            assert await producer.store.redis.exists(keys.pending) == 0
    finally:
        audit.stop_all()

    default_records = await read_records(rec, run_id)
    audit_records = await read_records(rec, f"{run_id}-a")
    # the default group: every event once, never re-run by audit's crash
    assert default_records.start == {i: 1 for i in ids}
    assert default_records.end == {i: 1 for i in ids}
    # audit: nothing lost; the interrupted ones ran again, in audit
    result = reconcile(ids, audit_records, audit.interrupted)
    print(f"killed audit worker mid-handler: interrupted={len(killed)} {result}")
    assert result.lost == [] and result.unexplained == []
    assert result.handled == N_EVENTS
    assert all(audit_records.start[i] == 2 for i in killed)
