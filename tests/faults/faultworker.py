"""A worker OS process for the fault suite and the soak: an EventService handling ``Job``.

Run by :class:`faultkit.WorkerPool`::

    python tests/faults/faultworker.py --url redis://... --rec-url redis://... \
        --prefix p --run r [--concurrency 8] [--visibility 15] [--no-scheduler] ...

It records every handler start, success and failure into the recorder Redis (see
``faultkit``), keeps the ids it has started but not yet acked or failed in
``rec:{run}:inprog:{pid}``, and exits cleanly (closing the service) on SIGTERM.
``--clock-skew S`` shifts this process's ``time.time()``/``time.time_ns()`` by S seconds.
``--declare-every S`` declares a recurring schedule of ``Job`` at every start.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))

import redis.asyncio as aioredis
from faultkit import Job, job_types, rec_key

from delayq import EventService, InMemoryMetrics, current_delivery, fixed
from delayq.metrics import NoopMetrics


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--rec-url", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--types", type=int, default=1, help="handle Job and N-1 more such types")
    p.add_argument("--visibility", type=float, default=15.0)
    p.add_argument("--handler-timeout", type=float, default=None)
    p.add_argument("--retry-attempts", type=int, default=3)
    p.add_argument("--backoff", type=float, default=0.2, help="fixed retry backoff, seconds")
    p.add_argument("--scheduling-interval", type=float, default=1.0)
    p.add_argument("--lock-timeout", type=float, default=10.0)
    p.add_argument("--polling-timeout", type=float, default=5.0)
    p.add_argument("--no-scheduler", action="store_true", help="consumers only")
    p.add_argument("--no-handler", action="store_true", help="scheduler only")
    p.add_argument("--clock-skew", type=float, default=0.0)
    p.add_argument("--record-lateness", action="store_true")
    p.add_argument("--count-moves", action="store_true", help="count move_due calls by role")
    p.add_argument("--group", default=None, help="handle in this delivery group")
    p.add_argument(
        "--record-runs",
        action="store_true",
        help="record every handler run: pid, id, claim time (Redis clock), start time",
    )
    p.add_argument(
        "--hold",
        default=None,
        metavar="KEY",
        help="handlers finish only once KEY exists in the recorder Redis",
    )
    p.add_argument("--metrics", action="store_true", help="on exit, record the service's counters")
    p.add_argument(
        "--declare-every",
        type=float,
        default=None,
        metavar="S",
        help="declare the schedule 'tick' (Job every S seconds, overlap allow, catch-up 5 min) "
        "at start, as docs/SCHEDULES.md advises; record when in rec:{run}:declared",
    )
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


def skew_clock(seconds: float) -> None:
    """Make this process's wall clock (time.time, time.time_ns) run ``seconds`` off."""
    real_time, real_ns = time.time, time.time_ns
    offset_ns = int(seconds * 1e9)
    time.time = lambda: real_time() + seconds  # type: ignore[assignment]
    time.time_ns = lambda: real_ns() + offset_ns  # type: ignore[assignment]


