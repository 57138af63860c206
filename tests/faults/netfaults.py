"""Network and freeze faults on one of two worker processes, with a history check.

Shared by ``tests/faults/test_fault_network.py`` (short runs, asserted) and
``benchmarks/network_faults.py`` (longer runs, figures for docs/RELIABILITY.md).

Two ``faultworker.py`` processes handle a steady stream of events: the *faulted* one talks
to Redis through a :class:`delayq.testing.FaultProxy` (or is SIGSTOPped), the *healthy* one
directly. A producer in this process enqueues ``rate`` events/s, each due 0-1 s later, whose
handlers take 100-600 ms; one in ten fails its first delivery. After ``warmup`` seconds the fault is applied for ``fault_s``:

* ``blackhole`` - the proxy forwards nothing and closes nothing (a half-open path);
* ``latency`` - the proxy delays each direction by ``latency`` seconds;
* ``sigstop`` - the faulted process is frozen, then thawed (SIGCONT).

The history check (:func:`check`): every enqueue that returned is handled; every extra run
of an event is explained by the fault's window (the event was in progress in the faulted
process when the fault began, or was claimed there before it ended and started after it
began); no stale ack, failure record or renewal touched a newer delivery (the healthy
process saw no stale outcome and lost no lease, and every successful run was either
acknowledged or counted stale).
"""

from __future__ import annotations

import collections
import os
import random
import signal
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import redis.asyncio as aioredis
from faultkit import Job, Worker, WorkerPool, read_records, rec_key, reconcile

from delayq import EventService
from delayq.testing import FaultProxy, RedisServer, wait_for

SCENARIOS = ("blackhole", "latency", "sigstop")


@dataclass
class Run:
    """One handler run, as ``faultworker.py --record-runs`` wrote it."""

    pid: int
    id: str
    claimed_ms: int
    start_ms: int


