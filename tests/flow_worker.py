"""A worker process for tests/test_flow.py (fleet-wide flow limits, pause).

    python tests/flow_worker.py URL PREFIX NAME {work|hang} [--ms N] [--concurrency N]
        [--visibility S]

Handles ``flow-job`` events until SIGTERM. Every handler start is recorded in Redis
under ``<PREFIX>-test:*`` (outside the queue's keys):

* ``starts``: a list of ``"<claimed_us>:<id>:<NAME>"`` (Redis's clock at the claim);
* ``running`` / ``max``: handlers running now across the fleet, and the highest seen
  (one small script, so the maximum is exact);
* ``work`` mode sleeps ``--ms`` then counts the id in the hash ``done``; ``hang`` mode
  only pushes the id to the list ``hung`` and sleeps for an hour (the test kills it);
* for an event with a flow key K (tests/test_flow_keys.py): ``krunning`` / ``kmax``
  (HASHes key -> running now, highest seen) and the list ``order:K`` of its starts.

When the service has started it adds NAME to the set ``<PREFIX>-test:ready``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery

_ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
redis.call('RPUSH', KEYS[3], ARGV[1])
if ARGV[2] ~= '' then
  local k = redis.call('HINCRBY', KEYS[4], ARGV[2], 1)
  if k > tonumber(redis.call('HGET', KEYS[5], ARGV[2]) or '0') then
    redis.call('HSET', KEYS[5], ARGV[2], k)
  end
  redis.call('RPUSH', KEYS[6] .. ARGV[2], ARGV[1])
end
return n
"""


class FlowJob(Event, event_name="flow-job"):
    """The event type the flow tests enqueue."""

    n: int = 0


async def main() -> None:
    """Parse the arguments and run the worker until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("name")
    parser.add_argument("mode", choices=["work", "hang"])
    parser.add_argument("--ms", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--visibility", type=float, default=5.0)
    args = parser.parse_args()
    t = f"{args.prefix}-test"
    raw = aioredis.Redis.from_url(args.url, protocol=2)
    enter = raw.register_script(_ENTER)

    async def handle(event: FlowJob) -> None:
        d = current_delivery()
        assert d is not None
        if args.mode == "hang":  # killed while running: kept out of the running count
            await raw.rpush(f"{t}:hung", event.id)
            await asyncio.sleep(3600)
        await enter(keys=[f"{t}:running", f"{t}:max", f"{t}:starts", f"{t}:krunning",
                          f"{t}:kmax", f"{t}:order:"],
                    args=[f"{d.claimed_us}:{event.id}:{args.name}", d.flow_key or ""])  # fmt: skip
        try:
            await asyncio.sleep(args.ms / 1000)
        finally:
            if d.flow_key:
                await raw.hincrby(f"{t}:krunning", d.flow_key, -1)
            await raw.decr(f"{t}:running")
        await raw.hincrby(f"{t}:done", event.id, 1)

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
        service.add_handler(FlowJob, handle, concurrency=args.concurrency)
        await raw.sadd(f"{t}:ready", args.name)
        await stop.wait()
    await raw.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {__file__} %(message)s")
    asyncio.run(main())
