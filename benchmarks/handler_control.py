"""Costs of controlling running handlers (docs/guides/running-handlers.md), against one
private redis-server:

* ``cancel``: cancel-to-``CancelledError`` latency across processes. ``--workers``
  worker processes (this script with ``--worker``) each run handlers that sleep; each
  of ``--cancels`` rounds enqueues one event, waits until a worker runs it, takes the
  time, calls ``cancel`` from this process, and reads the time the handler recorded
  when it saw ``CancelledError`` (one machine, one clock). Prints p50, p99 and max.
* ``idle``: what the cancel channel costs while nothing is cancelled: the subscribers
  of ``{prefix}:cancel`` (one connection per worker process) and the commands Redis
  processed for the channel during ``--idle`` seconds (``INFO commandstats``: PUBLISH,
  SUBSCRIBE).
* ``middleware``: handler throughput and CPU per event with no middleware, one
  ``async def mw(delivery, call_next)`` and one ``@asynccontextmanager`` middleware,
  ``--rounds`` alternated rounds of ``--events`` due events each, no-op handler; and,
  since on a loaded machine that difference drowns in the rounds' spread, the CPU one
  run through the chain adds, alone: ``--calls`` awaits of the handler with and without
  the middleware around it (the consumer's own code in between), best of 5.

Prints a table and writes ``benchmarks/results/handler-control-<time>.json``::

    python -m benchmarks.handler_control
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aioredis

from delayq import CancelResult, Delivery, Event, EventService, current_delivery
from delayq.runtime.middleware import Pipeline
from delayq.testing import RedisServer

HERE = Path(__file__).resolve().parent


class CtlBench(Event, event_name="ctl-bench"):
    """The benchmark's event."""

    n: int = 0


# -- worker process ----------------------------------------------------------------------


async def worker(url: str, prefix: str, name: str) -> None:
    """Run handlers that sleep and record when they see CancelledError."""
    raw = aioredis.Redis.from_url(url)

    async def handle(event: CtlBench) -> None:
        await raw.hset(f"{prefix}-bench:started", event.id, name)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen = time.time()
            with anyio.CancelScope(shield=True):
                await raw.hset(f"{prefix}-bench:cancelled", event.id, repr(seen))
            raise

    async with EventService.from_url(url, prefix=prefix, polling_timeout=1.0) as service:
        service.add_handler(CtlBench, handle, concurrency=4)
        await raw.sadd(f"{prefix}-bench:ready", name)
        await asyncio.Event().wait()


# -- cancel latency and idle cost ------------------------------------------------------------


async def _until(predicate: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.002)
    raise TimeoutError("condition not met")


