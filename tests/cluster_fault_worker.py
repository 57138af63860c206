"""A worker process for tests/test_cluster_failover.py (cluster and Sentinel failovers).

    python tests/cluster_fault_worker.py QUEUE_URL RECORDER_URL PREFIX NAME [--cluster]
        [--ms N] [--concurrency N]

Handles ``cf-hot`` events (6 partitions) and ``cf-tick`` events (a schedule's fires) until
SIGTERM or SIGKILL. Every handler start and end is recorded in a separate *recorder*
Redis (a plain server no fault touches), on the recorder's clock, by one small script
each, so the test reads from the outside what ran when and how many ran at once:

- ``starts`` HASH id -> handler starts; ``ends`` HASH id -> handler ends
- ``log`` LIST ``"<start|end> <id> <recorder ms> <lateness ms>"`` (the delivery's lateness:
  its claim minus its due time, both on the queue's clock)
- ``running:<type>`` / ``max:<type>``: handlers of the type running across the fleet, and
  the most at once
- ``ready`` SET: NAME once the service has started
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery

_MARK = """
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
redis.call('RPUSH', KEYS[4], ARGV[3] .. ' ' .. ARGV[2] .. ' ' .. ms .. ' ' .. ARGV[4])
return n
"""


class Hot(Event, event_name="cf-hot", partitions=6):
    """The partitioned event type of the failover tests."""

    n: int = 0


class Tick(Event, event_name="cf-tick"):
    """The type a schedule fires into."""


async def main() -> None:
    """Parse the arguments and run the worker until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("rec_url")
    parser.add_argument("prefix")
    parser.add_argument("name")
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--ms", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    rec = aioredis.Redis.from_url(args.rec_url)
    mark = rec.register_script(_MARK)

    async def handle(event: Event) -> None:
        name = type(event).event_name
        counters = [f"running:{name}", f"max:{name}"]
        delivery = current_delivery()
        late = delivery.lateness_ms if delivery is not None else None
        await mark(keys=[*counters, "starts", "log"], args=[1, event.id, "start", late or 0])
        try:
            await asyncio.sleep(args.ms / 1000)
        finally:
            await mark(keys=[*counters, "ends", "log"], args=[-1, event.id, "end", 0])

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with EventService.from_url(
        args.url, cluster=args.cluster, prefix=args.prefix, visibility_timeout=3.0,
        scheduling_interval=0.2, takeover_delay=0.5, polling_timeout=1.0, shutdown_grace=2.0,
    ) as service:  # fmt: skip
        service.add_handler(Hot, handle, concurrency=args.concurrency)
        service.add_handler(Tick, handle, concurrency=4)
        await rec.sadd("ready", args.name)
        await stop.wait()
    await rec.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {__file__} %(name)s %(message)s")
    asyncio.run(main())
