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
   without and with ``inbox.once``: handler time per event and events/s;
5. **backlog** (issue 26): ``--backlog`` rows committed at once into an outbox whose
   statistics are those autovacuum leaves on a drained one (3,000 rows relayed, 1 left,
   ``ANALYZE``; autovacuum off on the table so they stay), drained by 1 and by 2 relays
   (``--batch-size``): rows/s, rows per transaction and time per batch; meanwhile
   ``--rate`` probe events/s go through the outbox (due ``--delay`` s after relay) and are
   handled: their lateness while the backlog drains and for ``--after`` s after.

    .venv/bin/python benchmarks/pg_outbox.py
    .venv/bin/python benchmarks/pg_outbox.py --rows 100000 --handled 10000
    .venv/bin/python benchmarks/pg_outbox.py --only lateness --repeat 5
    .venv/bin/python benchmarks/pg_outbox.py --only backlog --backlog 100000

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


class BacklogProbe(Event, event_name="bench-pg-probe"):
    """An event committed while a backlog drains; its lateness is measured."""


class TimedRelay(OutboxRelay):
    """An OutboxRelay that records each batch's rows and time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch_ms: list[float] = []
        self.batch_rows: list[int] = []

    async def relay_once(self) -> int:
        t0 = time.perf_counter()
        moved = await super().relay_once()
        if moved:
            self.batch_ms.append((time.perf_counter() - t0) * 1000)
            self.batch_rows.append(moved)
        return moved


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


async def bench_backlog(args: argparse.Namespace, redis_url: str, db_url: str) -> dict[str, Any]:
    return {f"relays_{n}": await backlog_run(args, redis_url, db_url, n) for n in (1, 2)}


async def backlog_run(
    args: argparse.Namespace, redis_url: str, db_url: str, relays: int
) -> dict[str, Any]:
    """One backlog drain by ``relays`` relays (see the module's docstring, part 5)."""
    schema = "bench_backlog"
    outbox = Outbox(schema)
    conn = await fresh(db_url, schema)
    table = f'"{schema}".outbox'
    # the statistics of a drained outbox, kept while the backlog comes and goes
    await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    service = EventService.from_url(redis_url, prefix=f"bench-backlog-{relays}")
    await service.store.redis.flushdb()

    async def add(n: int, tag: str) -> None:
        for start in range(0, n, 10_000):
            events = [
                BenchCheck(id=f"{tag}{i}", order_id=i) for i in range(start, min(n, start + 10_000))
            ]
            async with conn.transaction():
                await outbox.enqueue_many(conn, events, 3600)

    await add(3000, "old")
    warm = OutboxRelay(service, db_url, schema=schema, inbox_retention=None)
    while await warm.relay_once():
        pass
    await warm.aclose()
    await add(1, "last")
    await conn.execute(f"ANALYZE {table}")
    reltuples = await conn.fetchval(
        "SELECT reltuples FROM pg_class WHERE oid = $1::regclass", table
    )
    t0 = time.perf_counter()
    await add(args.backlog, "b")
    insert_s = time.perf_counter() - t0

    committed: dict[str, float] = {}
    late: dict[str, float] = {}
    all_handled = asyncio.Event()
    sending = True

    async def handler(event: BacklogProbe) -> None:
        late[event.id] = (time.time() - committed[event.id] - args.delay) * 1000
        if not sending and len(late) == len(committed):
            all_handled.set()

    service.add_handler(BacklogProbe, handler, concurrency=16)
    workers = [
        TimedRelay(service, db_url, schema=schema, batch_size=args.batch_size,
                   poll_interval=0.05, inbox_retention=None)
        for _ in range(relays)
    ]  # fmt: skip
    probe_conn = await asyncpg.connect(db_url)
    drained_at = 0.0

    async def probes() -> None:
        i = 0
        while sending:
            async with probe_conn.transaction():
                await outbox.enqueue_with_delay(probe_conn, BacklogProbe(id=f"p{i}"), args.delay)
            committed[f"p{i}"] = time.time()
            i += 1
            await asyncio.sleep(1 / args.rate)

    cpu0 = time.process_time()
    async with service:
        start = time.time()
        t0 = time.perf_counter()
        for w in workers:
            await w.start()
        probe_task = asyncio.create_task(probes())
        while sum(w.relayed for w in workers) < 1 + args.backlog + len(committed):
            await asyncio.sleep(0.002)
        drain_s = time.perf_counter() - t0
        drained_at = time.time()
        await asyncio.sleep(args.after)
        sending = False
        await probe_task
        if len(late) < len(committed):
            await asyncio.wait_for(all_handled.wait(), 60)
        for w in workers:
            await w.aclose()
    cpu = time.process_time() - cpu0
    await probe_conn.close()
    assert (await service.stats_for(BenchCheck)).scheduled == 3001 + args.backlog
    during = [late[k] for k, t in committed.items() if t < drained_at]
    after = [late[k] for k, t in committed.items() if t >= drained_at]
    batch_ms = [ms for w in workers for ms in w.batch_ms]
    batch_rows = [n for w in workers for n in w.batch_rows]
    result = {
        "reltuples_at_start": reltuples,
        "insert_rows_per_s": args.backlog / insert_s,
        "drain_s": drain_s,
        "drain_rows_per_s": (1 + args.backlog) / drain_s,
        "split": [w.relayed for w in workers],
        "batches": len(batch_ms),
        "rows_per_batch_max": max(batch_rows),
        "batch_ms": {"p50": pct(batch_ms, 0.5), "p99": pct(batch_ms, 0.99),
                     "max": max(batch_ms)},
        "probe_late_ms_during": summary(during),
        "probe_late_ms_after": summary(after),
        "started": start,
        "process_cpu_s": cpu,
        "load": os.getloadavg()[0],
    }  # fmt: skip
    await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    await conn.close()
    await service.aclose()
    return result


def summary(values: list[float]) -> dict[str, float]:
    """p50/p99/max of ``values`` and how many (zeros when empty)."""
    if not values:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    return {"n": len(values), "p50": pct(values, 0.5), "p99": pct(values, 0.99),
            "max": max(values)}  # fmt: skip


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    parts = {
        "throughput": bench_insert_and_relay,
        "lateness_ms": bench_lateness,
        "inbox": bench_inbox,
        "backlog": bench_backlog,
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
    if "backlog" in result:
        print(
            f"backlog: {args.backlog:,} rows committed after ANALYZE of a drained outbox, "
            f"batch {args.batch_size}; probes {args.rate}/s due {args.delay}s after relay"
        )
        print(
            f"  {'relays':6} {'rows/s':>8} {'drain s':>8} {'max rows/txn':>12} "
            f"{'batch ms p50/p99/max':>22} {'probe late ms during: p50/p99/max':>36} "
            f"{'after: p50/p99/max':>22}"
        )
        for name, v in result["backlog"].items():
            b, d, a = v["batch_ms"], v["probe_late_ms_during"], v["probe_late_ms_after"]
            print(
                f"  {name[-1]:6} {v['drain_rows_per_s']:8,.0f} {v['drain_s']:8.2f} "
                f"{v['rows_per_batch_max']:12} "
                f"{b['p50']:7.1f}/{b['p99']:6.1f}/{b['max']:6.1f} "
                f"{d['p50']:10.0f}/{d['p99']:8.0f}/{d['max']:8.0f} (n={d['n']}) "
                f"{a['p50']:6.1f}/{a['p99']:6.1f}/{a['max']:6.1f} (n={a['n']})"
                f"  load {v['load']:.1f}"
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
    p.add_argument(
        "--only", choices=["throughput", "lateness", "inbox", "backlog"], help="run one part"
    )
    p.add_argument("--backlog", type=int, default=100_000, help="rows for the backlog part")
    p.add_argument("--after", type=float, default=3.0, help="probe seconds after the drain")
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
