"""Soak of delayq.postgres: orders in transactions, checks through the outbox, SIGKILLs at random.

    .venv/bin/python scripts/pg_soak.py --duration 120
    .venv/bin/python scripts/pg_soak.py --duration 600 --rate 200 --out docs/reliability/pg-soak.json

Starts a private redis-server and PostgreSQL (``REDIS_URL`` / ``DATABASE_URL`` to use
disposable existing ones), then for ``--duration`` seconds ``--tasks`` producer tasks create
orders at about ``--rate`` per second, each in its own transaction that inserts the order and
schedules its check through the outbox (due 0–``--max-delay`` s later); ``--rollback`` of the
transactions are rolled back after the outbox insert. ``--workers`` worker processes handle the
checks through the inbox (tests/postgres/pgworker.py: one ``effects`` row per committed
handler transaction; ``--post-commit-ms`` of work after the commit widens the window
in which a kill makes a redelivery) and ``--relays`` relay processes move the outbox. Every
``--kill-every`` s (on average) a random worker or relay is SIGKILLed and a new one started.
``--analyze-every`` s the outbox is analyzed, as autovacuum does, often while it is drained
(issue 26: the statistics of a drained outbox once made a relay's batch take the whole
backlog, in time growing with its cube).

At the end, once the outbox and the queue are empty, it checks: every committed order has
exactly one effect, no rolled-back order has any, nothing is left anywhere. Exit status 1 if
not. The summary (orders, kills, redeliveries absorbed by the inbox) is printed and written
as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "postgres"))
sys.path.insert(0, str(ROOT))

import asyncpg  # noqa: E402
from pgkit import OrderCheck, create_app_tables, spawn  # noqa: E402

from delayq import EventService  # noqa: E402
from delayq.postgres import Outbox, migrate  # noqa: E402
from delayq.testing import PostgresServer, RedisServer  # noqa: E402


class Rollback(Exception):
    """Raised inside a producer's transaction to roll it back."""


