"""``python -m benchmarks.failover``: deploys and crashes under a steady stream of delayed events.

Three scenarios, each against its own fresh queue Redis, with worker processes running
``tests/faults/faultworker.py`` (an EventService on default options, handling several event
types and recording every handler start, success, failure and lateness in a separate
recorder Redis):

* ``leader-kill`` — 3 workers; SIGKILL whichever holds the scheduler lock every
  ``--every`` seconds and start a replacement. Lateness overall and of the events due in the
  2 s after each kill, lost, duplicates.
* ``rolling`` — 4 workers; each in turn gets SIGTERM (it drains: handlers finish, acks are
  written) and is replaced, as a deploy does. Lost and duplicate handler runs must be 0.
* ``crash`` — the same with SIGKILL. Lost must be 0; duplicates only for events whose
  handler was running (or finished but not yet acked) in the killed process.

The producer enqueues ``--rate`` events/s spread over ``--types`` types, each due
``--delay`` seconds (uniform in the range) after its enqueue; handlers take ``--handler-ms``.
Lateness is claim time minus due time, both on Redis's clock. ``moves/s/type`` is how many
``move_due`` script calls per second per type the leader made, and each standby.

    python -m benchmarks.failover                       # 60 s per scenario, ~4 minutes
    python -m benchmarks.failover --duration 12 --every 4 --scenarios leader-kill  # short

Prints a table and writes ``benchmarks/results/failover-<stamp>.json``. Exit status 1 when a
target is missed (leader-kill max lateness over 1 s, anything lost, a rolling-restart
duplicate, an unexplained crash duplicate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "faults"))

import redis.asyncio as aioredis  # noqa: E402
from faultkit import Worker, WorkerPool, job_types, read_records, rec_key, reconcile  # noqa: E402

from delayq import EventService  # noqa: E402
from delayq.testing import RedisServer  # noqa: E402

SCENARIOS = ("leader-kill", "rolling", "crash")
WORKERS = {"leader-kill": 3, "rolling": 4, "crash": 4}
AFTER_KILL_MS = 2000
LEADER_KILL_MAX_MS = 1000.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.failover", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of faults per scenario")
    p.add_argument("--every", type=float, default=10.0, help="seconds between faults")
    p.add_argument("--rate", type=float, default=200.0, help="events enqueued per second")
    p.add_argument("--types", type=int, default=4, help="event types the events spread over")
    p.add_argument(
        "--delay", type=float, nargs=2, default=(0.5, 3.0), metavar=("MIN", "MAX"),
        help="each event is due this many seconds after its enqueue (uniform)",
    )  # fmt: skip
    p.add_argument("--handler-ms", type=int, default=50, help="how long each handler awaits")
    p.add_argument("--seed", type=int, default=9)
    p.add_argument("--out", type=Path, default=HERE / "results", help="where the JSON goes")
    p.add_argument("--no-write", action="store_true", help="print only, write no JSON")
    return p.parse_args(argv)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Scenario:
    """One scenario: its Redis servers, workers, producer and fault loop."""

    def __init__(self, name: str, args: argparse.Namespace):
        self.name = name
        self.args = args
        self.prefix = f"fo-{uuid.uuid4().hex[:6]}"
        self.run = uuid.uuid4().hex[:8]
        self.queue = RedisServer()
        self.recorder = RedisServer()
        self.rnd = random.Random(args.seed)
        self.enqueued: list[str] = []
        self.fault_ms: list[int] = []  # Redis time of each fault
        self.types = job_types(args.types)

    def worker_args(self) -> list[str]:
        return [
            "--types", str(self.args.types), "--record-lateness", "--count-moves",
            "--concurrency", "16",
        ]  # fmt: skip

    async def produce(self, producer: EventService, stop: asyncio.Event) -> None:
        """Enqueue ``--rate`` events/s in small batches until ``stop``."""
        a = self.args
        tick, n = 0.05, 0
        start = time.monotonic()
        while not stop.is_set():
            want = int((time.monotonic() - start) * a.rate)
            batch = []
            while n < want:
                event_type = self.types[n % len(self.types)]
                event = event_type(id=f"{event_type.event_name}-{n}", seq=n,
                                   sleep_ms=a.handler_ms)  # fmt: skip
                batch.append((event, self.rnd.uniform(*a.delay)))
                n += 1
            if batch:
                assert all(await producer.enqueue_many(batch))
                self.enqueued.extend(e.id for e, _ in batch)
            await asyncio.sleep(tick)

    async def redis_ms(self, client: aioredis.Redis) -> int:
        seconds, micros = await client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def leader(self, client: aioredis.Redis, rec: aioredis.Redis, pool: WorkerPool) -> Worker:
        """The worker that holds the scheduler lock (waits until one does)."""
        lock_key = f"{{{self.prefix}}}:scheduler-lock"
        for _ in range(400):
            token = await client.get(lock_key)
            if token:
                pid = await rec.hget(rec_key(self.run, "tokens"), token)
                for w in pool.alive:
                    if pid is not None and w.pid == int(pid):
                        return w
            await asyncio.sleep(0.05)
        raise RuntimeError(f"no live worker holds the scheduler lock\n{pool.logs()}")

    async def fault(
        self, n: int, pool: WorkerPool, client: aioredis.Redis, rec: aioredis.Redis
    ) -> None:
        """Inject the scenario's fault number ``n`` and start a replacement worker."""
        if self.name == "leader-kill":
            victim = await self.leader(client, rec, pool)
        else:
            victim = pool.alive[0]  # the oldest: each in turn
        self.fault_ms.append(await self.redis_ms(client))
        if self.name == "rolling":
            victim.proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(victim.proc.wait, 30)
            if code != 0:
                raise RuntimeError(f"worker {victim.pid} exited {code}:\n{pool.tail(victim)}")
        else:
            await pool.kill(rec, victim)
        await pool.wait_ready(rec, pool.spawn(*self.worker_args()), 60)

    async def main(self) -> dict[str, Any]:
        a = self.args
        self.queue.start()
        self.recorder.start()
        rec = aioredis.Redis.from_url(self.recorder.url, protocol=2)
        client = aioredis.Redis.from_url(self.queue.url, protocol=2)
        pool = WorkerPool(
            url=self.queue.url, rec_url=self.recorder.url, prefix=self.prefix, run=self.run
        )
        producer = EventService.from_url(
            self.queue.url, prefix=self.prefix, enable_scheduling=False
        )
        try:
            await pool.wait_ready(
                rec, pool.spawn(*self.worker_args(), count=WORKERS[self.name]), 60
            )
            stop = asyncio.Event()
            producing = asyncio.create_task(self.produce(producer, stop))
            started = time.monotonic()
            await asyncio.sleep(min(a.every, 3.0))  # a steady stream before the first fault
            n = 0
            while time.monotonic() - started < a.duration:
                await self.fault(n, pool, client, rec)
                n += 1
                await asyncio.sleep(max(0.0, started + (n + 1) * a.every - time.monotonic()))
            stop.set()
            await producing
            want = set(self.enqueued)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                records = await read_records(rec, self.run)
                if want <= records.end.keys():
                    break
                await asyncio.sleep(0.5)
            records = await read_records(rec, self.run)
            moves = {
                k.decode(): int(v)
                for k, v in (await rec.hgetall(rec_key(self.run, "moves"))).items()
            }
            seconds = time.monotonic() - started
            due_late = [
                tuple(float(x) for x in item.split())
                for item in await rec.lrange(rec_key(self.run, "due-late"), 0, -1)
            ]
        finally:
            await producer.aclose()
            pool.stop_all()
            await rec.aclose()
            await client.aclose()
            self.queue.close()
            self.recorder.close()
        result = reconcile(self.enqueued, records, pool.interrupted)
        late = [x for _, x in due_late]
        after = [
            x for due, x in due_late
            if any(k <= due < k + AFTER_KILL_MS for k in self.fault_ms)
        ]  # fmt: skip
        duplicate_runs = sum(
            max(0, records.start.get(i, 0) - records.fail.get(i, 0) - 1) for i in self.enqueued
        )
        return {
            "scenario": self.name,
            "workers": WORKERS[self.name],
            "faults": len(self.fault_ms),
            "enqueued": len(self.enqueued),
            "handled": result.handled,
            "lost": len(result.lost),
            "duplicate_runs": duplicate_runs,
            "duplicates_explained": result.explained,
            "duplicates_unexplained": len(result.unexplained),
            "interrupted_events": result.interrupted_events,
            # scheduler script calls per second per type: the leader's, and each standby's
            "moves_per_type_s": {
                "leader": moves.get("leader", 0) / seconds / a.types,
                "standby": moves.get("standby", 0) / seconds / a.types / (WORKERS[self.name] - 1),
            },
            "lateness_ms": {
                "p50": _pct(late, 0.5), "p99": _pct(late, 0.99), "max": max(late, default=0.0),
                "mean": statistics.fmean(late) if late else float("nan"),
            },
            "after_fault_ms": {
                "n": len(after), "p50": _pct(after, 0.5), "p99": _pct(after, 0.99),
                "max": max(after, default=0.0),
            },
        }  # fmt: skip


