"""delayq.postgres: outbox throughput and lateness, and what the inbox costs per event.

Starts a private redis-server and a private PostgreSQL (delayq.testing; ``REDIS_URL`` and
``DATABASE_URL`` use existing, disposable ones instead) and measures:

1. **outbox insert**: rows/s written by ``Outbox.enqueue_many`` in transactions of
   ``--txn-rows`` rows, and by single-event transactions from ``--tasks`` concurrent tasks;
2. **relay**: rows/s moved from the outbox to Redis by 1 and by 2 ``OutboxRelay`` instances
   (each its own connections) draining ``--rows`` committed rows (due in an hour, so
   nothing is handled meanwhile); next to it, ``EventService.enqueue_many`` directly;
3. **lateness**: ``--events`` events at ``--rate``/s, each due ``--delay`` s after its
   enqueue, once enqueued directly and once through the outbox (delay counted from the
   commit returning): wall-clock lateness at handler start, p50/p99/max;
4. **inbox cost**: ``--handled`` events handled with a transaction that updates one row,
   without and with ``inbox.once``: handler time per event and events/s.

    .venv/bin/python benchmarks/pg_outbox.py
    .venv/bin/python benchmarks/pg_outbox.py --rows 100000 --handled 10000
    .venv/bin/python benchmarks/pg_outbox.py --only lateness --repeat 5

Writes ``benchmarks/results/pg_outbox-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import asyncpg

from delayq import Event, EventService, current_delivery
from delayq.postgres import Inbox, Outbox, OutboxRelay, migrate
from delayq.testing import PostgresServer, RedisServer

HERE = Path(__file__).resolve().parent


class BenchCheck(Event, event_name="bench-pg-check"):
    """A payment check with a small payload."""

    order_id: int
    note: str = "x" * 60


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def servers() -> Iterator[tuple[str, str]]:
    with contextlib.ExitStack() as stack:
        redis_url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
        db_url = os.environ.get("DATABASE_URL")
        if not db_url:
            db_url = stack.enter_context(PostgresServer()).url
        yield redis_url, db_url


async def fresh(db_url: str, schema: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(db_url)
    await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    await migrate(conn, schema)
    await conn.execute(
        f'CREATE TABLE "{schema}".orders (id integer PRIMARY KEY, checked integer NOT NULL DEFAULT 0)'
    )
    return conn


async def bench_insert_and_relay(
    args: argparse.Namespace, redis_url: str, db_url: str
) -> dict[str, Any]:
    schema = "bench_outbox"
    conn = await fresh(db_url, schema)
    outbox = Outbox(schema)
    out: dict[str, Any] = {}
    service = EventService.from_url(redis_url, prefix="bench-pg", enable_scheduling=False)
    try:
        for relays in (1, 2):
            await service.store.redis.flushdb()
            t0 = time.perf_counter()
            for start in range(0, args.rows, args.txn_rows):
                async with conn.transaction():
                    await outbox.enqueue_many(
                        conn,
                        [
                            BenchCheck(id=f"o{i}", order_id=i)
                            for i in range(start, min(args.rows, start + args.txn_rows))
                        ],
                        3600,
                    )
            insert_s = time.perf_counter() - t0
            out.setdefault("insert_many_rows_per_s", []).append(args.rows / insert_s)
            workers = [
                OutboxRelay(service, db_url, schema=schema, batch_size=args.batch_size, poll_interval=0.05,
                            inbox_retention=None)
                for _ in range(relays)
            ]  # fmt: skip
            t0 = time.perf_counter()
            for w in workers:
                await w.start()
            while sum(w.relayed for w in workers) < args.rows:
                await asyncio.sleep(0.005)
            relay_s = time.perf_counter() - t0
            for w in workers:
                await w.aclose()
            assert (await service.stats_for(BenchCheck)).scheduled == args.rows
            out[f"relay_{relays}_rows_per_s"] = args.rows / relay_s
            out[f"relay_{relays}_split"] = [w.relayed for w in workers]
        # direct, for comparison
        await service.store.redis.flushdb()
        events = [BenchCheck(id=f"d{i}", order_id=i) for i in range(args.rows)]
        t0 = time.perf_counter()
        for start in range(0, args.rows, args.batch_size):
            await service.enqueue_many(events[start : start + args.batch_size], 3600)
        out["direct_enqueue_many_rows_per_s"] = args.rows / (time.perf_counter() - t0)
        # single-event transactions from concurrent tasks
        pool = await asyncpg.create_pool(db_url, min_size=args.tasks, max_size=args.tasks)
        n = args.single
        counter = iter(range(n))

        async def one_task() -> None:
            for i in counter:
                async with pool.acquire() as c, c.transaction():
                    await outbox.enqueue_with_delay(c, BenchCheck(id=f"s{i}", order_id=i), 3600)

        t0 = time.perf_counter()
        await asyncio.gather(*(one_task() for _ in range(args.tasks)))
        out["insert_single_txn_per_s"] = n / (time.perf_counter() - t0)
        await pool.close()
        await conn.execute(f'TRUNCATE "{schema}".outbox')
    finally:
        await service.aclose()
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()
    return out


async def bench_lateness(args: argparse.Namespace, redis_url: str, db_url: str) -> dict[str, Any]:
    schema = "bench_late"
    conn = await fresh(db_url, schema)
    outbox = Outbox(schema)
    expected: dict[str, float] = {}
    late: dict[str, list[float]] = {"direct": [], "outbox": []}
    done = asyncio.Event()

    async def handler(event: BenchCheck) -> None:
        now = time.time()
        mode = "outbox" if event.id.startswith("x") else "direct"
        late[mode].append((now - expected[event.id]) * 1000)
        if sum(map(len, late.values())) >= 2 * args.events:
            done.set()

    service = EventService.from_url(redis_url, prefix="bench-late")
    service.add_handler(BenchCheck, handler, concurrency=16)
    try:
        async with service, OutboxRelay(service, db_url, schema=schema, inbox_retention=None):
            gap = 1 / args.rate
            for i in range(args.events):
                ev = BenchCheck(id=f"d{i}", order_id=i)
                await service.enqueue_with_delay(ev, args.delay)
                expected[ev.id] = time.time() + args.delay
                ev = BenchCheck(id=f"x{i}", order_id=i)
                async with conn.transaction():
                    await outbox.enqueue_with_delay(conn, ev, args.delay)
                expected[ev.id] = time.time() + args.delay
                await asyncio.sleep(gap)
            await asyncio.wait_for(done.wait(), 60)
    finally:
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()
    result: dict[str, Any] = {
        mode: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "max": max(v), "min": min(v), "n": len(v)}
        for mode, v in late.items()
    }
    result["load"] = os.getloadavg()[0]
    return result


async def bench_inbox(args: argparse.Namespace, redis_url: str, db_url: str) -> dict[str, Any]:
    schema = "bench_inbox"
    conn = await fresh(db_url, schema)
    await conn.execute(
        f'INSERT INTO "{schema}".orders (id) SELECT g FROM generate_series(0, {args.handled}) g'
    )
    inbox = Inbox(schema)
    pool = await asyncpg.create_pool(db_url, min_size=9, max_size=9)
    out: dict[str, Any] = {}
    try:
        for use_inbox in (False, True):
            times: list[float] = []
            done = asyncio.Event()

            async def handler(
                event: BenchCheck,
                use_inbox: bool = use_inbox,
                times: list[float] = times,
                done: asyncio.Event = done,
            ) -> None:
                assert current_delivery() is not None
                t0 = time.perf_counter()
                async with pool.acquire() as c, c.transaction():
                    if use_inbox:
                        async with inbox.once(c) as first:
                            if first:
                                await c.execute(
                                    f'UPDATE "{schema}".orders SET checked = checked + 1 WHERE id = $1',
                                    event.order_id,
                                )
                    else:
                        await c.execute(
                            f'UPDATE "{schema}".orders SET checked = checked + 1 WHERE id = $1',
                            event.order_id,
                        )
                times.append((time.perf_counter() - t0) * 1e6)
                if len(times) >= args.handled:
                    done.set()

            prefix = f"bench-inbox-{int(use_inbox)}"
            service = EventService.from_url(redis_url, prefix=prefix)
            await service.enqueue_many(
                [BenchCheck(id=f"h{i}", order_id=i) for i in range(args.handled)], 0
            )
            service.add_handler(BenchCheck, handler, concurrency=8)
            t0 = time.perf_counter()
            async with service:
                await asyncio.wait_for(done.wait(), 300)
            wall = time.perf_counter() - t0
            out["with_inbox" if use_inbox else "without_inbox"] = {
                "handler_us_mean": statistics.fmean(times),
                "handler_us_p50": pct(times, 0.5),
                "handler_us_p99": pct(times, 0.99),
                "events_per_s": args.handled / wall,
            }
    finally:
        await pool.close()
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    parts = {
        "throughput": bench_insert_and_relay,
        "lateness_ms": bench_lateness,
        "inbox": bench_inbox,
    }
    out: dict[str, Any] = {}
    with servers() as (redis_url, db_url):
        for name, bench in parts.items():
            if args.only and not name.startswith(args.only):
                continue
            if name == "lateness_ms":
                # both modes side by side in each run; other work on a shared machine only
                # ever makes a run later, so every run is kept and printed
                out[name] = [await bench(args, redis_url, db_url) for _ in range(args.repeat)]
            else:
                out[name] = await bench(args, redis_url, db_url)
    return out


def report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Print the tables."""
    if "throughput" in result:
        t = result["throughput"]
        rates = ", ".join(f"{r:,.0f}" for r in t["insert_many_rows_per_s"])
        print(f"outbox insert, enqueue_many ({args.txn_rows}/txn): {rates} rows/s")
        print(
            f"outbox insert, one event per transaction, {args.tasks} tasks: "
            f"{t['insert_single_txn_per_s']:,.0f}/s"
        )
        print(
            f"relay, 1 relay: {t['relay_1_rows_per_s']:,.0f} rows/s; 2 relays: "
            f"{t['relay_2_rows_per_s']:,.0f} rows/s (split {t['relay_2_split']})"
        )
        print(
            f"direct enqueue_many ({args.batch_size}/call): "
            f"{t['direct_enqueue_many_rows_per_s']:,.0f} rows/s"
        )
    if "lateness_ms" in result:
        print(f"lateness ({args.events} events/mode at {args.rate}/s, delay {args.delay}s), ms:")
        print(f"  {'mode':8} {'p50':>8} {'p99':>8} {'max':>8} {'min':>8}")
        for run, modes in enumerate(result["lateness_ms"], 1):
            for mode, v in modes.items():
                if mode == "load":
                    continue
                print(
                    f"  {mode:8} {v['p50']:8.2f} {v['p99']:8.2f} {v['max']:8.2f} "
                    f"{v['min']:8.2f}  run {run}, load {modes['load']:.1f}"
                )
    if "inbox" in result:
        print(f"inbox ({args.handled} events, concurrency 8), handler µs mean/p50/p99, events/s:")
        for mode, v in result["inbox"].items():
            print(
                f"  {mode:14} {v['handler_us_mean']:8.0f} {v['handler_us_p50']:8.0f} "
                f"{v['handler_us_p99']:8.0f} {v['events_per_s']:10,.0f}"
            )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=50_000, help="rows for the relay runs")
    p.add_argument("--txn-rows", type=int, default=500, help="rows per enqueue_many transaction")
    p.add_argument("--batch-size", type=int, default=500, help="relay batch size")
    p.add_argument("--single", type=int, default=5_000, help="single-event transactions")
    p.add_argument("--tasks", type=int, default=32, help="concurrent tasks for those")
    p.add_argument("--events", type=int, default=300, help="events per mode for lateness")
    p.add_argument("--rate", type=float, default=30.0, help="events/s per mode for lateness")
    p.add_argument("--delay", type=float, default=0.5, help="seconds each lateness event waits")
    p.add_argument("--repeat", type=int, default=1, help="lateness runs")
    p.add_argument("--only", choices=["throughput", "lateness", "inbox"], help="run one part")
    p.add_argument("--handled", type=int, default=5_000, help="events per inbox run")
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    report(args, result)
    result["args"] = vars(args)
    result["machine"] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
    }
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = HERE / "results" / f"pg_outbox-{stamp}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
