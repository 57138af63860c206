"""``python -m benchmarks.flow``: what flow limits cost, and what a throttled fleet sends (issue 22).

Against a fresh private redis-server, one process:

* **throughput**: ``--events`` events due now, a no-op handler (concurrency 64), with no
  limit, with a fleet-wide ``concurrency=16`` and with ``rate="2000/s"``: events/s from
  the first claim to the last handler.
* **partitioned**: half as many events, a 10 ms handler, 16 at a time: by
  ``add_handler(concurrency=16)`` or by a fleet-wide ``concurrency=16``, for one
  partition and for 4 (the limit split 4 per partition); the best of 2 alternated runs.
* **failing handlers**: ``--fail-events`` events whose first delivery fails (retried at
  once), ``concurrency=16``: a failure frees its slot with a wake token (before, a
  waiting consumer slept its 1 s fallback when no ack came).
* **claim script**: Redis's own time per ``claim`` call (``INFO commandstats``,
  ``usec_per_call`` of EVALSHA after ``CONFIG RESETSTAT``), claiming one entry per call
  from a ready list of 5,000, with no limits, with limits that never bind (concurrency
  and rate both set), and held back (paused: the entry goes back to the list).
* **idle commands/s while throttled**: commands clients send (``MONITOR``, calls inside
  scripts excluded) over ``--seconds`` while 200 events wait and the type is paused, and
  while it is rate-limited to 20/s (EVALSHA counts claims and the scheduler's moves).

    python -m benchmarks.flow                 # defaults: 5,000 events, 5 s windows
    python -m benchmarks.flow --events 2000 --seconds 3   # quick
    python -m benchmarks.flow --only failing             # one part (a comma list)

Prints a table and writes ``benchmarks/results/flow-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import statistics
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery, fixed
from delayq.testing import RedisServer

HERE = Path(__file__).resolve().parent
_LINE = re.compile(rb'^\+\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]+)"')


class FlowBench(Event, event_name="flow-bench"):
    """The benchmark's event."""


class FlowBenchParts(Event, event_name="flow-bench-p", partitions=4):
    """The benchmark's partitioned event."""


async def _fill(service: EventService, n: int, cls: type[Event] = FlowBench) -> None:
    for i in range(0, n, 1000):
        await service.enqueue_many([(cls(id=str(j)), 0) for j in range(i, min(n, i + 1000))])


async def throughput(
    url: str, events: int, limits: dict[str, Any], cls: type[Event] = FlowBench,
    fail_first: bool = False, handler_ms: float = 0, local: int = 64,
) -> float:  # fmt: skip
    prefix = f"fb-{uuid.uuid4().hex[:6]}"
    service = EventService.from_url(url, prefix=prefix, enable_scheduling=False,
                                    retry_backoff=fixed(0))  # fmt: skip
    if limits:
        await service.set_limits(cls, **limits)
    await _fill(service, events, cls)
    done = asyncio.Event()
    count = 0
    first = 0.0

    async def handle(event: Event) -> None:
        nonlocal count, first
        if not first:
            first = time.perf_counter()
        if handler_ms:
            await asyncio.sleep(handler_ms / 1000)
        if fail_first:
            d = current_delivery()
            if d is not None and d.attempt == 1:
                raise RuntimeError("first delivery fails")
        count += 1
        if count >= events:
            done.set()

    service.add_handler(cls, handle, concurrency=local)
    async with service:
        await asyncio.wait_for(done.wait(), 600)
        elapsed = time.perf_counter() - first
    return events / elapsed


async def claim_time(url: str, limits: dict[str, Any], paused: bool, calls: int) -> float:
    prefix = f"fb-{uuid.uuid4().hex[:6]}"
    service = EventService.from_url(url, prefix=prefix, enable_scheduling=False)
    raw = aioredis.Redis.from_url(url, protocol=2)
    try:
        if limits:
            await service.set_limits(FlowBench, **limits)
        if paused:
            await service.pause(FlowBench)
        await _fill(service, 5000)
        store = service.store
        await store.deliveries.claim_limited("flow-bench", [], 1, 60_000)  # loads the script
        await raw.config_resetstat()
        for _ in range(calls):
            await store.deliveries.claim_limited("flow-bench", [], 1, 60_000)
        stats = await raw.info("commandstats")
        return float(stats["cmdstat_evalsha"]["usec_per_call"])
    finally:
        await raw.aclose()
        await service.aclose()


