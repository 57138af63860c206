"""``python -m benchmarks.groups``: what delivery groups cost (issue 13).

For 1, 2 and 4 groups of one event type (1 = the default group alone: a type whose
handlers never name a group), against a fresh private redis-server:

* **memory** — ``--events`` events are enqueued due now with no handler running; once the
  scheduler has fanned them out to every group's ready list, Redis's ``used_memory`` growth
  per event (envelope, schedule/ready entries, the ``pending`` count). ``+/group`` is the
  growth per extra group, compared with one single-group event in ``vs 1 group``.
* **throughput** — the same number of events enqueued due now while one process runs a
  no-op handler (concurrency ``--concurrency``) for every group: wall time from the first
  enqueue until every group has handled every event; events/s and deliveries/s (events x
  groups). ``s/extra group`` is the time each extra group adds, compared with the
  single-group run's time in ``vs 1 group`` (target: at most about 1.0).

    python -m benchmarks.groups                 # 20,000 events, best of 3
    python -m benchmarks.groups --events 2000 --repeat 1     # quick

Prints a table and writes ``benchmarks/results/groups-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from delayq import Event, EventService
from delayq.testing import RedisServer

HERE = Path(__file__).resolve().parent
GROUP_COUNTS = (1, 2, 4)


class PaymentCheck(Event, event_name="bench-groups"):
    """The benchmark's event: an order id and a 100-byte field, as in RESULTS.md workload 6."""

    order_id: int = 0
    note: str = "x" * 100


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=64, help="handler slots per group")
    p.add_argument("--repeat", type=int, default=3, help="throughput runs; the best is kept")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--no-write", action="store_true", help="print only, write no JSON")
    return p.parse_args(argv)


def group_names(n: int) -> list[str]:
    """The default group and n - 1 named ones."""
    return ["default", *(f"g{i}" for i in range(2, n + 1))]


async def _service(url: str, prefix: str) -> EventService:
    return EventService.from_url(url, prefix=prefix, scheduling_batch_size=1000)


async def _register(service: EventService, n: int) -> None:
    for name in group_names(n)[1:]:
        await service.register_group(PaymentCheck, name)


def _events(n: int) -> list[PaymentCheck]:
    return [PaymentCheck(id=f"order-{i:08d}", order_id=i) for i in range(n)]


async def memory(url: str, client: aioredis.Redis, n_groups: int, n: int) -> dict[str, Any]:
    """Redis memory per event once fanned out to ``n_groups`` ready lists."""
    prefix = f"bg-{uuid.uuid4().hex[:6]}"
    service = await _service(url, prefix)
    async with service:
        await _register(service, n_groups)
        await client.execute_command("MEMORY", "PURGE")
        before = int((await client.info("memory"))["used_memory"])
        await service.enqueue_many(_events(n))

        async def fanned() -> bool:
            stats = await service.group_stats(PaymentCheck)
            return all(c.ready == n for c in stats.values())

        deadline = time.monotonic() + 120
        while not await fanned():
            if time.monotonic() > deadline:
                raise TimeoutError("fan-out did not finish")
            await asyncio.sleep(0.05)
        after = int((await client.info("memory"))["used_memory"])
    await client.flushall()
    return {"groups": n_groups, "bytes_per_event": (after - before) / n}


async def throughput(url: str, n_groups: int, n: int, concurrency: int) -> dict[str, Any]:
    """Seconds until every group has handled ``n`` events enqueued due now."""
    prefix = f"bg-{uuid.uuid4().hex[:6]}"
    service = await _service(url, prefix)
    names = group_names(n_groups)
    handled = dict.fromkeys(names, 0)
    done = asyncio.Event()

    def handler_for(name: str) -> Any:
        async def handle(event: PaymentCheck) -> None:
            handled[name] += 1
            if all(v >= n for v in handled.values()):
                done.set()

        return handle

    async with service:
        await _register(service, n_groups)
        for name in names:
            service.add_handler(
                PaymentCheck, handler_for(name), concurrency=concurrency, group=name
            )
        await asyncio.sleep(0.5)  # consumers registered and blocking
        events = _events(n)
        start = time.perf_counter()
        for i in range(0, n, 1000):
            await service.enqueue_many(events[i : i + 1000])
        await asyncio.wait_for(done.wait(), timeout=300)
        seconds = time.perf_counter() - start
    return {"groups": n_groups, "seconds": seconds}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement, on one private redis-server."""
    with RedisServer() as server:
        client = aioredis.Redis.from_url(server.url, protocol=2)
        try:
            mem = [await memory(server.url, client, g, args.events) for g in GROUP_COUNTS]
            tput = []
            for g in GROUP_COUNTS:
                runs = []
                for _ in range(args.repeat):
                    runs.append(await throughput(server.url, g, args.events, args.concurrency))
                    await client.flushall()
                tput.append(min(runs, key=lambda r: r["seconds"]))
        finally:
            await client.aclose()
    return {"memory": mem, "throughput": tput}


def table(results: dict[str, Any], n: int) -> str:
    """The figures as a Markdown table."""
    base_mem = results["memory"][0]["bytes_per_event"]
    base_s = results["throughput"][0]["seconds"]
    lines = [
        "| groups | bytes/event | +bytes/extra group | vs 1 group | events/s | deliveries/s "
        "| s/extra group | vs 1 group |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m, t in zip(results["memory"], results["throughput"], strict=True):
        g = m["groups"]
        extra = g - 1
        per_group_mem = (m["bytes_per_event"] - base_mem) / extra if extra else None
        per_group_s = (t["seconds"] - base_s) / extra if extra else None
        lines.append(
            f"| {g} | {m['bytes_per_event']:.0f} | "
            f"{'' if per_group_mem is None else f'{per_group_mem:.0f}'} | "
            f"{'' if per_group_mem is None else f'{per_group_mem / base_mem:.2f}'} | "
            f"{n / t['seconds']:,.0f} | {n * g / t['seconds']:,.0f} | "
            f"{'' if per_group_s is None else f'{per_group_s:.2f}'} | "
            f"{'' if per_group_s is None else f'{per_group_s / base_s:.2f}'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run, print the table, write the JSON."""
    args = parse_args(argv)
    results = asyncio.run(run(args))
    print(f"\ndelivery groups, {args.events} events, concurrency {args.concurrency} per group")
    print(table(results, args.events))
    if not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = args.out / f"groups-{stamp}.json"
        record = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "python": platform.python_version(),
            "results": results,
        }
        path.write_text(json.dumps(record, indent=2))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
