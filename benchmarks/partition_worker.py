"""A worker process for ``python -m benchmarks.partitions --scenarios join,rolling``.

    python benchmarks/partition_worker.py CLUSTER_URL REC_URL PREFIX RUN

Handles ``bench-churn`` events (6 partitions) on the cluster with a no-op handler until
SIGTERM (then closes its service: a graceful stop). Records into the recorder Redis
(a separate single redis-server, so the queue's cluster holds only queue keys):

============================ ====== =======================================================
``bc:{run}:late``            LIST   ``"<due ms> <lateness ms> <shard> <id>"`` of each first delivery
``bc:{run}:again``           LIST   ids of later deliveries (an interrupted first one)
``bc:{run}:tokens``          HASH   scheduler token -> pid
``bc:{run}:ready``           HASH   pid -> 1 once its service has started
``bc:{run}:evictions``       LIST   ``"<redis ms> <evicting pid> <evicted token>"``
``bc:{run}:joined``          HASH   scheduler token -> Redis ms of its first membership beat
``bc:{run}:moves``           LIST   ``"<redis ms> <pid> <shard> <moved> <late ms>"`` per move
============================ ====== =======================================================
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import Any

import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery
from delayq.partitions.shards import shard_for


class ChurnJob(Event, event_name="bench-churn", partitions=6):
    """The benchmark's event type."""

    n: int = 0


async def _ms(rec: aioredis.Redis) -> int:
    seconds, micros = await rec.time()
    return int(seconds) * 1000 + int(micros) // 1000


def key(run: str, name: str) -> str:
    """A recorder key of this run."""
    return f"bc:{run}:{name}"


async def main() -> None:
    """Run the service until SIGTERM."""
    url, rec_url, prefix, run = sys.argv[1:5]
    pid = os.getpid()
    rec = aioredis.Redis.from_url(rec_url, protocol=2)
    service = EventService.from_url(url, cluster=True, prefix=prefix, shutdown_grace=2.0)
    store = service.store
    real_membership = store.scheduling.scheduler_membership

    async def membership(token: str, ttl_ms: int, mode: str = "beat") -> Any:
        if mode.startswith("evict:"):
            await rec.rpush(key(run, "evictions"), f"{await _ms(rec)} {pid} {mode[6:]}")
        reply = await real_membership(token, ttl_ms, mode)
        if mode == "beat":  # the first beat is the join
            await rec.hsetnx(key(run, "joined"), token, await _ms(rec))
        return reply

    store.scheduling.scheduler_membership = membership  # type: ignore[method-assign]
    real_move = store.scheduling.move_due

    async def move_due(shard: str, *args: Any, **kwargs: Any) -> Any:
        r = await real_move(shard, *args, **kwargs)
        if r.moved:
            await rec.rpush(key(run, "moves"), f"{r.now_ms} {pid} {shard} {r.moved} {r.late_ms}")
        return r

    store.scheduling.move_due = move_due  # type: ignore[method-assign,assignment]

    async def handle(job: ChurnJob) -> None:
        delivery = current_delivery()
        if delivery is None or delivery.lateness_ms is None:
            return
        if delivery.attempt != 1:
            await rec.rpush(key(run, "again"), job.id)
            return
        shard = shard_for(ChurnJob.event_name, job.id, 6)
        await rec.rpush(
            key(run, "late"), f"{delivery.due_ms} {delivery.lateness_ms:.1f} {shard} {job.id}"
        )

    service.add_handler(ChurnJob, handle, concurrency=32)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with service:
        scheduler = service._scheduler
        assert scheduler is not None
        await rec.hset(key(run, "tokens"), scheduler.token, pid)
        await rec.hset(key(run, "ready"), pid, 1)
        await stop.wait()
    await rec.aclose()


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s"
    )
    asyncio.run(main())
