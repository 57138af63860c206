"""A worker process for tests/test_partitions.py (SIGKILL of a partition owner).

    python tests/partition_worker.py CLUSTER_URL PREFIX NAME

Handles ``part-kill`` events (8 partitions) on the cluster until killed; records
each delivery as ``HINCRBY {PREFIX-test}:count <id> 1``, and adds NAME to
``{PREFIX-test}:ready`` once started.
"""

from __future__ import annotations

import asyncio
import sys

from redis.asyncio.cluster import RedisCluster

from delayq import Event, EventService


class KillJob(Event, event_name="part-kill", partitions=8):
    """The event type of the SIGKILL test."""

    n: int = 0


async def main() -> None:
    """Run the worker until killed."""
    url, prefix, name = sys.argv[1:4]
    raw = RedisCluster.from_url(url)
    test_key = "{" + prefix + "-test}"

    async def handle(event: KillJob) -> None:
        await raw.hincrby(f"{test_key}:count", event.id, 1)

    async with EventService.from_url(
        url, cluster=True, prefix=prefix, visibility_timeout=2.0, scheduling_interval=0.2,
        lock_timeout=10.0, polling_timeout=1.0,
    ) as service:  # fmt: skip
        service.add_handler(KillJob, handle, concurrency=4)
        await raw.sadd(f"{test_key}:ready", name)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
