#!/usr/bin/env python3
"""Soak test: worker processes handle a stream of delayed events while faults are injected.

Starts its own queue Redis (``appendonly yes``, ``appendfsync always``) and a separate
recorder Redis, N worker processes (``tests/faults/faultworker.py``: EventService with
consumers and scheduler, recording every handler start/success/failure), and a producer
that enqueues at ``--rate`` events/s with mixed delays, some events failing on purpose
(retries) and a few always failing (dead letters). Every few seconds it injects a fault:

  kill-worker     SIGKILL a random worker, start a new one
  client-kill     CLIENT KILL every client connection (consumers, schedulers, producer)
  redis-restart   kill -9 the queue Redis, start it again on the same port (AOF reloaded)
  freeze-leader   SIGSTOP the scheduler-lock holder past the lock TTL, then SIGCONT
  idle-timeout    CONFIG SET timeout 1 for a few seconds (idle connections dropped)

After ``--duration`` seconds it stops producing and faults, waits for the queue to drain,
and reconciles: enqueued = handled + dead + still queued; an event lost is a failure; an
event that ran more often than planned must have been in progress in a process that was
SIGKILLed (or in flight when Redis was killed). Prints a JSON report (also ``--json``).

    .venv/bin/python scripts/soak.py --duration 600 --workers 4 --rate 400 --json soak.json
    .venv/bin/python scripts/soak.py --duration 20 --rate 150 --fault-every 2 4   # short

Exit status 0 when nothing was lost and every extra run is explained, else 1.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import os
import random
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "faults"))
sys.path.insert(0, str(ROOT))

import redis.asyncio as aioredis  # noqa: E402
from faultkit import Job, WorkerPool, read_records, rec_key, reconcile  # noqa: E402
from redis.asyncio.retry import Retry  # noqa: E402  (redis.retry.Retry retries nothing on asyncio clients)
from redis.backoff import ExponentialBackoff  # noqa: E402
from redis.exceptions import ConnectionError as RedisConnectionError  # noqa: E402

from delayq import EventService  # noqa: E402
from delayq.keys import PrefixKeys, TypeKeys  # noqa: E402
from delayq.testing import RedisServer  # noqa: E402

FAULTS = ("kill-worker", "client-kill", "redis-restart", "freeze-leader", "idle-timeout")
log = logging.getLogger("soak")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds of producing")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=16, help="handlers per worker")
    p.add_argument("--rate", type=float, default=400.0, help="events enqueued per second")
    p.add_argument("--max-delay", type=float, default=30.0, help="longest event delay, s")
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated subset")
    p.add_argument(
        "--fault-every",
        type=float,
        nargs=2,
        default=(5.0, 12.0),
        metavar=("MIN", "MAX"),
        help="seconds between faults (uniform)",
    )
    p.add_argument(
        "--cycle",
        action="store_true",
        help="inject the faults in turn (each kind once before any repeats) "
        "instead of picking at random",
    )
    p.add_argument(
        "--min-faults",
        type=int,
        default=0,
        help="keep producing past --duration until this many faults were injected (with "
        "--cycle, the number of kinds covers each once, however slow the machine)",
    )
    p.add_argument("--visibility", type=float, default=10.0)
    p.add_argument("--lock-timeout", type=float, default=2.0)
    p.add_argument("--drain-timeout", type=float, default=240.0)
    p.add_argument("--appendfsync", default="always", choices=("always", "everysec"))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write the report to this file")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


class Soak:
    """One soak run: servers, workers, producer, fault injector, sampler, reconciliation."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rnd = random.Random(args.seed)
        self.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
        unknown = set(self.faults) - set(FAULTS)
        if unknown:
            raise SystemExit(f"unknown faults: {sorted(unknown)}; known: {FAULTS}")
        self.prefix = f"soak-{uuid.uuid4().hex[:6]}"
        self.run = uuid.uuid4().hex[:8]
        self.queue = RedisServer(
            config={
                "appendonly": "yes",
                "appendfsync": args.appendfsync,
                "maxmemory-policy": "noeviction",
            }
        )
        self.recorder = RedisServer()
        self.enqueued: list[str] = []
        self.planned_dead: set[str] = set()
        self.failed_enqueues = 0
        self.fault_log: list[dict[str, object]] = []
        self.samples: list[tuple[float, int]] = []  # (monotonic, handled so far)
        self.by_cause: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.stop = asyncio.Event()
        self.t0 = 0.0

    # -- plumbing ----------------------------------------------------------------

    def admin(self) -> aioredis.Redis:
        """A client on the queue Redis that retries through restarts."""
        return aioredis.Redis.from_url(
            self.queue.url,
            protocol=2,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), retries=10),
            retry_on_error=[RedisConnectionError, ConnectionResetError, OSError],
        )

    def worker_args(self) -> list[str]:
        """Command-line options of every worker process."""
        a = self.args
        return [
            "--concurrency",
            str(a.concurrency),
            "--visibility",
            str(a.visibility),
            "--scheduling-interval",
            "0.5",
            "--lock-timeout",
            str(a.lock_timeout),
            "--retry-attempts",
            "3",
            "--backoff",
            "0.5",
            "--record-lateness",
        ]

    def say(self, msg: str) -> None:
        """Print a progress line (unless --quiet)."""
        if not self.args.quiet:
            print(f"[soak {time.monotonic() - self.t0:7.1f}s] {msg}", flush=True)

    # -- the parts -----------------------------------------------------------------

    async def produce(self, producer: EventService) -> None:
        """Enqueue at --rate until stopped; remember what was acknowledged."""
        a, rnd = self.args, self.rnd
        n = 0
        tick = 0.1
        next_at = time.monotonic()
        carry = 0.0
        while not self.stop.is_set():
            carry += a.rate * tick
            count, carry = int(carry), carry - int(carry)
            batch = []
            for _ in range(count):
                n += 1
                r = rnd.random()
                delay = 0.0 if r < 0.4 else rnd.uniform(0, a.max_delay * (0.3 if r < 0.8 else 1))
                f = rnd.random()
                fail_times = 99 if f < 0.003 else (rnd.randint(1, 2) if f < 0.03 else 0)
                job = Job(id=f"e{n}", seq=n, sleep_ms=rnd.randint(0, 20), fail_times=fail_times)
                batch.append((job, delay))
            if batch:
                try:
                    await producer.enqueue_many(batch)
                except Exception as exc:  # Redis down or connection killed: not enqueued
                    self.failed_enqueues += len(batch)
                    log.debug("enqueue failed: %s", exc)
                else:
                    self.enqueued.extend(j.id for j, _ in batch)
                    self.planned_dead.update(j.id for j, _ in batch if j.fail_times > 3)
            next_at += tick
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def sample(self, rec: aioredis.Redis) -> None:
        """Record how many events have succeeded, every 0.1 s."""
        key = rec_key(self.run, "end")
        while True:
            self.samples.append((time.monotonic(), await rec.hlen(key)))
            await asyncio.sleep(0.1)

    async def inject(self, pool: WorkerPool, rec: aioredis.Redis) -> None:
        """Inject one fault every --fault-every seconds until stopped."""
        lo, hi = self.args.fault_every
        lock_key = PrefixKeys(self.prefix).scheduler_lock
        while not self.stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.rnd.uniform(lo, hi))
            if self.stop.is_set():
                return
            if self.args.cycle:
                fault = self.faults[len(self.fault_log) % len(self.faults)]
            else:
                fault = self.rnd.choice(self.faults)
            t = time.monotonic()
            entry: dict[str, object] = {"fault": fault, "at": round(t - self.t0, 2)}
            try:
                if fault == "kill-worker":
                    victim = self.rnd.choice(pool.alive)
                    ids = await pool.kill(rec, victim)
                    self.by_cause["kill-worker"].update(ids)
                    await pool.wait_ready(rec, pool.spawn(*self.worker_args()))
                    entry["in_progress"] = len(ids)
                elif fault == "client-kill":
                    admin = self.admin()
                    try:
                        me = await admin.client_id()
                        killed = 0
                        for c in await admin.client_list():
                            if int(c["id"]) != me:
                                killed += await admin.execute_command(
                                    "CLIENT", "KILL", "ID", c["id"]
                                )
                    finally:
                        await admin.aclose()
                    entry["connections"] = killed
                elif fault == "redis-restart":
                    # whatever is in progress anywhere may see its ack delayed
                    in_progress: set[str] = set()
                    for w in pool.alive:
                        members = await rec.smembers(rec_key(self.run, f"inprog:{w.pid}"))
                        in_progress.update(m.decode() for m in members)
                    self.by_cause["redis-restart"].update(in_progress)
                    self.queue.kill()
                    down = self.rnd.uniform(0.5, 2.0)
                    await asyncio.sleep(down)
                    await asyncio.to_thread(self.queue.start)
                    entry["down_s"] = round(time.monotonic() - t, 2)
                    entry["in_progress"] = len(in_progress)
                elif fault == "freeze-leader":
                    admin = self.admin()
                    try:
                        token = await admin.get(lock_key)
                    finally:
                        await admin.aclose()
                    pid = token and await rec.hget(rec_key(self.run, "tokens"), token)
                    worker = next((w for w in pool.alive if pid and w.pid == int(pid)), None)
                    if worker is None:
                        entry["skipped"] = "no live lock holder"
                    else:
                        frozen_for = 2 * self.args.lock_timeout + 0.5
                        worker.proc.send_signal(signal.SIGSTOP)
                        await asyncio.sleep(frozen_for)
                        worker.proc.send_signal(signal.SIGCONT)
                        entry["frozen_s"] = frozen_for
                elif fault == "idle-timeout":
                    admin = self.admin()
                    try:
                        await admin.config_set("timeout", 1)
                        await asyncio.sleep(4)
                        await admin.config_set("timeout", 0)
                    finally:
                        await admin.aclose()
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["ends_at"] = round(time.monotonic() - self.t0, 2)
            self.fault_log.append(entry)
            self.say(f"fault {entry}")

    def stalls(self) -> None:
        """For each fault, how long after it ended until the next handler success."""
        for entry in self.fault_log:
            ends = self.t0 + float(entry["ends_at"])  # type: ignore[arg-type]
            before = [c for t, c in self.samples if t <= ends]
            base = before[-1] if before else 0
            after = [t for t, c in self.samples if t > ends and c > base]
            entry["next_success_after_s"] = round(after[0] - ends, 2) if after else None

    async def queued_ids(self) -> set[str]:
        """Ids still scheduled, ready or in flight."""
        k = TypeKeys(self.prefix, Job.event_name)
        admin = self.admin()
        try:
            ids: set[str] = set()
            for key in (k.scheduled, k.queued, k.inflight):
                ids.update(m.decode() for m in await admin.zrange(key, 0, -1))
            return ids
        finally:
            await admin.aclose()

    async def dead_ids(self) -> dict[str, str]:
        """Dead letters: id -> last error."""
        k = TypeKeys(self.prefix, Job.event_name)
        admin = self.admin()
        try:
            ids = [m.decode() for m in await admin.zrange(k.dead, 0, -1)]
            errors = await admin.hmget(k.errors, ids) if ids else []
            return {i: (e or b"").decode() for i, e in zip(ids, errors)}
        finally:
            await admin.aclose()

    # -- the run -----------------------------------------------------------------

    async def main(self) -> dict[str, object]:
        """Run everything and return the report."""
        a = self.args
        self.queue.start()
        self.recorder.start()
        rec = aioredis.Redis.from_url(self.recorder.url, protocol=2)
        pool = WorkerPool(
            url=self.queue.url, rec_url=self.recorder.url, prefix=self.prefix, run=self.run
        )
        self.t0 = time.monotonic()
        try:
            await pool.wait_ready(rec, pool.spawn(*self.worker_args(), count=a.workers), 60)
            self.say(
                f"{a.workers} workers up; redis {'.'.join(map(str, self.queue.version))}, "
                f"appendfsync {a.appendfsync}; producing {a.rate}/s for {a.duration}s"
            )
            producer = EventService.from_url(
                self.queue.url, prefix=self.prefix, enable_scheduling=False
            )
            sampler = asyncio.create_task(self.sample(rec))
            async with producer:
                tasks = [
                    asyncio.create_task(self.produce(producer)),
                    asyncio.create_task(self.inject(pool, rec)),
                ]
                start = time.monotonic()
                while (
                    time.monotonic() - start < a.duration or len(self.fault_log) < a.min_faults
                ) and not tasks[1].done():
                    left = a.duration - (time.monotonic() - start)
                    if left <= 0:  # past --duration, waiting for --min-faults
                        await asyncio.sleep(0.2)
                        continue
                    await asyncio.sleep(min(10.0, left))
                    handled = self.samples[-1][1] if self.samples else 0
                    self.say(
                        f"enqueued {len(self.enqueued)}, handled {handled}, "
                        f"faults {len(self.fault_log)}"
                    )
                self.stop.set()
                await asyncio.gather(*tasks)
                produced_s = time.monotonic() - start
                self.say("producing stopped; draining")
                drain_start = time.monotonic()
                want = set(self.enqueued)
                while time.monotonic() - drain_start < a.drain_timeout:
                    records = await read_records(rec, self.run)
                    dead = await self.dead_ids()
                    left = want - records.end.keys() - dead.keys()
                    if not left:
                        break
                    self.say(f"draining: {len(left)} not yet handled or dead")
                    await asyncio.sleep(2)
                drain_s = time.monotonic() - drain_start
            sampler.cancel()
            records = await read_records(rec, self.run)
            dead = await self.dead_ids()
            queued = await self.queued_ids()
            late = [float(x) for x in await rec.lrange(rec_key(self.run, "late"), 0, -1)]
        finally:
            pool.stop_all()
            await rec.aclose()
            self.queue.close()
            self.recorder.close()

        interrupted: collections.Counter[str] = collections.Counter()
        for counter in self.by_cause.values():
            interrupted.update(counter)
        result = reconcile(self.enqueued, records, interrupted, dead=dead, queued=queued)
        self.stalls()
        extra = [
            i
            for i in self.enqueued
            if records.start.get(i, 0) - records.fail.get(i, 0) - (1 if records.end.get(i) else 0)
            > 0
        ]
        explained_by = {
            cause: sum(1 for i in extra if c.get(i)) for cause, c in self.by_cause.items()
        }
        unexpected_dead = sorted(set(dead) - self.planned_dead)
        not_acknowledged = len(records.end.keys() - set(self.enqueued))
        late.sort()

        def pct(p: float) -> float | None:
            return round(late[min(len(late) - 1, int(p * len(late)))], 1) if late else None

        counts = collections.Counter(str(e["fault"]) for e in self.fault_log)
        report = {
            "config": {k: v for k, v in vars(a).items() if k not in ("json", "quiet")},
            "duration_s": round(produced_s, 1),
            "drain_s": round(drain_s, 1),
            "enqueued": len(self.enqueued),
            "enqueue_calls_failed_events": self.failed_enqueues,
            "handled_without_acknowledged_enqueue": not_acknowledged,
            "reconciliation": result.as_dict(),
            "planned_dead": len(self.planned_dead),
            "unexpected_dead": len(unexpected_dead),
            "unexpected_dead_sample": {i: dead[i] for i in unexpected_dead[:5]},
            "extra_runs_explained_by": explained_by,
            "faults": dict(counts),
            "fault_log": self.fault_log,
            "stall_after_fault_s": {
                f: {"max": max(v), "median": round(statistics.median(v), 2)}
                for f in counts
                if (
                    v := [
                        float(e["next_success_after_s"])
                        for e in self.fault_log  # type: ignore[arg-type]
                        if e["fault"] == f and e.get("next_success_after_s") is not None
                    ]
                )
            },
            "lateness_ms": {
                "p50": pct(0.5),
                "p99": pct(0.99),
                "max": late[-1] if late else None,
                "count": len(late),
            },
            "throughput_per_s": round(result.handled / max(1.0, produced_s), 1),
        }
        report["ok"] = not result.lost and not result.unexplained
        return report


def main() -> int:
    """Run the soak and print the report."""
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    report = asyncio.run(Soak(args).main())
    text = json.dumps(report, indent=2, sort_keys=True, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
