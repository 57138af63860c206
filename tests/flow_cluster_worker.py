"""A worker process for tests/test_flow_cluster.py (flow limits on a partitioned type).

    python tests/flow_cluster_worker.py CLUSTER_URL PREFIX NAME [--ms N] [--concurrency N]

Handles ``cflow-part`` events (6 partitions, spread over the cluster's masters) until
SIGTERM. Every handler start is recorded under the hash tag ``{PREFIX-test}`` (outside
the queue's keys): ``starts`` (a list of ``"<claimed_us>:<id>:<NAME>"``, Redis's clock
at the claim), ``running`` / ``max`` (handlers running across the fleet and the highest
seen, one small script so the maximum is exact), and ``done`` (a hash of handled ids).
When the service has started it adds NAME to the set ``ready``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from redis.asyncio.cluster import RedisCluster

from delayq import Event, EventService, current_delivery

_ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
redis.call('RPUSH', KEYS[3], ARGV[1])
return n
"""


class PartJob(Event, event_name="cflow-part", partitions=6):
    """The partitioned event type of the cluster flow tests."""

    n: int = 0


async def main() -> None:
    """Parse the arguments and run the worker until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("name")
    parser.add_argument("--ms", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    t = "{" + args.prefix + "-test}"
    raw = RedisCluster.from_url(args.url)
    enter = raw.register_script(_ENTER)

    async def handle(event: PartJob) -> None:
        d = current_delivery()
        assert d is not None
        await enter(keys=[f"{t}:running", f"{t}:max", f"{t}:starts"],
                    args=[f"{d.claimed_us}:{event.id}:{args.name}"])  # fmt: skip
        try:
            await asyncio.sleep(args.ms / 1000)
        finally:
            await raw.decr(f"{t}:running")
        await raw.hincrby(f"{t}:done", event.id, 1)

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with EventService.from_url(
        args.url, cluster=True, prefix=args.prefix, visibility_timeout=5.0,
        scheduling_interval=0.2, lock_timeout=1.0, polling_timeout=1.0, shutdown_grace=2.0,
    ) as service:  # fmt: skip
        service.add_handler(PartJob, handle, concurrency=args.concurrency)
        await raw.sadd(f"{t}:ready", args.name)
        await stop.wait()
    await raw.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {__file__} %(message)s")
    asyncio.run(main())
