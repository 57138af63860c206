"""The plain delivery path alone, for a profiler: one worker handles N due events.

A fresh private redis-server; N due events enqueued (enqueue_many, not measured); then a
single-process worker with a no-op handler (no metrics sink, tracing, groups or
partitions) handles them. Prints the worker's CPU (``process_time``) per event. Run it
under a sampling profiler to see where that CPU goes, e.g.::

    py-spy record --rate 500 --format speedscope -o hot.json -- \\
        python benchmarks/hotpath_profile.py --events 100000
    py-spy record --rate 500 -o benchmarks/results/hotpath-flame.svg -- \\
        python benchmarks/hotpath_profile.py --events 100000

``--cprofile`` prints cProfile's top functions (and total calls) instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from delayq import Event, EventService
from delayq.testing import RedisServer


class HotJob(Event, event_name="hot-job"):
    """The benchmark's event."""


async def run(url: str, n: int, concurrency: int, profile: bool) -> None:
    producer = EventService.from_url(url, prefix="hot", enable_scheduling=False)
    for i in range(0, n, 1000):
        await producer.enqueue_many([HotJob(id=str(j)) for j in range(i, min(n, i + 1000))])
    await producer.aclose()
    done = asyncio.Event()
    count = 0

    async def handle(event: HotJob) -> None:
        nonlocal count
        count += 1
        if count >= n:
            done.set()

    service = EventService.from_url(url, prefix="hot")
    service.add_handler(HotJob, handle, concurrency=concurrency)
    profiler = cProfile.Profile() if profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    async with service:
        await done.wait()
        t1, c1 = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.disable()
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(30)
        print(f"total calls: {stats.total_calls:,} ({stats.total_calls / n:.1f} per event)")
    print(f"{n:,} events: {n / (t1 - t0):,.0f}/s, {(c1 - c0) / n * 1e6:.1f} µs CPU per event")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    with RedisServer() as server:
        asyncio.run(run(server.url, args.events, args.concurrency, args.cprofile))


if __name__ == "__main__":
    main()