@dataclass
class Outcome:
    """What one scenario did: the history check's verdict and the figures."""

    scenario: str
    fault_s: float
    enqueued: int
    lost: list[str]
    extra_runs: int
    unexplained: list[str]
    in_window: int
    """Events in progress in the faulted process during the fault (may run again)."""
    metrics: dict[str, dict[str, int]]
    """``faulted`` / ``healthy`` -> the process's counters."""
    successes: int
    """Successful handler runs (all processes)."""
    failures: int
    """Failed handler runs (planned: ``Job.fail_times``), all processes."""
    recovery_s: float | None
    """From the fault's end to the faulted process's first run of an event claimed after it."""
    redelivered_s: float | None
    """From the fault's start to the last run elsewhere of an event caught in the fault."""
    lateness_ms: dict[str, float]
    """First deliveries: p50, p99 and max overall; max of those due during the fault."""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly (lists shortened)."""
        d = asdict(self)
        d["lost"], d["unexplained"] = len(self.lost), len(self.unexplained)
        return d


def worker_args(visibility: float) -> tuple[str, ...]:
    """The options of both worker processes."""
    return (
        "--visibility", str(visibility), "--concurrency", "16", "--metrics", "--record-runs",
        "--record-lateness", "--scheduling-interval", "0.2", "--lock-timeout", "2",
        "--polling-timeout", "2",
    )  # fmt: skip


async def read_runs(rec: aioredis.Redis, run: str) -> list[Run]:
    """Every handler run recorded so far."""
    rows = await rec.lrange(rec_key(run, "runs"), 0, -1)
    out = []
    for row in rows:
        pid, id_, claimed, start = row.decode().split(" ")
        out.append(Run(int(pid), id_, int(claimed), int(start)))
    return out


async def read_metrics(rec: aioredis.Redis, run: str, pid: int) -> dict[str, int]:
    """The counters process ``pid`` wrote on exit (``faultworker.py --metrics``)."""
    raw = await rec.hgetall(rec_key(run, f"metrics:{pid}"))
    return {k.decode(): int(v) for k, v in raw.items()}


async def scenario(
    name: str,
    *,
    queue: RedisServer,
    rec: aioredis.Redis,
    pools: Any,
    prefix: str,
    run: str,
    rate: float = 30.0,
    warmup: float = 2.0,
    fault_s: float = 10.0,
    after: float = 2.0,
    visibility: float = 1.0,
    latency: float = 0.2,
    seed: int = 37,
) -> Outcome:
    """Run scenario ``name`` (see the module's docs) and check its history. One event in
    ten fails on its first delivery (a failure record, then a retry)."""
    assert name in SCENARIOS, name
    async with FaultProxy(queue.url) as proxy:
        faulted_pool: WorkerPool = pools(queue.url if name == "sigstop" else proxy.url)
        healthy_pool: WorkerPool = pools(queue.url)
        args = worker_args(visibility)
        (faulted,) = faulted_pool.spawn(*args)
        (healthy,) = healthy_pool.spawn(*args)
        await faulted_pool.wait_ready(rec, [faulted])
        await healthy_pool.wait_ready(rec, [healthy])
        rnd = random.Random(seed)
        ids: list[str] = []
        window: list[float] = []
        producer = EventService.from_url(queue.url, prefix=prefix, enable_scheduling=False)
        async with producer:

            async def produce() -> None:
                end = time.monotonic() + warmup + fault_s + after
                n = 0
                while time.monotonic() < end:
                    batch = [
                        (Job(id=f"{name}-{n + i}", seq=n + i, sleep_ms=rnd.randint(100, 600),
                             fail_times=int(rnd.random() < 0.1)),
                         rnd.uniform(0, 1))
                        for i in range(max(1, int(rate / 10)))
                    ]  # fmt: skip
                    n += len(batch)
                    assert all(await producer.enqueue_many(batch))
                    ids.extend(j.id for j, _ in batch)
                    await anyio.sleep(0.1)

            async def busy() -> bool:  # a fault that catches nothing would test little
                return await rec.scard(rec_key(run, f"inprog:{faulted.pid}")) >= 3

            async def fault() -> None:
                await anyio.sleep(warmup)
                await wait_for(busy, timeout=30)
                window.append(time.time() * 1000)
                if name == "blackhole":
                    proxy.blackhole()
                elif name == "latency":
                    proxy.set_latency(latency, latency)
                else:
                    os.kill(faulted.pid, signal.SIGSTOP)
                # what was in progress there when the fault began may run again elsewhere
                await faulted_pool.mark_interrupted(rec, faulted.pid)
                await anyio.sleep(fault_s)  # the fault's length
                if name == "sigstop":
                    # a handler's start record sent just before the freeze may reach the
                    # recorder after the first look (seen on a loaded host): the stopped
                    # process adds nothing more, so a second look sees all it had started
                    await faulted_pool.mark_interrupted(rec, faulted.pid)
                    os.kill(faulted.pid, signal.SIGCONT)
                proxy.clear()
                window.append(time.time() * 1000)

            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                tg.start_soon(fault)

            async def all_handled() -> bool:
                return await rec.hlen(rec_key(run, "end")) >= len(ids)

            await wait_for(all_handled, timeout=60, interval=0.1, message=faulted_pool.logs())

            async def drained() -> bool:
                c = await producer.stats_for(Job)
                return c.scheduled == c.ready == c.in_flight == 0

            await wait_for(drained, timeout=30, interval=0.1)
        # SIGTERM (the workers write their counters on the way out), in a thread: the
        # proxy runs in this event loop and must forward the faulted one's last calls
        await anyio.to_thread.run_sync(faulted_pool.stop_all)
        await anyio.to_thread.run_sync(healthy_pool.stop_all)
    return await check(name, rec, run, ids, faulted_pool, faulted, healthy, window, fault_s)


async def check(
    name: str,
    rec: aioredis.Redis,
    run: str,
    ids: list[str],
    faulted_pool: WorkerPool,
    faulted: Worker,
    healthy: Worker,
    window: list[float],
    fault_s: float,
) -> Outcome:
    """The history check of one scenario, and its figures."""
    start_ms, end_ms = window
    runs = await read_runs(rec, run)
    interrupted = collections.Counter(faulted_pool.interrupted)
    if name != "latency":  # latency is not a window for extra runs: there must be none
        for r in runs:  # claimed before the fault ended, started after it began
            if r.pid == faulted.pid and r.claimed_ms <= end_ms and r.start_ms >= start_ms:
                interrupted[r.id] = max(interrupted[r.id], 1)
    else:
        interrupted.clear()
    records = await read_records(rec, run)
    result = reconcile(ids, records, interrupted)
    metrics = {
        "faulted": await read_metrics(rec, run, faulted.pid),
        "healthy": await read_metrics(rec, run, healthy.pid),
    }
    caught = set(interrupted)
    after_fault = [
        r.start_ms - end_ms for r in runs if r.pid == faulted.pid and r.claimed_ms > end_ms
    ]
    elsewhere = [r.start_ms - start_ms for r in runs if r.id in caught and r.pid != faulted.pid]
    late_all: list[float] = []
    late_window: list[float] = []
    for row in await rec.lrange(rec_key(run, "due-late"), 0, -1):
        due, late = row.decode().split(" ")
        late_all.append(float(late))
        if start_ms <= int(due) <= end_ms:
            late_window.append(float(late))
    q = statistics.quantiles(late_all, n=100) if len(late_all) > 1 else [0.0] * 99
    return Outcome(
        scenario=name,
        fault_s=fault_s,
        enqueued=len(ids),
        lost=result.lost,
        extra_runs=result.extra_runs,
        unexplained=result.unexplained,
        in_window=len(caught),
        metrics=metrics,
        successes=sum(records.end.values()),
        failures=sum(records.fail.values()),
        recovery_s=min(after_fault) / 1000 if after_fault else None,
        redelivered_s=max(elsewhere) / 1000 if elsewhere else None,
        lateness_ms={
            "p50": q[49],
            "p99": q[98],
            "max": max(late_all, default=0.0),
            "max_due_in_fault": max(late_window, default=0.0),
        },
    )


def verdict(o: Outcome) -> list[str]:
    """What the history check found wrong (empty: nothing)."""
    wrong = []
    if o.lost:
        wrong.append(f"lost {len(o.lost)}: {o.lost[:5]}")
    if o.unexplained:
        wrong.append(f"unexplained extra runs: {o.unexplained[:5]}")
    healthy, faulted = o.metrics["healthy"], o.metrics["faulted"]
    # a stale outcome or a lost lease in the healthy process: something of the faulted one
    # changed a newer delivery's state
    for name in ("stale_outcomes", "leases_lost"):
        if healthy.get(name, 0):
            wrong.append(f"healthy process: {name} = {healthy[name]}")
    acked = healthy.get("succeeded", 0) + faulted.get("succeeded", 0)
    stale = healthy.get("stale_outcomes", 0) + faulted.get("stale_outcomes", 0)
    # every successful run was acked or found its lease gone; the other stale outcomes are
    # failure records (a failed run of the faulted process)
    if not acked <= o.successes <= acked + stale <= o.successes + o.failures:
        wrong.append(
            f"successes {o.successes}, failures {o.failures}: acked {acked}, stale {stale}"
        )
    if acked > o.enqueued:
        wrong.append(f"acked {acked} > enqueued {o.enqueued}: an event removed twice")
    if o.scenario == "latency" and (o.extra_runs or stale or faulted.get("leases_lost", 0)):
        wrong.append(f"latency alone: extra runs {o.extra_runs}, stale {stale}")
    return wrong
