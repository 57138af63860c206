"""A worker or producer process for tests/test_dependencies_kill.py.

    python tests/dependency_worker.py URL PREFIX work [--cluster] [--stop-at STEP]
    python tests/dependency_worker.py URL PREFIX enqueue [--cluster] [--stop-at STEP]

``work`` handles ``dk-parent`` and ``dk-child`` events (each run counted in the HASH
``<prefix>-runs``, id -> runs) and leads the scheduler, whose relay SIGKILLs this process
right after the relay step STEP (``read``, ``applied``, ``relayed``, ``audit-linked``), the
first time it is reached. ``enqueue`` enqueues ``dk-child`` ``c`` after ``dk-parent``
``p`` and SIGKILLs itself after the registration step STEP (``waiting``, ``linked``,
``applied``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

import redis.asyncio as aioredis

from delayq import Event, EventService
from delayq.operations import dependencies
from delayq.runtime import relay


class Parent(Event, event_name="dk-parent"):
    """A parent."""


class Child(Event, event_name="dk-child"):
    """A child."""


def _stop_at(step: str | None) -> object:
    def hook(name: str) -> None:
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook if step else None


async def main() -> None:
    """Parse the arguments and run."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("mode", choices=["work", "enqueue"])
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--stop-at")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    options = dict(
        prefix=args.prefix,
        scheduling_interval=0.2,
        polling_timeout=0.5,
        lock_timeout=1.0,
        visibility_timeout=2.0,
        shutdown_grace=1.0,
    )
    if args.mode == "enqueue":
        dependencies.STEP_HOOK = _stop_at(args.stop_at)  # type: ignore[assignment]
        async with EventService.from_url(
            args.url, cluster=args.cluster, enable_scheduling=False, **options
        ) as service:
            service._dependencies.audit_ms = 300
            await service.enqueue_with_delay(Child(id="c"), 0, after=[(Parent, "p")])
        return
    relay.STEP_HOOK = _stop_at(args.stop_at)  # type: ignore[assignment]
    if args.cluster:
        from redis.asyncio.cluster import RedisCluster

        rec: aioredis.Redis | RedisCluster = RedisCluster.from_url(args.url)
    else:
        rec = aioredis.Redis.from_url(args.url)

    async def handle(event: Event) -> None:
        await rec.hincrby(f"{args.prefix}-runs", f"{type(event).event_name}:{event.id}", 1)

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with EventService.from_url(args.url, cluster=args.cluster, **options) as service:
        assert service._scheduler is not None
        service._scheduler.relay.audit_ms = 300
        service.add_handler(Parent, handle)
        service.add_handler(Child, handle)
        await service.start()
        await rec.sadd(f"{args.prefix}-ready", str(os.getpid()))
        await stop.wait()
    await rec.aclose()


if __name__ == "__main__":
    asyncio.run(main())
