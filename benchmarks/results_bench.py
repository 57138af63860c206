"""``python -m benchmarks.results_bench``: what kept results cost (issue 33, results).

Against a fresh private redis-server:

* **wake-up latency** — one handler per event, a ``service.result()`` waiting for each:
  the time from the handler's return (its value taken by the ack task) to ``result()``
  returning in the waiting task, over ``--waits`` events handled one after another
  (p50/p99). It spans the ack call, the publish and the waiter's read of the outcome.
* **memory** — ``--events`` events of a type with ``results=`` handled (their envelopes
  gone), each returning a 16-byte string: Redis's ``used_memory`` growth per kept result
  (the ``results`` hash field and the ``rexp`` zset entry), against the same run with a
  type that keeps nothing.

    python -m benchmarks.results_bench                    # 20,000 events, 500 waits
    python -m benchmarks.results_bench --events 2000 --waits 100     # quick
    python -m benchmarks.results_bench --rounds 5 --waits 300        # medians of 5 rounds

Prints a table and writes ``benchmarks/results/results-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from delayq import Event, EventService
from delayq.testing import RedisServer

HERE = Path(__file__).resolve().parent


class Kept(Event, event_name="bench-results", results=timedelta(hours=1)):
    """A type that keeps its results."""


class NotKept(Event, event_name="bench-no-results"):
    """The same type, keeping nothing."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--waits", type=int, default=500)
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="wake-up rounds of --waits each, a fresh server each (medians of their p50/p99)",
    )
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--no-write", action="store_true", help="print only, write no JSON")
    return p.parse_args(argv)


async def wake_latency(url: str, waits: int) -> list[float]:
    """Seconds from each handler's return to its waiter's ``result()`` returning."""
    service = EventService.from_url(url, prefix=f"rb-{uuid.uuid4().hex[:6]}")
    returned: dict[str, float] = {}
    gate = asyncio.Event()

    async def handle(event: Kept) -> str:
        await gate.wait()
        returned[event.id] = time.perf_counter()
        return "done"

    service.add_handler(Kept, handle)
    out = []
    async with service:
        for i in range(waits):
            gate.clear()
            await service.enqueue_with_delay(Kept(id=f"w{i}"), 0)
            waiter = asyncio.create_task(service.result(Kept, f"w{i}", timeout=30))
            await asyncio.sleep(0.02)  # the waiter has subscribed and found it pending
            gate.set()
            await waiter
            out.append(time.perf_counter() - returned[f"w{i}"])
    return out


async def memory_per_event(url: str, event_type: type[Event], events: int) -> float:
    """``used_memory`` growth per handled event of ``event_type`` (bytes)."""
    prefix = f"rm-{uuid.uuid4().hex[:6]}"
    service = EventService.from_url(url, prefix=prefix)
    client = aioredis.from_url(url)
    done = asyncio.Event()
    count = 0

    async def handle(event: Event) -> str:
        nonlocal count
        count += 1
        if count == events:
            done.set()
        return "sixteen-bytes..."

    service.add_handler(event_type, handle, concurrency=64)
    try:
        async with service:
            await service.enqueue_many([event_type(id=f"e{i:08d}") for i in range(10)])
            await asyncio.sleep(1)  # the type's keys and the connections exist
            events += 10
            await client.memory_purge()  # type: ignore[no-untyped-call]
            before = int((await client.info("memory"))["used_memory"])
            for i in range(10, events, 1000):
                await service.enqueue_many(
                    [event_type(id=f"e{j:08d}") for j in range(i, min(events, i + 1000))]
                )
            await asyncio.wait_for(done.wait(), 300)
            await asyncio.sleep(0.5)  # the last acks
            await client.memory_purge()  # type: ignore[no-untyped-call]
            after = int((await client.info("memory"))["used_memory"])
    finally:
        await client.aclose()
    return (after - before) / (events - 10)


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run both measurements on private servers; return the figures."""
    per_round: list[list[float]] = []
    for _ in range(args.rounds):
        with RedisServer() as server:
            per_round.append(await wake_latency(server.url, args.waits))
    with RedisServer() as server:
        kept = await memory_per_event(server.url, Kept, args.events)
        plain = await memory_per_event(server.url, NotKept, args.events)
        version = (await aioredis.from_url(server.url).info("server"))["redis_version"]
    rounds = [
        {"wake_p50_ms": 1000 * pct(r, 0.5), "wake_p99_ms": 1000 * pct(r, 0.99)} for r in per_round
    ]
    extra: dict[str, Any] = {}
    if args.rounds > 1:
        pooled = [x for r in per_round for x in r]
        extra = {
            "rounds": rounds,
            "pooled_wake_p50_ms": 1000 * pct(pooled, 0.5),
            "pooled_wake_p99_ms": 1000 * pct(pooled, 0.99),
        }
    return {
        "waits": args.waits,
        "events": args.events,
        "wake_p50_ms": statistics.median(r["wake_p50_ms"] for r in rounds),
        "wake_p99_ms": statistics.median(r["wake_p99_ms"] for r in rounds),
        **extra,
        "bytes_per_kept_result": kept - plain,
        "bytes_kept_type": kept,
        "bytes_plain_type": plain,
        "redis": version,
        "python": platform.python_version(),
    }


def run(argv: list[str] | None = None) -> None:
    """Measure, print the table, write the JSON."""
    args = parse_args(argv)
    load_before = os.getloadavg()
    figures = asyncio.run(main(args))
    command = " ".join(
        ["python -m benchmarks.results_bench", *(argv if argv is not None else sys.argv[1:])]
    )
    figures |= {
        "command": command,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    for i, r in enumerate(figures.get("rounds", [])):
        print(f"round {i + 1}: p50 {r['wake_p50_ms']:.2f} ms  p99 {r['wake_p99_ms']:.2f} ms")
    of = ""
    if "rounds" in figures:
        pooled = (figures["pooled_wake_p50_ms"], figures["pooled_wake_p99_ms"])
        print(f"pooled: p50 {pooled[0]:.2f} ms  p99 {pooled[1]:.2f} ms")
        of = " (medians of the rounds)"
    p50, p99 = figures["wake_p50_ms"], figures["wake_p99_ms"]
    print(f"result() wake-up, {figures['waits']} waits{of}:  p50 {p50:.2f} ms  p99 {p99:.2f} ms")
    print(
        f"memory per kept result ({figures['events']} events, 16-byte value): "
        f"{figures['bytes_per_kept_result']:.0f} B  (type with results "
        f"{figures['bytes_kept_type']:.0f} B/event left, without {figures['bytes_plain_type']:.0f})"
    )
    if not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d-%H%M")
        path = args.out / f"results-{stamp}.json"
        path.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    run()