async def cancel_figures(url: str, args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"hcb-{uuid.uuid4().hex[:8]}"
    raw = aioredis.Redis.from_url(url)
    procs = _spawn(url, prefix, args.workers)
    try:
        await _until(lambda: _count(raw.scard(f"{prefix}-bench:ready"), args.workers), 60)
        producer = EventService.from_url(url, prefix=prefix, enable_scheduling=False)
        # idle: nothing is cancelled for a while
        before = await _channel_commands(raw)
        await asyncio.sleep(args.idle)
        after = await _channel_commands(raw)
        numsub = dict(await raw.pubsub_numsub(f"{{{prefix}}}:cancel"))
        latencies = []
        for i in range(args.cancels):
            event_id = f"c{i}"
            await producer.enqueue_with_delay(CtlBench(id=event_id), 0)
            await _until(lambda e=event_id: raw.hexists(f"{prefix}-bench:started", e))
            sent = time.time()
            result = await producer.cancel(CtlBench, event_id)
            assert result is CancelResult.SIGNALLED, result
            seen = await _until(lambda e=event_id: raw.hget(f"{prefix}-bench:cancelled", e))
            latencies.append((float(seen) - sent) * 1000)
        await producer.aclose()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
        await raw.aclose()
    latencies.sort()
    return {
        "workers": args.workers,
        "cancels": len(latencies),
        "latency_ms_p50": statistics.median(latencies),
        "latency_ms_p99": latencies[min(len(latencies) - 1, round(0.99 * len(latencies)) - 1)],
        "latency_ms_max": latencies[-1],
        "idle_seconds": args.idle,
        "cancel_channel_subscribers": int(next(iter(numsub.values()))),
        "channel_commands_while_idle": after - before,
    }


def _spawn(url: str, prefix: str, n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` worker processes (this module with ``--worker``)."""
    command = [sys.executable, "-m", "benchmarks.handler_control", "--worker", url, prefix]
    return [subprocess.Popen([*command, f"w{i}"], cwd=HERE.parent) for i in range(n)]


async def _count(awaitable: Any, at_least: int) -> bool:
    return int(await awaitable) >= at_least


async def _channel_commands(raw: aioredis.Redis) -> int:
    stats = await raw.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("publish", "subscribe"))


# -- middleware cost -------------------------------------------------------------------------


async def call_style(delivery: Delivery, call_next: Any) -> Any:
    return await call_next()


@contextlib.asynccontextmanager
async def context_style(delivery: Delivery) -> AsyncIterator[None]:
    yield


MODES = {"none": None, "call": call_style, "context-manager": context_style}


async def one_round(url: str, mode: str, events: int, concurrency: int) -> dict[str, float]:
    prefix = f"hcm-{uuid.uuid4().hex[:8]}"
    producer = EventService.from_url(url, prefix=prefix, enable_scheduling=False)
    await producer.enqueue_many([CtlBench(id=f"e{i}") for i in range(events)])
    await producer.aclose()
    done = asyncio.Event()
    count = 0

    async def handle(event: CtlBench) -> None:
        nonlocal count
        count += 1
        if count == events:
            done.set()

    service = EventService.from_url(url, prefix=prefix, heartbeat_interval=0, history_interval=0)
    middleware = MODES[mode]
    if middleware is not None:
        service.use(middleware)
    service.add_handler(CtlBench, handle, concurrency=concurrency)
    start, cpu0 = time.perf_counter(), time.process_time()
    await service.start()
    await done.wait()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    await service.aclose()
    assert current_delivery() is None
    return {"events_per_s": events / elapsed, "cpu_us_per_event": cpu / events * 1e6}


async def chain_overhead(calls: int) -> dict[str, float]:
    """CPU µs one run through each middleware adds to a no-op handler's await."""

    async def handler(event: CtlBench) -> None:
        return None

    delivery = Delivery("ctl-bench", "e", 1, None, 0, {})
    event = CtlBench(id="e")
    chains: dict[str, Any] = {}
    for mode, middleware in MODES.items():
        if middleware is not None:
            pipeline = Pipeline()
            pipeline.add(middleware)
            chains[mode] = pipeline.chain(handler)

    async def plain() -> None:
        for _ in range(calls):
            await handler(event)

    def through(chain: Any) -> Any:
        async def loop() -> None:
            for _ in range(calls):
                await chain(delivery, event)

        return loop

    best: dict[str, float] = {}
    for _ in range(5):
        for mode in MODES:
            body = plain if mode == "none" else through(chains[mode])
            cpu0 = time.process_time()
            await body()
            us = (time.process_time() - cpu0) / calls * 1e6
            best[mode] = min(best.get(mode, us), us)
    return {mode: best[mode] - best["none"] for mode in MODES}


async def middleware_figures(url: str, args: argparse.Namespace) -> dict[str, Any]:
    rounds: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            rounds[mode].append(await one_round(url, mode, args.events, args.concurrency))
    base = rounds["none"]
    overhead = await chain_overhead(args.calls)
    return {
        mode: {
            "events_per_s_median": statistics.median(r["events_per_s"] for r in results),
            "cpu_us_per_event_median": statistics.median(r["cpu_us_per_event"] for r in results),
            "cpu_us_added_median": statistics.median(
                r["cpu_us_per_event"] - b["cpu_us_per_event"] for r, b in zip(results, base)
            ),
            "chain_cpu_us_added": overhead[mode],
        }
        for mode, results in rounds.items()
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = RedisServer()
    server.start()
    try:
        return {
            "cancel": await cancel_figures(server.url, args),
            "middleware": await middleware_figures(server.url, args),
        }
    finally:
        server.stop()


def run() -> None:
    """Parse arguments, run, print the tables, write the JSON."""
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        asyncio.run(worker(*sys.argv[2:5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--cancels", type=int, default=100)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = asyncio.run(main(args))
    c = results["cancel"]
    print(
        f"cancel -> CancelledError across {c['workers']} worker processes, {c['cancels']} "
        f"cancels: p50 {c['latency_ms_p50']:.2f} ms, p99 {c['latency_ms_p99']:.2f} ms, "
        f"max {c['latency_ms_max']:.2f} ms"
    )
    print(
        f"idle cancel channel: {c['cancel_channel_subscribers']} subscribed connections, "
        f"{c['channel_commands_while_idle']} PUBLISH/SUBSCRIBE in {c['idle_seconds']:g} s"
    )
    print(
        f"\n| middleware | events/s (median of {args.rounds}) | CPU µs/event "
        "| added µs/event (rounds) | added µs/run (the chain alone) |"
    )
    print("|---|---:|---:|---:|---:|")
    for mode, m in results["middleware"].items():
        print(
            f"| {mode} | {m['events_per_s_median']:.0f} | {m['cpu_us_per_event_median']:.1f} "
            f"| {m['cpu_us_added_median']:+.1f} | {m['chain_cpu_us_added']:+.2f} |"
        )
    results["settings"] = vars(args) | {"out": None}
    results["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or HERE / "results" / f"handler-control-{stamp}.json"
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    run()
