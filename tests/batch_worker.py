"""A worker or producer process for tests/test_batches_kill.py.

    python tests/batch_worker.py URL PREFIX work [--cluster] [--stop-at STEP]
        [--stop-at-batch STEP]
    python tests/batch_worker.py URL PREFIX produce [--cluster] [--stop-at STEP] [--plain]

``work`` handles ``bk-member``, ``bk-plain`` and ``bk-adder`` events and the ``bk-done``
callback (each run counted in the HASH ``<prefix>-runs``, ``type:id`` -> runs; the
callback also writes what its batch held to ``<prefix>-seen``, ``total succeeded
failed``) and leads the scheduler, whose relay SIGKILLs this process right after the
relay step STEP (``read``, ``applied``, ``relayed``), the first time it is reached. A
``bk-adder`` adds ``Plain(id="x")`` (due in 0.3 s) to its own batch; with
``--stop-at-batch STEP`` the process SIGKILLs itself right after that step of the add
(``added``, ``prelinked``, ``enqueued``, ...). An adder's retry first waits until ``x``
is not pending (done, or never enqueued), so that it adds again a member done meanwhile.
``produce`` opens a batch with ``on_complete=Done(id="done")``, adds ``Member(id="m")``
(with ``--plain``, ``Plain(id="m")``: a type that keeps no results) and SIGKILLs itself
after the batch step STEP (``opened``, ``callbacks``, ``added``, ``prelinked``,
``enqueued``, ``linked``, ``applied``); its batch's open lease is 0.5 s and an add's grace
0.3 s, so the sweep soon finishes what it left.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from datetime import timedelta

import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery
from delayq.operations import batches
from delayq.runtime import relay


class Member(Event, event_name="bk-member", results=timedelta(hours=1)):
    """A member (keeps its result: done before its link, it still counts)."""


class Plain(Event, event_name="bk-plain"):
    """A member whose type keeps no results (done before its link, it leaves no record)."""


class Adder(Event, event_name="bk-adder"):
    """A member that adds ``Plain(id="x")`` to its own batch."""


class Done(Event, event_name="bk-done"):
    """The batch's on_complete callback."""


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
    parser.add_argument("mode", choices=["work", "produce"])
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--stop-at")
    parser.add_argument("--stop-at-batch")
    parser.add_argument("--plain", action="store_true")
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
    if args.cluster:
        from redis.asyncio.cluster import RedisCluster

        rec: aioredis.Redis | RedisCluster = RedisCluster.from_url(args.url)
    else:
        rec = aioredis.Redis.from_url(args.url)
    if args.mode == "produce":
        batches.STEP_HOOK = _stop_at(args.stop_at)  # type: ignore[assignment]
        async with EventService.from_url(
            args.url, cluster=args.cluster, enable_scheduling=False, **options
        ) as service:
            service._batches.lease_ms = 500
            service._batches.grace_ms = 300
            async with service.batch(on_complete=Done(id="done")) as batch:
                await batch.enqueue_with_delay(Plain(id="m") if args.plain else Member(id="m"), 0)
        await rec.aclose()
        return
    relay.STEP_HOOK = _stop_at(args.stop_at)  # type: ignore[assignment]
    batches.STEP_HOOK = _stop_at(args.stop_at_batch)  # type: ignore[assignment]

    async def member(event: Member) -> dict[str, int]:
        await rec.hincrby(f"{args.prefix}-runs", f"bk-member:{event.id}", 1)
        return {"ok": 1}

    async def plain(event: Plain) -> None:
        await rec.hincrby(f"{args.prefix}-runs", f"bk-plain:{event.id}", 1)

    async def adder(event: Adder) -> None:
        runs = await rec.hincrby(f"{args.prefix}-runs", f"bk-adder:{event.id}", 1)
        if runs > 1:
            # the retry, once the member the first run enqueued (if it did) is done
            for _ in range(200):
                if (await service.inspect(Plain, "x")).state == "absent":
                    break
                await asyncio.sleep(0.05)
        d = current_delivery()
        assert d is not None and d.batch is not None
        await d.batch.enqueue_with_delay(Plain(id="x"), 0.3)

    async def done(event: Done) -> None:
        d = current_delivery()
        assert d is not None and d.batch is not None and d.batch.info is not None
        info = d.batch.info
        await rec.set(f"{args.prefix}-seen", f"{info.total} {info.succeeded} {info.failed}")
        await rec.hincrby(f"{args.prefix}-runs", f"bk-done:{event.id}", 1)

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with EventService.from_url(args.url, cluster=args.cluster, **options) as service:
        assert service._scheduler is not None
        service._scheduler.relay.audit_ms = 300
        service._scheduler.relay.sweeper.grace_ms = 300
        service.add_handler(Member, member)
        service.add_handler(Plain, plain)
        service.add_handler(Adder, adder)
        service.add_handler(Done, done)
        await service.start()
        await rec.sadd(f"{args.prefix}-ready", str(os.getpid()))
        await stop.wait()
    await rec.aclose()


if __name__ == "__main__":
    asyncio.run(main())
