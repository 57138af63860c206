"""One hot event type on a loopback 3-master Redis Cluster: 1 partition vs N.

    python -m benchmarks.partitions [--events 20000] [--partitions 1,6,12] [--workers 2]

For each partition count, a fresh cluster; the events are enqueued due now
(``enqueue_many``), then ``--workers`` services (each with its own clients, in
this process) handle them with a no-op handler. Prints a table: end-to-end
throughput, and Redis CPU (``used_cpu_sys + used_cpu_user`` from ``INFO cpu``,
before/after) per node, with the busiest node's share. Writes JSON to
``benchmarks/results/partitions-<time>.json``.

What it can and cannot show on 2 cores: the client side (Python) is the
bottleneck here, so throughput barely moves; what moves is where Redis spends
its CPU. With one partition every script of the type runs on one node; with N
spread over 3 masters each node does about a third. The model in
benchmarks/RESULTS.md turns the per-event Redis CPU into a ceiling per node.

Membership churn (issue 26, part 3), with ``--scenarios join,rolling``:

    python -m benchmarks.partitions --scenarios join,rolling [--duration 60] [--every 10]

One fresh cluster per scenario, worker processes (``benchmarks/partition_worker.py``,
default options, a ``partitions=6`` type, no-op handler) and a producer in this process
enqueueing ``--rate`` events/s, each due 0.5-3 s after its enqueue.

* ``join`` -- ``--fleet`` workers run; every ``--every`` seconds a new process starts,
  runs for ``--every`` seconds and stops gracefully (SIGTERM), then the next one joins.
* ``rolling`` -- ``--fleet`` workers; every ``--every`` seconds the oldest gets SIGTERM,
  drains and is replaced, as a deploy does.
* ``resubscribe`` -- ``--fleet`` workers; every ``--every`` seconds every pub/sub
  connection of the cluster is killed (``CLIENT KILL TYPE pubsub``): the schedulers
  resubscribe, and wake-ups published meanwhile are lost.

Lateness is claim time minus due time (Redis clock) of each first delivery: overall, of
the events due in the ``--every`` seconds after each fault (a start or a stop), and of
those among them on the partitions the new process owns. Evictions count how often one
process declared another dead (``evict:`` in ``members.lua``); among live processes it
should be 0. Writes ``benchmarks/results/partition-churn-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from delayq import Event, EventService
from delayq.partitions.spread import owner_of
from delayq.testing import RedisServer
from delayq.testing.cluster import RedisClusterServer

HERE = Path(__file__).resolve().parent
CHURN_WORKER = HERE / "partition_worker.py"
CHURN_SCENARIOS = ("join", "rolling", "resubscribe")


def _event_type(partitions: int) -> type[Event]:
    class BenchHot(Event, event_name="bench-hot", partitions=partitions):
        n: int = 0

    return BenchHot


def _cpu(ports: list[int]) -> list[float]:
    out = []
    for port in ports:
        client = redis.Redis(port=port)
        info = client.info("cpu")
        out.append(float(info["used_cpu_sys"]) + float(info["used_cpu_user"]))
        client.close()
    return out


async def _run(partitions: int, events: int, workers: int) -> dict[str, Any]:
    with RedisClusterServer(3) as cluster:
        kind = _event_type(partitions)
        done = 0
        finished = asyncio.Event()

        async def handle(event: Event) -> None:
            nonlocal done
            done += 1
            if done >= events:
                finished.set()

        producer = EventService.from_url(cluster.url, cluster=True, prefix="bp",
                                         enable_scheduling=False)  # fmt: skip
        for start in range(0, events, 5000):
            await producer.enqueue_many(
                [kind(id=f"e-{i}") for i in range(start, min(events, start + 5000))]
            )
        await producer.aclose()
        services = [
            EventService.from_url(cluster.url, cluster=True, prefix="bp") for _ in range(workers)
        ]
        cpu0 = _cpu(cluster.ports)
        t0 = time.perf_counter()
        for s in services:
            s.add_handler(kind, handle, concurrency=64)
            await s.start()
        await asyncio.wait_for(finished.wait(), timeout=600)
        seconds = time.perf_counter() - t0
        cpu = [b - a for a, b in zip(cpu0, _cpu(cluster.ports), strict=True)]
        for s in services:
            await s.aclose()
    return {
        "partitions": partitions,
        "events": events,
        "workers": workers,
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds),
        "redis_cpu_s_per_node": [round(c, 3) for c in cpu],
        "busiest_node_share": round(max(cpu) / sum(cpu), 3) if sum(cpu) else 0.0,
        "redis_cpu_us_per_event": round(sum(cpu) / events * 1e6, 1),
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _stats(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": _pct(values, 0.5), "p99": _pct(values, 0.99),
            "max": max(values, default=float("nan"))}  # fmt: skip


class Churn:
    """One membership-churn scenario: a cluster, worker processes, a producer, the faults."""

    def __init__(self, name: str, args: argparse.Namespace):
        self.name = name
        self.args = args
        self.prefix = f"bc-{uuid.uuid4().hex[:6]}"
        self.run = uuid.uuid4().hex[:8]
        self.logs = Path(tempfile.mkdtemp(prefix="delayq-churn-"))
        self.alive: list[subprocess.Popen[bytes]] = []
        self.enqueued: list[str] = []
        self.faults: list[int] = []  # Redis ms of each start or stop of a process
        # each process started after the fleet: its token, the members once it runs
        self.newcomers: list[tuple[str, list[str]]] = []
        self.rnd = random.Random(args.seed)
        self.raw: dict[str, Any] = {}

    def key(self, name: str) -> str:
        return f"bc:{self.run}:{name}"

    def spawn(self, url: str, rec_url: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"w{len(list(self.logs.iterdir()))}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, str(CHURN_WORKER), url, rec_url, self.prefix, self.run],
            cwd=HERE.parent, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.alive.append(proc)
        return proc

    async def ready(self, rec: aioredis.Redis, proc: subprocess.Popen[bytes]) -> str:
        """Wait until ``proc``'s service runs; return its scheduler token."""
        for _ in range(1200):
            if await rec.hget(self.key("ready"), str(proc.pid)):
                tokens = await rec.hgetall(self.key("tokens"))
                return next(t.decode() for t, p in tokens.items() if int(p) == proc.pid)
            if proc.poll() is not None:
                raise RuntimeError(
                    f"worker {proc.pid} exited {proc.returncode}; logs in {self.logs}"
                )
            await asyncio.sleep(0.05)
        raise RuntimeError(f"worker {proc.pid} did not start; logs in {self.logs}")

    async def stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
        self.alive.remove(proc)
        if code != 0:
            raise RuntimeError(f"worker {proc.pid} exited {code}; logs in {self.logs}")

    async def produce(self, producer: EventService, stop: asyncio.Event) -> None:
        kind = _churn_type()
        start, n = time.monotonic(), 0
        while not stop.is_set():
            batch = []
            while n < int((time.monotonic() - start) * self.args.rate):
                batch.append((kind(id=f"c-{n}", n=n), self.rnd.uniform(0.5, 3.0)))
                n += 1
            if batch:
                assert all(await producer.enqueue_many(batch))
                self.enqueued.extend(e.id for e, _ in batch)
            await asyncio.sleep(0.05)

    async def main(self) -> dict[str, Any]:
        a = self.args
        with RedisClusterServer(3) as cluster, RedisServer() as recorder:
            rec = aioredis.Redis.from_url(recorder.url, protocol=2)
            producer = EventService.from_url(cluster.url, cluster=True, prefix=self.prefix,
                                             enable_scheduling=False)  # fmt: skip
            try:
                tokens: dict[int, str] = {}

                async def start() -> str:
                    proc = self.spawn(cluster.url, recorder.url)
                    tokens[proc.pid] = token = await self.ready(rec, proc)
                    return token

                for _ in range(a.fleet):
                    await start()
                stop = asyncio.Event()
                producing = asyncio.create_task(self.produce(producer, stop))
                started = time.monotonic()
                await asyncio.sleep(3.0)  # a steady stream before the first fault
                while time.monotonic() - started < a.duration:
                    if self.name == "resubscribe":
                        self.faults.append(await _redis_ms(rec))
                        await asyncio.to_thread(_kill_pubsub, cluster.ports)
                        await asyncio.sleep(a.every)
                        continue
                    if self.name == "rolling":
                        self.faults.append(await _redis_ms(rec))
                        await self.stop(self.alive[0])
                    self.faults.append(await _redis_ms(rec))
                    token = await start()
                    self.newcomers.append((token, [tokens[p.pid] for p in self.alive]))
                    await asyncio.sleep(a.every)
                    if self.name == "join":
                        self.faults.append(await _redis_ms(rec))
                        await self.stop(self.alive[-1])
                        await asyncio.sleep(a.every)
                stop.set()
                await producing
                want = set(self.enqueued)
                for _ in range(90):  # the last events fall due; orphans come back
                    await asyncio.sleep(0.5)
                    seen = {
                        r.decode().split()[3] for r in await rec.lrange(self.key("late"), 0, -1)
                    }
                    if want <= seen | {
                        r.decode() for r in await rec.lrange(self.key("again"), 0, -1)
                    }:
                        break
                raw: dict[str, Any] = {
                    name: [r.decode() for r in await rec.lrange(self.key(name), 0, -1)]
                    for name in ("late", "moves", "evictions", "again")
                }
                raw["joined"] = {
                    t.decode(): int(ms) for t, ms in (await rec.hgetall(self.key("joined"))).items()
                }
                raw["tokens"] = {str(pid): t for pid, t in tokens.items()}
                if a.dump:
                    self.raw = {**raw, "faults": self.faults, "newcomers": self.newcomers,
                                "logs": str(self.logs)}  # fmt: skip
            finally:
                await producer.aclose()
                for proc in list(self.alive):
                    proc.send_signal(signal.SIGTERM)
                for proc in list(self.alive):
                    try:
                        await asyncio.to_thread(proc.wait, 30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                await rec.aclose()
        return self.report(raw)

    def report(self, raw: dict[str, Any]) -> dict[str, Any]:
        a = self.args
        window = a.every * 1000
        records = [r.split() for r in raw["late"]]
        seen = {r[3] for r in records} | set(raw["again"])
        token_of = {int(pid): t for pid, t in raw["tokens"].items()}
        # each newcomer's partitions, from its join (its first membership beat) on
        joins = [(raw["joined"][t], t, members) for t, members in self.newcomers]
        late: list[float] = []
        after: list[float] = []
        owned: list[float] = []
        steady: list[float] = []
        for due_s, late_s, shard, _ in records:
            due, lateness = float(due_s), float(late_s)
            late.append(lateness)
            if any(at <= due < at + window for at in self.faults):
                after.append(lateness)
            else:
                steady.append(lateness)
            if any(j <= due < j + window and owner_of(shard, m) == t for j, t, m in joins):
                owned.append(lateness)
        by_it = by_others = 0
        for move in raw["moves"]:
            ms_s, pid, shard, moved, _ = move.split()
            ms = int(ms_s)
            for j, t, m in joins:
                if j <= ms < j + window and owner_of(shard, m) == t:
                    if token_of[int(pid)] == t:
                        by_it += int(moved)
                    else:
                        by_others += int(moved)
        evicted = [e.split() for e in raw["evictions"]]
        return {
            "scenario": self.name,
            "fleet": a.fleet,
            "faults": len(self.faults),
            "enqueued": len(self.enqueued),
            "lost": len(set(self.enqueued) - seen),
            "redelivered": len(raw["again"]),
            "evictions": len(evicted),
            "newcomers_evicted": sum(
                1
                for ms, _, t in evicted
                for j, t2, _ in joins
                if t == t2 and j <= int(ms) < j + window
            ),
            "moved_by_newcomer": by_it,
            "moved_by_others": by_others,
            "lateness_ms": _stats(late),
            "steady_ms": _stats(steady),
            "after_fault_ms": _stats(after),
            "new_owner_ms": _stats(owned),
        }


def _churn_type() -> type[Event]:
    sys.path.insert(0, str(HERE))
    from partition_worker import ChurnJob

    return ChurnJob


def _kill_pubsub(ports: list[int]) -> None:
    """Drop every pub/sub connection of the cluster (the schedulers resubscribe)."""
    for port in ports:
        client = redis.Redis(port=port)
        client.client_kill_filter(_type="pubsub")
        client.close()


async def _redis_ms(client: aioredis.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def churn(args: argparse.Namespace) -> None:
    """Run the membership-churn scenarios, print the table, write the JSON."""
    names = [n for n in args.scenarios.split(",") if n]
    unknown = set(names) - set(CHURN_SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenarios {sorted(unknown)}; known: {CHURN_SCENARIOS}")
    rows = []
    for name in names:
        print(f"{name}: running for {args.duration:.0f} s ...", flush=True)
        scenario = Churn(name, args)
        rows.append(asyncio.run(scenario.main()))
        if args.dump:
            Path(f"{args.dump}-{name}.json").write_text(json.dumps(scenario.raw))
    print(
        f"\n{args.rate:.0f} events/s of one partitions=6 type due 0.5-3 s after enqueue, "
        f"3-master loopback cluster, a fault every {args.every:.0f} s, {os.cpu_count()} CPUs"
    )
    print("| scenario | fleet | faults | events | lost | run twice | evictions (of a newcomer) "
          "| lateness p50 / p99 / max | due within a fault's window | a newcomer's partitions "
          "after its join | their events moved by another process | steady |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---|---|---|---|---|---|")

    def fmt(s: dict[str, float]) -> str:
        return f"{s['p50']:.0f} / {s['p99']:.0f} / {s['max']:.0f} ms"

    for r in rows:
        moved = r["moved_by_newcomer"] + r["moved_by_others"]
        share = r["moved_by_others"] / moved if moved else 0.0
        print(f"| {r['scenario']} | {r['fleet']} | {r['faults']} | {r['enqueued']} | {r['lost']} "
              f"| {r['redelivered']} | {r['evictions']} ({r['newcomers_evicted']}) "
              f"| {fmt(r['lateness_ms'])} | {fmt(r['after_fault_ms'])} | {fmt(r['new_owner_ms'])} "
              f"| {r['moved_by_others']} of {moved} ({share:.0%}) | {fmt(r['steady_ms'])} |")  # fmt: skip
    if not args.no_write:
        out = HERE / "results"
        out.mkdir(exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = out / f"partition-churn-{stamp}.json"
        path.write_text(json.dumps({"argv": sys.argv[1:], "results": rows}, indent=2) + "\n")
        print(f"\nwrote {path}")


async def main(args: argparse.Namespace) -> None:
    """Run every partition count and print the table."""
    rows = [await _run(int(n), args.events, args.workers) for n in args.partitions.split(",")]
    print(f"\n{args.events} due-now events of one type, {args.workers} worker services, "
          "3-master loopback cluster")  # fmt: skip
    print("| partitions | events/s | Redis CPU s per node | busiest node | Redis CPU µs/event |")
    print("|---:|---:|---|---:|---:|")
    for r in rows:
        nodes = " / ".join(f"{c:.2f}" for c in r["redis_cpu_s_per_node"])
        print(f"| {r['partitions']} | {r['events_per_s']} | {nodes} | "
              f"{r['busiest_node_share']:.0%} | {r['redis_cpu_us_per_event']} |")  # fmt: skip
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    (out / f"partitions-{stamp}.json").write_text(json.dumps(rows, indent=2))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--partitions", default="1,6,12")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scenarios", default="",
                        help="membership churn instead: join,rolling,resubscribe")  # fmt: skip
    parser.add_argument("--fleet", type=int, default=2, help="churn: workers that keep running")
    parser.add_argument("--duration", type=float, default=60.0, help="churn: seconds of faults")
    parser.add_argument("--every", type=float, default=10.0, help="churn: seconds between faults")
    parser.add_argument("--rate", type=float, default=200.0, help="churn: events enqueued/s")
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--no-write", action="store_true", help="print only, write no JSON")
    parser.add_argument("--dump", help="churn: write raw records to DUMP-<scenario>.json")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.scenarios:
        churn(arguments)
    else:
        asyncio.run(main(arguments))
