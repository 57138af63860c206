"""A worker process for tests/test_schedules_processes.py.

    python tests/schedule_worker.py URL PREFIX NAME [--sleep S]

Runs an EventService (scheduler on) handling ``sched-job`` events until SIGTERM. Every
first delivery does ``HINCRBY <PREFIX>-test:count <id> 1`` (so a fire enqueued twice
counts 2, a redelivery does not) and every run ``HSET <PREFIX>-test:slot <id>
<slot ms>``. With ``--sleep``, ``<PREFIX>-test:overlaps`` counts runs that started while
another was running (in any process). When started it adds NAME to ``<PREFIX>-test:ready``. It writes no schedule:
the test does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery


class SchedJob(Event, event_name="sched-job"):
    """The event type the schedule tests fire."""

    n: int = 0


async def main() -> None:
    """Parse the arguments and run the worker until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("name")
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    test_key = f"{args.prefix}-test"
    raw = aioredis.Redis.from_url(args.url, protocol=2)

    async def handle(event: SchedJob) -> None:
        delivery = current_delivery()
        assert delivery is not None and delivery.slot is not None
        if args.sleep:
            # fires of this type running at once, over every process (buffer_one's test)
            if await raw.incr(f"{test_key}:running") > 1:
                await raw.incr(f"{test_key}:overlaps")
            try:
                await asyncio.sleep(args.sleep)
            finally:
                await raw.decr(f"{test_key}:running")
        if delivery.attempt == 1:  # a redelivery after a SIGKILL is not a second fire
            await raw.hincrby(f"{test_key}:count", event.id, 1)
        await raw.hset(f"{test_key}:slot", event.id, int(delivery.slot.timestamp() * 1000))

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with EventService.from_url(
        args.url,
        prefix=args.prefix,
        visibility_timeout=5.0,
        scheduling_interval=0.2,
        lock_timeout=1.0,
        polling_timeout=1.0,
        shutdown_grace=2.0,
    ) as service:
        service.add_handler(SchedJob, handle, concurrency=8)
        await raw.sadd(f"{test_key}:ready", args.name)
        await stop.wait()
    await raw.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {__file__} %(message)s")
    asyncio.run(main())