async def soak(args: argparse.Namespace, redis_url: str, db_url: str) -> dict[str, object]:
    schema, prefix = "soak", f"pgsoak-{os.getpid()}"
    conn = await asyncpg.connect(db_url)
    await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    await migrate(conn, schema)
    await create_app_tables(conn, schema)
    logs = tempfile.mkdtemp(prefix="delayq-pgsoak-")
    common = ["--db", db_url, "--redis", redis_url, "--prefix", prefix, "--schema", schema]
    procs: dict[str, list[subprocess.Popen[bytes]]] = {"worker": [], "relay": []}
    started = {"worker": 0, "relay": 0}

    def start(kind: str) -> None:
        started[kind] += 1
        log = os.path.join(logs, f"{kind}-{started[kind]}.log")
        extra = ["--visibility", str(args.visibility), "--post-commit-ms", str(args.post_commit_ms)]
        procs[kind].append(spawn(log, kind, *common, *extra))

    for _ in range(args.workers):
        start("worker")
    for _ in range(args.relays):
        start("relay")

    pool = await asyncpg.create_pool(db_url, min_size=args.tasks, max_size=args.tasks)
    outbox = Outbox(schema)
    rng = random.Random(args.seed)
    committed: list[int] = []
    rolled_back: list[int] = []
    next_id = iter(range(1, 10**9))
    deadline = time.monotonic() + args.duration
    kills = {"worker": 0, "relay": 0}

    async def producer() -> None:
        gap = args.tasks / args.rate
        while time.monotonic() < deadline:
            order = next(next_id)
            roll = rng.random() < args.rollback
            try:
                async with pool.acquire() as c, c.transaction():
                    await c.execute(f'INSERT INTO "{schema}".orders (id) VALUES ($1)', order)
                    await outbox.enqueue_with_delay(
                        c, OrderCheck(id=f"order-{order}", order_id=order),
                        rng.uniform(0, args.max_delay),
                    )  # fmt: skip
                    if roll:
                        raise Rollback
                committed.append(order)
            except Rollback:
                rolled_back.append(order)
            await asyncio.sleep(rng.uniform(0, 2 * gap))

    async def chaos() -> None:
        while time.monotonic() < deadline:
            pause = rng.expovariate(1 / args.kill_every)
            if time.monotonic() + pause >= deadline:
                return
            await asyncio.sleep(pause)
            kind = "worker" if rng.random() < 0.6 else "relay"
            alive = [p for p in procs[kind] if p.poll() is None]
            if not alive:
                continue
            victim = rng.choice(alive)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            kills[kind] += 1
            start(kind)

    async def analyze() -> None:
        if not args.analyze_every:
            return
        while time.monotonic() < deadline:
            await asyncio.sleep(args.analyze_every)
            await pool.execute(f'ANALYZE "{schema}".outbox')

    t0 = time.monotonic()
    await asyncio.gather(chaos(), analyze(), *(producer() for _ in range(args.tasks)))
    produced_s = time.monotonic() - t0
    left_at_end = await conn.fetchval(f'SELECT count(*) FROM "{schema}".outbox')

    service = EventService.from_url(redis_url, prefix=prefix)
    settle_deadline = time.monotonic() + args.settle
    try:
        while True:
            pending = await conn.fetchval(f'SELECT count(*) FROM "{schema}".outbox')
            c = await service.stats_for(OrderCheck)
            queued = c.scheduled + c.ready + c.in_flight
            if pending == 0 and queued == 0:
                break
            if time.monotonic() > settle_deadline:
                print(f"not settled: outbox {pending}, queue {c}", file=sys.stderr)
                break
            await asyncio.sleep(0.2)
        settle_s = time.monotonic() - settle_deadline + args.settle
        dead = (await service.stats_for(OrderCheck)).dead
    finally:
        await service.aclose()
        for kind in procs:
            for p in procs[kind]:
                if p.poll() is None:
                    p.terminate()
        for kind in procs:
            for p in procs[kind]:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    effects = dict(
        await conn.fetch(f'SELECT order_id, count(*) FROM "{schema}".effects GROUP BY order_id')
    )
    runs = await conn.fetchval(f'SELECT count(*) FROM "{schema}".runs')
    absorbed = await conn.fetchval(f'SELECT count(*) FROM "{schema}".runs WHERE NOT first')
    orders = {r[0] for r in await conn.fetch(f'SELECT id FROM "{schema}".orders')}
    await conn.close()
    await pool.close()
    missing = [o for o in committed if effects.get(o, 0) == 0]
    duplicated = [o for o, n in effects.items() if n > 1]
    ghost = [o for o in rolled_back if o in effects or o in orders]
    unknown = [o for o in effects if o not in orders]
    ok = not (missing or duplicated or ghost or unknown or dead) and set(committed) == orders
    ok = ok and pending == 0 and queued == 0
    return {
        "ok": ok,
        "duration_s": round(produced_s, 1),
        "orders_committed": len(committed),
        "orders_rolled_back": len(rolled_back),
        "effects": sum(effects.values()),
        "missing_effects": len(missing),
        "duplicate_effects": len(duplicated),
        "effects_of_rolled_back_orders": len(ghost),
        "dead_letters": dead,
        "outbox_rows_when_load_stopped": left_at_end,
        "settle_s": round(settle_s, 1),
        "outbox_rows_left": pending,
        "workers_killed": kills["worker"],
        "relays_killed": kills["relay"],
        "handler_runs": runs,
        "redeliveries_absorbed_by_inbox": absorbed,
        "logs": logs,
        "args": vars(args),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--rate", type=float, default=100.0, help="orders per second (about)")
    p.add_argument("--tasks", type=int, default=8, help="concurrent producer tasks")
    p.add_argument("--rollback", type=float, default=0.2, help="share of rolled-back orders")
    p.add_argument("--max-delay", type=float, default=2.0, help="checks due 0..this s later")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--relays", type=int, default=2)
    p.add_argument("--kill-every", type=float, default=3.0, help="mean seconds between kills")
    p.add_argument("--visibility", type=float, default=2.0, help="workers' visibility_timeout")
    p.add_argument(
        "--post-commit-ms",
        type=float,
        default=50.0,
        help="handler work after its commit (a kill there means a redelivery)",
    )
    p.add_argument("--analyze-every", type=float, default=0.0, help="ANALYZE the outbox (s)")
    p.add_argument("--settle", type=float, default=120.0, help="max seconds to drain at the end")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="write the summary JSON here")
    args = p.parse_args()
    with contextlib.ExitStack() as stack:
        redis_url = os.environ.get("REDIS_URL") or stack.enter_context(RedisServer()).url
        db_url = os.environ.get("DATABASE_URL") or stack.enter_context(PostgresServer()).url
        result = asyncio.run(soak(args, redis_url, db_url))
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
