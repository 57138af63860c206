"""One hot event type on a loopback 3-master Redis Cluster: 1 partition vs N.

    python -m benchmarks.partitions [--events 20000] [--partitions 1,6,12] [--workers 2]

For each partition count, a fresh cluster; the events are enqueued due now
(``enqueue_many``), then ``--workers`` services (each with its own clients, in
this process) handle them with a no-op handler. Prints a table: end-to-end
throughput, and Redis CPU (``used_cpu_sys + used_cpu_user`` from ``INFO cpu``,
before/after) per node, with the busiest node's share. Writes JSON to
``benchmarks/results/partitions-<time>.json``.

What it can and cannot show on 2 cores: the client side (Python) is the
bottleneck here, so throughput barely moves; what moves is where Redis spends
its CPU. With one partition every script of the type runs on one node; with N
spread over 3 masters each node does about a third. The model in
benchmarks/RESULTS.md turns the per-event Redis CPU into a ceiling per node.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis

from delayq import Event, EventService
from delayq.testing.cluster import RedisClusterServer


def _event_type(partitions: int) -> type[Event]:
    class BenchHot(Event, event_name="bench-hot", partitions=partitions):
        n: int = 0

    return BenchHot


def _cpu(ports: list[int]) -> list[float]:
    out = []
    for port in ports:
        client = redis.Redis(port=port)
        info = client.info("cpu")
        out.append(float(info["used_cpu_sys"]) + float(info["used_cpu_user"]))
        client.close()
    return out


async def _run(partitions: int, events: int, workers: int) -> dict[str, Any]:
    with RedisClusterServer(3) as cluster:
        kind = _event_type(partitions)
        done = 0
        finished = asyncio.Event()

        async def handle(event: Event) -> None:
            nonlocal done
            done += 1
            if done >= events:
                finished.set()

        producer = EventService.from_url(cluster.url, cluster=True, prefix="bp",
                                         enable_scheduling=False)  # fmt: skip
        for start in range(0, events, 5000):
            await producer.enqueue_many(
                [kind(id=f"e-{i}") for i in range(start, min(events, start + 5000))]
            )
        await producer.aclose()
        services = [
            EventService.from_url(cluster.url, cluster=True, prefix="bp") for _ in range(workers)
        ]
        cpu0 = _cpu(cluster.ports)
        t0 = time.perf_counter()
        for s in services:
            s.add_handler(kind, handle, concurrency=64)
            await s.start()
        await asyncio.wait_for(finished.wait(), timeout=600)
        seconds = time.perf_counter() - t0
        cpu = [b - a for a, b in zip(cpu0, _cpu(cluster.ports), strict=True)]
        for s in services:
            await s.aclose()
    return {
        "partitions": partitions,
        "events": events,
        "workers": workers,
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds),
        "redis_cpu_s_per_node": [round(c, 3) for c in cpu],
        "busiest_node_share": round(max(cpu) / sum(cpu), 3) if sum(cpu) else 0.0,
        "redis_cpu_us_per_event": round(sum(cpu) / events * 1e6, 1),
    }


async def main() -> None:
    """Run every partition count and print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--partitions", default="1,6,12")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rows = [await _run(int(n), args.events, args.workers) for n in args.partitions.split(",")]
    print(f"\n{args.events} due-now events of one type, {args.workers} worker services, "
          "3-master loopback cluster")  # fmt: skip
    print("| partitions | events/s | Redis CPU s per node | busiest node | Redis CPU µs/event |")
    print("|---:|---:|---|---:|---:|")
    for r in rows:
        nodes = " / ".join(f"{c:.2f}" for c in r["redis_cpu_s_per_node"])
        print(f"| {r['partitions']} | {r['events_per_s']} | {nodes} | "
              f"{r['busiest_node_share']:.0%} | {r['redis_cpu_us_per_event']} |")  # fmt: skip
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    (out / f"partitions-{stamp}.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
