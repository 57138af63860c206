"""A worker process for tests/test_cancel_running.py and benchmarks/cancel_latency.py.

    python tests/control_worker.py URL PREFIX NAME [--visibility S] [--concurrency N]
        [--groups G1,G2] [--cluster] [--marks URL] [--release]

Runs an EventService handling ``ctl-job`` events (in each delivery group named, else in
the default group) and ``ctl-part`` events (3 partitions) until SIGTERM; ``--cluster``:
URL is a Redis Cluster. The marks below go to ``--marks`` (default: URL, a plain Redis). Each handler records under ``<PREFIX>-test:*``, outside
the queue's keys: ``HSET started <id>[/<group>] <NAME>:<attempt>`` and ``HINCRBY runs``,
then sleeps for an hour (``--release``: until something is pushed to the list
``release:<id>[/<group>]``, then records ``HSET done <id>[/<group>] <NAME>:<attempt>`` and
returns); on ``CancelledError`` it records ``HSET cancelled <id>[/<group>]
<NAME>:<attempt>:<unix time>`` (shielded) and re-raises. When the service has started it
adds NAME to the set ``<PREFIX>-test:ready``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time

import anyio
import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery


class CtlJob(Event, event_name="ctl-job"):
    """The event type these tests enqueue."""

    n: int = 0


class CtlPart(Event, event_name="ctl-part", partitions=3):
    """A partitioned type."""

    n: int = 0


async def main() -> None:
    """Parse the arguments and run the worker until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("name")
    parser.add_argument("--visibility", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--groups", default="")
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--marks", default=None)
    parser.add_argument("--release", action="store_true")
    args = parser.parse_args()
    test_key = f"{args.prefix}-test"
    raw = aioredis.Redis.from_url(args.marks or args.url, protocol=2)

    async def handle(event: CtlJob | CtlPart) -> None:
        delivery = current_delivery()
        assert delivery is not None
        run = event.id if delivery.group == "default" else f"{event.id}/{delivery.group}"
        mark = f"{args.name}:{delivery.attempt}"
        await raw.hset(f"{test_key}:started", run, mark)
        await raw.hincrby(f"{test_key}:runs", run, 1)
        try:
            if args.release:
                await raw.blpop([f"{test_key}:release:{run}"], timeout=3600)
                await raw.hset(f"{test_key}:done", run, mark)
                return
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            with anyio.CancelScope(shield=True):
                await raw.hset(f"{test_key}:cancelled", run, f"{mark}:{time.time():.6f}")
            raise

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with EventService.from_url(
        args.url,
        cluster=args.cluster,
        prefix=args.prefix,
        visibility_timeout=args.visibility,
        scheduling_interval=0.2,
        lock_timeout=1.0,
        polling_timeout=1.0,
        shutdown_grace=0.5,
    ) as service:
        for group in args.groups.split(",") if args.groups else [None]:
            service.add_handler(CtlJob, handle, concurrency=args.concurrency, group=group)
        service.add_handler(CtlPart, handle, concurrency=args.concurrency)
        await raw.sadd(f"{test_key}:ready", args.name)
        await stop.wait()
    await raw.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {__file__} %(message)s")
    asyncio.run(main())