def verdict(r: dict[str, Any]) -> list[str]:
    """The targets a scenario missed."""
    missed = []
    if r["lost"]:
        missed.append(f"{r['lost']} lost")
    if r["scenario"] == "leader-kill" and r["lateness_ms"]["max"] > LEADER_KILL_MAX_MS:
        missed.append(f"max lateness {r['lateness_ms']['max']:.0f} ms > 1 s")
    if r["scenario"] == "rolling" and r["duplicate_runs"]:
        missed.append(f"{r['duplicate_runs']} duplicate runs in a rolling restart")
    if r["duplicates_unexplained"]:
        missed.append(f"{r['duplicates_unexplained']} unexplained duplicates")
    return missed


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios, print the table, write the JSON."""
    args = parse_args(argv)
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
    results = []
    for name in names:
        print(f"{name}: running for {args.duration:.0f} s ...", flush=True)
        results.append(asyncio.run(Scenario(name, args).main()))
    print()
    print(
        f"{args.rate:.0f} events/s over {args.types} types, due {args.delay[0]}-{args.delay[1]} s "
        f"after enqueue, handlers {args.handler_ms} ms; a fault every {args.every:.0f} s for "
        f"{args.duration:.0f} s; {os.cpu_count()} CPUs"
    )
    head = (
        f"{'scenario':<12} {'procs':>5} {'faults':>6} {'events':>7} {'lost':>4} {'dup runs':>8} "
        f"{'(explained)':>11} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
        f"{'2s-after p50':>12} {'p99':>7} {'max':>7} {'moves/s/type':>13}  verdict"
    )
    print(head)
    failed = False
    for r in results:
        late, after = r["lateness_ms"], r["after_fault_ms"]
        missed = verdict(r)
        failed |= bool(missed)
        print(
            f"{r['scenario']:<12} {r['workers']:>5} {r['faults']:>6} {r['enqueued']:>7} "
            f"{r['lost']:>4} {r['duplicate_runs']:>8} {r['duplicates_explained']:>11} "
            f"{late['p50']:>7.1f} {late['p99']:>7.1f} {late['max']:>7.1f} "
            f"{after['p50']:>12.1f} {after['p99']:>7.1f} {after['max']:>7.1f} "
            f"{r['moves_per_type_s']['leader']:>6.1f}/{r['moves_per_type_s']['standby']:<6.1f}  "
            f"{'; '.join(missed) or 'ok'}"
        )
    if not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = args.out / f"failover-{stamp}.json"
        path.write_text(
            json.dumps(
                {
                    "benchmark": "failover",
                    "when": stamp,
                    "argv": sys.argv[1:] if argv is None else argv,
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"\nwrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
