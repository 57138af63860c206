"""A worker process for tests/test_multiprocess.py.

    python tests/core_worker.py URL PREFIX NAME {count|hang} [--visibility S] [--concurrency N]

Runs an EventService handling ``core-mp-job`` events until SIGTERM. Every handler records
what it did in Redis under ``<PREFIX>-test:*`` (outside the queue's keys):

* ``count`` mode: ``HINCRBY <PREFIX>-test:count <id> 1`` and ``HSET <PREFIX>-test:by <id>
  <NAME>:<attempt>``, after a short pause;
* ``hang`` mode: ``HSET <PREFIX>-test:started <id> <NAME>:<attempt>``, then sleeps for an hour
  (the test kills the process).

When the service has started it adds NAME to the set ``<PREFIX>-test:ready``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery


class MpJob(Event, event_name="core-mp-job"):
    """The event type the multi-process tests enqueue."""

    n: int = 0


async def main() -> None:
    """Parse the arguments and run the worker until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("name")
    parser.add_argument("mode", choices=["count", "hang"])
    parser.add_argument("--visibility", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    test_key = f"{args.prefix}-test"
    raw = aioredis.Redis.from_url(args.url, protocol=2)

    async def handle(event: MpJob) -> None:
        delivery = current_delivery()
        assert delivery is not None
        mark = f"{args.name}:{delivery.attempt}"
        if args.mode == "hang":
            await raw.hset(f"{test_key}:started", event.id, mark)
            await asyncio.sleep(3600)
        await asyncio.sleep(0.005)
        await raw.hincrby(f"{test_key}:count", event.id, 1)
        await raw.hset(f"{test_key}:by", event.id, mark)

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with EventService.from_url(
        args.url,
        prefix=args.prefix,
        visibility_timeout=args.visibility,
        scheduling_interval=0.2,
        lock_timeout=1.0,
        polling_timeout=1.0,
        shutdown_grace=2.0,
    ) as service:
        service.add_handler(MpJob, handle, concurrency=args.concurrency)
        await raw.sadd(f"{test_key}:ready", args.name)
        await stop.wait()
    await raw.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {__file__} %(message)s")
    asyncio.run(main())
