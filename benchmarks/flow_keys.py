"""``python -m benchmarks.flow_keys``: what flow keys cost (issue 22, fair turns between keys).

Against a fresh private redis-server, one process:

* **throughput**: ``--events`` events due now, a no-op handler (concurrency 64): without
  keys, with every event under one key, spread over ``--keys`` keys (1,000 active keys
  taking turns), and over those keys with ``per_key_concurrency=1`` (ordered per key):
  events/s from the first handler to the last; the median of ``--rounds`` alternated runs.
* **claim script**: Redis's own time per ``claim`` call (``INFO commandstats``,
  ``usec_per_call`` of EVALSHA after ``CONFIG RESETSTAT``), as a consumer with 8 free
  slots makes it (one entry popped with RPOP, up to 7 more in the script), ``--calls``
  calls (nothing acked: at most 8 x calls events must be waiting) over a backlog of
  5,000 events: without keys, with 1,000 keys (8 events per call), with 1,000 keys and
  ``per_key_concurrency=1`` (each key's first event, then its turn parks it).

    python -m benchmarks.flow_keys                        # 20,000 events, 1,000 keys
    python -m benchmarks.flow_keys --events 2000 --keys 100 --rounds 1   # quick

Prints a table and writes ``benchmarks/results/flow-keys-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from delayq import Event, EventService
from delayq.keys import TypeKeys
from delayq.testing import RedisServer

HERE = Path(__file__).resolve().parent


class KeysBench(Event, event_name="keys-bench", flow_key="tenant"):
    """The benchmark's event; ``tenant`` is its flow key ("" for none)."""

    tenant: str = ""


def _events(n: int, keys: int) -> list[KeysBench]:
    """``n`` events spread over ``keys`` keys in turn (0: no key)."""
    return [KeysBench(id=str(i), tenant=f"t{i % keys}" if keys else "") for i in range(n)]


async def _fill(service: EventService, n: int, keys: int) -> None:
    events = _events(n, keys)
    for i in range(0, n, 2000):
        await service.enqueue_many(events[i : i + 2000])


async def throughput(url: str, events: int, keys: int, limits: dict[str, Any]) -> float:
    prefix = f"kb-{uuid.uuid4().hex[:6]}"
    service = EventService.from_url(url, prefix=prefix, enable_scheduling=False)
    if limits:
        await service.set_limits(KeysBench, **limits)
    await _fill(service, events, keys)
    done = asyncio.Event()
    count = 0
    first = 0.0

    async def handle(event: KeysBench) -> None:
        nonlocal count, first
        if not count:
            first = time.perf_counter()
        count += 1
        if count >= events:
            done.set()

    service.add_handler(KeysBench, handle, concurrency=64)
    async with service:
        await asyncio.wait_for(done.wait(), 600)
        elapsed = time.perf_counter() - first
    return events / elapsed


async def claim_time(url: str, keys: int, limits: dict[str, Any], calls: int) -> float:
    prefix = f"kb-{uuid.uuid4().hex[:6]}"
    service = EventService.from_url(url, prefix=prefix, enable_scheduling=False)
    raw = aioredis.Redis.from_url(url, protocol=2)
    ready = TypeKeys(prefix, "keys-bench").ready
    try:
        if limits:
            await service.set_limits(KeysBench, **limits)
        await _fill(service, 5000, keys)
        store = service.store

        async def one() -> None:
            entry = await raw.rpop(ready)
            await store.deliveries.claim_limited("keys-bench", [entry] if entry else [], 7, 60_000)

        await one()  # loads the script
        await raw.config_resetstat()
        for _ in range(calls):
            await one()
        stats = await raw.info("commandstats")
        return float(stats["cmdstat_evalsha"]["usec_per_call"])
    finally:
        await raw.aclose()
        await service.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    out: dict[str, Any] = {"events": args.events, "keys": args.keys, "rounds": args.rounds}
    cases: list[tuple[str, int, dict[str, Any]]] = [
        ("no keys", 0, {}),
        ("one key", 1, {}),
        (f"{args.keys:,} keys", args.keys, {}),
        (f"{args.keys:,} keys, per_key_concurrency=1", args.keys, {"per_key_concurrency": 1}),
    ]
    with RedisServer() as server:
        tp: dict[str, list[float]] = {}
        ct: dict[str, list[float]] = {}
        for r in range(args.rounds):  # alternated: each round runs every case
            for label, keys, limits in cases if r % 2 == 0 else cases[::-1]:
                tp.setdefault(label, []).append(
                    await throughput(server.url, args.events, keys, limits)
                )
                if label != "one key":
                    ct.setdefault(label, []).append(
                        await claim_time(server.url, keys, limits, args.calls)
                    )
        out["throughput"] = {k: statistics.median(v) for k, v in tp.items()}
        out["throughput_runs"] = tp
        out["claim_us"] = {k: statistics.median(v) for k, v in ct.items()}
        out["claim_runs"] = ct
    print(f"flow keys, one process, {args.events:,} events, median of {args.rounds}")
    print("| throughput (concurrency 64, no-op handler) | events/s |\n|---|---:|")
    for label, v in out["throughput"].items():
        print(f"| {label} | {v:,.0f} |")
    print("\n| claim script (8 free slots) | µs per call (Redis) |\n|---|---:|")
    for label, v in out["claim_us"].items():
        print(f"| {label} | {v:.1f} |")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = args.out_dir / f"flow-keys-{stamp}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    asyncio.run(main())