async def monitor(server: RedisServer, seconds: float) -> Counter[str]:
    """Commands sent by clients (not by scripts) during ``seconds``, by name."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(b"MONITOR\r\n")
        await writer.drain()
        assert await reader.readline() == b"+OK\r\n"
        counts: Counter[str] = Counter()
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = await asyncio.wait_for(reader.readline(), timeout=left)
            except asyncio.TimeoutError:
                break
            m = _LINE.match(line)
            if m and m.group(1) != b"lua":
                counts[m.group(2).decode().upper()] += 1
        return counts
    finally:
        writer.close()
        await writer.wait_closed()


async def throttled_idle(server: RedisServer, mode: str, seconds: float) -> dict[str, float]:
    prefix = f"fb-{uuid.uuid4().hex[:6]}"
    service = EventService.from_url(server.url, prefix=prefix)
    started = 0

    async def handle(event: FlowBench) -> None:
        nonlocal started
        started += 1

    if mode == "paused":
        await service.pause(FlowBench)
    else:
        await service.set_limits(FlowBench, rate="20/s")
    await _fill(service, 200 if mode == "paused" else 2000)
    service.add_handler(FlowBench, handle, concurrency=8)
    async with service:
        await asyncio.sleep(2.0)  # settled: scheduler swept, consumer throttled
        before = started
        counts = await monitor(server, seconds)
        starts = (started - before) / seconds
    total = sum(counts.values())
    return {
        "commands_per_s": total / seconds,
        "evalsha_per_s": counts["EVALSHA"] / seconds,
        "blpop_per_s": counts["BLPOP"] / seconds,
        "starts_per_s": starts,
        "by_command": dict(counts),
    }


_PARTS = ("throughput", "partitioned", "failing", "claim", "idle")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--fail-events", type=int, default=500)
    parser.add_argument("--only", default=",".join(_PARTS), help=f"a comma list of {_PARTS}")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    out: dict[str, Any] = {"events": args.events, "seconds": args.seconds}
    with RedisServer() as server:
        if "throughput" in parts:
            tp = {}
            for label, limits in (
                ("no limits", {}),
                ("concurrency=16", {"concurrency": 16}),
                ('rate="2000/s"', {"rate": "2000/s"}),
            ):
                tp[label] = await throughput(server.url, args.events, limits)
            out["throughput"] = tp
        if "partitioned" in parts:
            # a 10 ms handler, 16 at a time: at most 1,600/s; a fleet-wide limit of 16
            # against the same process limited to 16 by add_handler(concurrency=16)
            pt: dict[str, list[float]] = {}
            for _ in range(2):  # alternated, the best of 2
                for label, cls, limits, local in (
                    ("1 partition, add_handler(concurrency=16)", FlowBench, {}, 16),
                    ("1 partition, set_limits(concurrency=16)", FlowBench, {"concurrency": 16},
                     64),
                    ("4 partitions, add_handler(concurrency=16)", FlowBenchParts, {}, 16),
                    ("4 partitions, set_limits(concurrency=16): 4 each", FlowBenchParts,
                     {"concurrency": 16}, 64),
                ):  # fmt: skip
                    got = await throughput(server.url, args.events // 2, limits, cls,
                                           handler_ms=10, local=local)  # fmt: skip
                    pt.setdefault(label, []).append(got)
            out["partitioned"] = {k: max(v) for k, v in pt.items()}
        if "failing" in parts:
            logging.getLogger("delayq").setLevel(logging.ERROR)  # a warning per failure
            out["failing"] = {
                label: await throughput(server.url, args.fail_events, limits, fail_first=True)
                for label, limits in (("no limits", {}), ("concurrency=16", {"concurrency": 16}))
            }
        if "claim" in parts:
            ct: dict[str, list[float]] = {}
            for _ in range(3):  # alternated, the median of 3
                for label, limits, paused in (
                    ("no limits", {}, False),
                    ("limits that never bind", {"concurrency": 10**6, "rate": "1000000/s"},
                     False),
                    ("paused (held back)", {}, True),
                ):  # fmt: skip
                    t = await claim_time(server.url, limits, paused, args.calls)
                    ct.setdefault(label, []).append(t)
            out["claim_us"] = {k: statistics.median(v) for k, v in ct.items()}
        if "idle" in parts:
            out["idle"] = {
                mode: await throttled_idle(server, mode, args.seconds)
                for mode in ("paused", "rate")
            }
    print(f"flow control, one process, {args.events} events")
    for key, title in (("throughput", "throughput (concurrency 64, no-op handler)"),
                       ("partitioned", "10 ms handler, 16 at a time (at most 1,600/s)"),
                       ("failing", f"{args.fail_events} events, each failing once "
                                   "(retried at once)")):  # fmt: skip
        if key in out:
            print(f"| {title} | events/s |\n|---|---:|")
            for label, v in out[key].items():
                print(f"| {label} | {v:,.0f} |")
            print()
    if "claim_us" in out:
        print("| claim script, one entry per call | µs per call (Redis) |\n|---|---:|")
        for label, v in out["claim_us"].items():
            print(f"| {label} | {v:.2f} |")
        print()
    if "idle" in out:
        print("| throttled worker (8 slots) | commands/s | EVALSHA/s | BLPOP/s | starts/s |")
        print("|---|---:|---:|---:|---:|")
        for mode, d in out["idle"].items():
            what = "paused, 200 waiting" if mode == "paused" else 'rate="20/s", 2000 waiting'
            print(f"| {what} | {d['commands_per_s']:.1f} | {d['evalsha_per_s']:.1f} | "
                  f"{d['blpop_per_s']:.1f} | {d['starts_per_s']:.1f} |")  # fmt: skip
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = args.out_dir / f"flow-{stamp}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    asyncio.run(main())
