"""A worker process for tests/test_dashboard_browser.py.

    python tests/dashboard_worker.py URL PREFIX [--heartbeat S] [--groups]

Handles ``ui-job`` events until SIGTERM. A job with ``fail=True`` raises until the
key ``<PREFIX>-test:fixed`` exists (the "fix is deployed"); every handled job's id is
added to the set ``<PREFIX>-test:handled``. No retries: a failure is a dead letter.

With ``--groups`` it also handles ``ui-fanned`` events in three delivery groups: the
default group handles them, ``audit`` raises until ``<PREFIX>-test:fixed`` exists, and
``slow`` holds each until ``<PREFIX>-test:release`` exists; each handled one is added
to ``<PREFIX>-test:handled`` as ``<group>:<id>``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import redis.asyncio as aioredis

from delayq import Event, EventService


class UiJob(Event, event_name="ui-job"):
    """The event type the browser tests enqueue."""

    fail: bool = False
    note: str = ""


class UiFanned(Event, event_name="ui-fanned"):
    """The event type with delivery groups."""


async def main() -> None:
    """Parse the arguments and run the worker until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("--heartbeat", type=float, default=0.3)
    parser.add_argument("--groups", action="store_true")
    args = parser.parse_args()
    raw = aioredis.Redis.from_url(args.url, protocol=2)

    async def handle(event: UiJob) -> None:
        if event.fail and not await raw.exists(f"{args.prefix}-test:fixed"):
            raise RuntimeError(f"cannot handle {event.note!r} yet")
        await raw.sadd(f"{args.prefix}-test:handled", event.id)

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with EventService.from_url(
        args.url,
        prefix=args.prefix,
        retry_attempts=0,
        heartbeat_interval=args.heartbeat,
        history_interval=0.5,
        scheduling_interval=0.2,
        polling_timeout=1.0,
        shutdown_grace=1.0,
    ) as service:
        service.add_handler(UiJob, handle, concurrency=4)
        if args.groups:
            for group in ("audit", "slow"):
                await service.register_group(UiFanned, group)

            def fanned(group: str):  # type: ignore[no-untyped-def]
                async def handle_fanned(event: UiFanned) -> None:
                    if group == "audit" and not await raw.exists(f"{args.prefix}-test:fixed"):
                        raise RuntimeError("audit cannot take it yet")
                    while group == "slow" and not await raw.exists(f"{args.prefix}-test:release"):
                        await asyncio.sleep(0.05)  # a long-running handler (lease renewed)
                    await raw.sadd(f"{args.prefix}-test:handled", f"{group}:{event.id}")

                return handle_fanned

            service.add_handler(UiFanned, fanned("default"))
            for group in ("audit", "slow"):
                service.add_handler(UiFanned, fanned(group), group=group)
        await raw.sadd(f"{args.prefix}-test:ready", str(service.worker_id))
        await stop.wait()
    await raw.aclose()


if __name__ == "__main__":
    asyncio.run(main())