async def main(args: argparse.Namespace) -> None:
    """Run the service until SIGTERM."""
    pid = os.getpid()
    rec = aioredis.Redis.from_url(args.rec_url, protocol=2)
    run = args.run
    inprog = rec_key(run, f"inprog:{pid}")

    metrics = InMemoryMetrics()
    service = EventService.from_url(
        args.url,
        prefix=args.prefix,
        metrics=metrics if args.metrics else NoopMetrics(),
        visibility_timeout=args.visibility,
        handler_timeout=args.handler_timeout,
        retry_attempts=args.retry_attempts,
        retry_backoff=fixed(args.backoff),
        scheduling_interval=args.scheduling_interval,
        lock_timeout=args.lock_timeout,
        polling_timeout=args.polling_timeout,
        enable_scheduling=not args.no_scheduler,
        shutdown_grace=2.0,
    )

    # Instrument the store: an id leaves this process's in-progress set only once its ack or
    # failure has been written to the queue Redis.
    store = service.store
    real_ack, real_fail = store.deliveries.ack, store.deliveries.fail

    async def ack(type_name, done, **kw):  # type: ignore[no-untyped-def]
        done = list(done)
        n = await real_ack(type_name, done, **kw)
        if done:
            await rec.srem(inprog, *[i for i, _ in done])
        return n

    async def fail(type_name, claimed, **kw):  # type: ignore[no-untyped-def]
        code = await real_fail(type_name, claimed, **kw)
        await rec.srem(inprog, claimed.raw_id)
        return code

    real_move = store.scheduling.move_due

    async def move_due(type_name, *a, **kw):  # type: ignore[no-untyped-def]
        # who moves how often: the failover benchmark reports the standbys' cost
        role = "leader" if service.is_scheduler_leader else "standby"
        await rec.hincrby(rec_key(run, "moves"), role, 1)
        return await real_move(type_name, *a, **kw)

    if args.count_moves:
        store.scheduling.move_due = move_due  # type: ignore[method-assign]
    store.deliveries.ack = ack  # type: ignore[method-assign]
    store.deliveries.fail = fail  # type: ignore[method-assign]

    async def handle(job: Job) -> bool:
        delivery = current_delivery()
        attempt = delivery.attempt if delivery else 1
        async with rec.pipeline(transaction=True) as pipe:
            pipe.hincrby(rec_key(run, "start"), job.id, 1)
            pipe.sadd(inprog, job.id)
            if (
                args.record_lateness
                and attempt == 1
                and delivery
                and delivery.lateness_ms is not None
            ):
                pipe.rpush(rec_key(run, "late"), f"{delivery.lateness_ms:.1f}")
                pipe.rpush(
                    rec_key(run, "due-late"), f"{delivery.due_ms} {delivery.lateness_ms:.1f}"
                )
            if args.record_runs and delivery:
                claimed_ms = delivery.claimed_us // 1000
                pipe.rpush(
                    rec_key(run, "runs"), f"{pid} {job.id} {claimed_ms} {time.time_ns() // 10**6}"
                )
            await pipe.execute()
        if job.sleep_ms:
            try:
                await asyncio.sleep(job.sleep_ms / 1000)
            except asyncio.CancelledError:
                # delayq cancelled the run (its lease was lost, its event cancelled, or the
                # service stops): it stays in inprog, and is counted here
                with anyio.CancelScope(shield=True):
                    await rec.hincrby(rec_key(run, "cancelled"), job.id, 1)
                raise
        if job.block_ms:
            # everything in progress here stalls with the event loop: remember what
            stalled = await rec.smembers(inprog)
            if stalled:
                async with rec.pipeline(transaction=False) as pipe:
                    for i in stalled:
                        pipe.hincrby(rec_key(run, "stalled"), i, 1)
                    await pipe.execute()
            time.sleep(job.block_ms / 1000)  # blocks the event loop on purpose
        while args.hold and not await rec.exists(args.hold):
            await asyncio.sleep(0.02)  # held until the test lets it go
        if attempt <= job.fail_times:
            await rec.hincrby(rec_key(run, "fail"), job.id, 1)
            return False
        # shielded: a lost lease's cancel must not land between the record and the return
        # (a success counted that was neither acked nor found stale); delayq's cancel waits
        # for the shield, then the run returns and its ack goes (or meets its lost lease)
        with anyio.CancelScope(shield=True):
            await rec.hincrby(rec_key(run, "end"), job.id, 1)
        return True

    if not args.no_handler:
        for job_type in job_types(args.types):
            service.add_handler(job_type, handle, concurrency=args.concurrency, group=args.group)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with service:
        if args.declare_every is not None:
            await service.schedule(
                "tick", Job, every=timedelta(seconds=args.declare_every), overlap="allow",
                catch_up=timedelta(minutes=5),
            )  # fmt: skip
            await rec.rpush(rec_key(run, "declared"), f"{pid} {time.time():.3f}")
        sched = service._scheduler  # the fault tests map lock tokens to processes
        if sched is not None:
            await rec.hset(rec_key(run, "tokens"), sched.token, pid)
        await rec.hset(rec_key(run, "ready"), pid, 1)
        await stop.wait()
    if args.metrics:  # the counters of this process, for the history checks
        totals: dict[str, int] = {}
        for (name, _), value in metrics.counters.items():
            totals[name] = totals.get(name, 0) + value
        if totals:
            await rec.hset(rec_key(run, f"metrics:{pid}"), mapping=totals)
    await rec.aclose()


if __name__ == "__main__":
    arguments = parse_args()
    logging.basicConfig(
        level=getattr(logging, arguments.log_level.upper()),
        format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    if arguments.clock_skew:
        skew_clock(arguments.clock_skew)
    asyncio.run(main(arguments))
