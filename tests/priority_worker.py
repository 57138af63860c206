"""A worker process for tests/test_priorities_fleet.py.

    python tests/priority_worker.py URL PREFIX NAME [--cluster] [--sleep-ms N] [--concurrency N]

Handles ``prio-fleet`` and ``prio-fleet-part`` (3 partitions) events until SIGTERM. At each
handler's start it appends ``"<id>|<level>|<attempt>|<NAME>|<unix ms>"`` to the list
``{PREFIX-test}:log`` (the event's ``level`` field is the level it was enqueued at); an event
with ``fail`` set fails its first delivery. Once started it adds NAME to ``{PREFIX-test}:ready``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from delayq import Event, EventService, current_delivery, fixed


class Fleet(Event, event_name="prio-fleet"):
    """The event type of the single-Redis tests."""

    level: int = 0
    fail: bool = False


class FleetPart(Event, event_name="prio-fleet-part", partitions=3):
    """The partitioned event type of the cluster test."""

    level: int = 0
    fail: bool = False


async def main() -> None:
    """Parse the arguments and run the worker until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("name")
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--sleep-ms", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    log_key = "{" + args.prefix + "-test}:log"
    raw = (
        RedisCluster.from_url(args.url)
        if args.cluster
        else aioredis.Redis.from_url(args.url, protocol=2)
    )

    async def handle(event: Fleet | FleetPart) -> None:
        delivery = current_delivery()
        assert delivery is not None
        entry = f"{event.id}|{event.level}|{delivery.attempt}|{args.name}|{int(time.time() * 1000)}"
        await raw.rpush(log_key, entry)
        await asyncio.sleep(args.sleep_ms / 1000)
        if event.fail and delivery.attempt == 1:
            raise RuntimeError("the first delivery fails")

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with EventService.from_url(
        args.url,
        cluster=args.cluster,
        prefix=args.prefix,
        visibility_timeout=5.0,
        scheduling_interval=0.2,
        lock_timeout=1.0,
        polling_timeout=1.0,
        shutdown_grace=2.0,
        retry_backoff=fixed(0.05),
    ) as service:
        service.add_handler(Fleet, handle, concurrency=args.concurrency)
        service.add_handler(FleetPart, handle, concurrency=args.concurrency)
        await raw.sadd("{" + args.prefix + "-test}:ready", args.name)
        await stop.wait()
    await raw.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {__file__} %(message)s")
    asyncio.run(main())
