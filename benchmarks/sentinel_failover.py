"""``python -m benchmarks.sentinel_failover``: what a Sentinel failover costs delayq.

A private Sentinel set (a master, two replicas, three sentinels on loopback; the sentinels
call the master down after 1 s) runs under a steady stream of delayed events: a producer
enqueues ``--rate`` events/s, each due ``--delay`` s later, and two worker services
(consumers and schedulers) handle them, recording every handler run. Then one fault:

* ``planned`` — ``SENTINEL FAILOVER`` (a replica is promoted after it caught up);
* ``kill`` — the master is killed with SIGKILL (and restarted later: it rejoins as a replica);
* ``freeze`` — the master is frozen with SIGSTOP until the sentinels promoted a replica,
  then, ``--thaw-after`` seconds later, thawed (it rejoins as a replica);
* ``planned2``, ``planned3`` — two (three) planned failovers back to back: the next
  ``SENTINEL FAILOVER`` is asked for as soon as the sentinels name the previous one's new
  master (issue 26);
* ``planned-kill`` — a planned failover, and ``--kill-after`` seconds after asking for it
  the old master is killed with SIGKILL while the sentinels are promoting a replica
  (restarted ``--thaw-after`` s after the promotion: it rejoins as a replica);
* ``planned-kill-new`` — a planned failover, and the replica it promotes is killed with
  SIGKILL as soon as the sentinels name it (so they fail over again, from a dead master;
  restarted ``--thaw-after`` s after that).

Each fault runs with ``min_replicas=0`` (the default) and ``min_replicas=1`` (enqueue, claim
and ack wait for a replica, ``WAIT 1``). Reported: events enqueued (calls that returned), lost
(enqueued, never handled), duplicates (handled more than once), when the master was
promoted (the first and the last one), the longest time without any delivery and without
any enqueue returning, and enqueue errors the producer saw. A throughput pass measures the
cost of ``min_replicas=1`` with no fault.

    python -m benchmarks.sentinel_failover                      # planned, kill, freeze; 0 and 1
    python -m benchmarks.sentinel_failover --faults kill --min-replicas 1
    python -m benchmarks.sentinel_failover --faults planned2,planned3,planned-kill \
        --runs 2 --throughput-events 0                           # issue 26's faults

Prints a table and writes ``benchmarks/results/sentinel-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from delayq import Event, EventService, fixed
from delayq.testing.resp import _command, _RespError
from delayq.testing.sentinel import RedisSentinelSet

HERE = Path(__file__).resolve().parent
FAULTS = ("planned", "kill", "freeze", "planned2", "planned3", "planned-kill", "planned-kill-new")
# the faults of a plain run; the back-to-back ones are asked for with --faults
DEFAULT_FAULTS = ("planned", "kill", "freeze")
# the sentinels learn the replicas from the master's INFO every 10 s: on a loaded machine that
# can take longer than RedisSentinelSet's default 20 s (returns as soon as they agree)
STARTUP_TIMEOUT = 60.0
# seconds of load at least, once the last failover is over and a stopped master is back
_SETTLED_LOAD_S = 2.0


class SentinelJob(Event, event_name="sentinel-job"):
    """The benchmark's event."""

    n: int = 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.sentinel_failover", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--faults", default=",".join(DEFAULT_FAULTS),
                   help=f"comma-separated, among {', '.join(FAULTS)}")  # fmt: skip
    p.add_argument("--min-replicas", default="0,1", help="settings to run, comma-separated")
    p.add_argument("--rate", type=float, default=200.0, help="events enqueued per second")
    p.add_argument("--delay", type=float, default=0.5, help="each event is due this much later")
    p.add_argument("--before", type=float, default=3.0, help="seconds of load before the fault")
    p.add_argument(
        "--after",
        type=float,
        default=12.0,
        help="seconds of load after it (and at least 2 s after the set is whole)",
    )
    p.add_argument(
        "--thaw-after", type=float, default=3.0, help="freeze: seconds frozen after the promotion"
    )
    p.add_argument("--kill-after", type=float, default=0.3,
                   help="planned-kill: seconds after asking for the failover")  # fmt: skip
    p.add_argument("--runs", type=int, default=1, help="runs of each fault and setting")
    p.add_argument("--drain-timeout", type=float, default=60.0,
                   help="seconds to wait for every enqueued event to be handled")  # fmt: skip
    p.add_argument("--throughput-events", type=int, default=20_000,
                   help="events in the min_replicas throughput pass (0: skip it)")  # fmt: skip
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--no-write", action="store_true")
    return p.parse_args(argv)


def _options(min_replicas: int) -> dict[str, Any]:
    return {
        "prefix": "sentinel-bench",
        "visibility_timeout": 5.0,
        "retry_backoff": fixed(0.2),
        "min_replicas": min_replicas,
    }


class Recorder:
    """What the handlers saw."""

    def __init__(self) -> None:
        self.runs: collections.Counter[str] = collections.Counter()
        self.times: list[float] = []

    async def __call__(self, event: SentinelJob) -> None:
        self.runs[event.id] += 1
        self.times.append(time.monotonic())


async def _ask_failover(sentinels: RedisSentinelSet, timeout: float = 20.0) -> None:
    """``SENTINEL FAILOVER`` of the current master, asked of a sentinel that already names it.

    A sentinel that has not heard of the previous switch yet would start a failover of the
    old master (which the others then overrule); one still finishing the previous failover
    answers ``INPROG``. Asked again until one accepts.
    """
    current = sentinels.master_address()
    deadline = time.monotonic() + timeout
    while True:
        for sentinel in sentinels.sentinels:
            try:
                host, port = _command(
                    sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", sentinels.service_name
                )
                if (host.decode(), int(port)) != current:
                    continue
                _command(sentinel.port, "SENTINEL", "FAILOVER", sentinels.service_name)
                return
            except (OSError, _RespError):
                continue
        if time.monotonic() > deadline:
            raise RuntimeError("no sentinel accepted SENTINEL FAILOVER")
        await asyncio.sleep(0.02)


async def _produce(
    producer: EventService, rate: float, delay: float, stop: asyncio.Event, ok: list[str],
    errors: collections.Counter[str], returned: dict[str, float],
) -> None:  # fmt: skip
    n = 0
    start = time.monotonic()
    while not stop.is_set():
        n += 1
        event = SentinelJob(id=f"j-{n}", n=n)
        try:
            await producer.enqueue_with_delay(event, delay)
            ok.append(event.id)
            returned[event.id] = time.monotonic()
        except Exception as exc:  # counted, not fatal: the producer retries nothing here
            errors[type(exc).__name__] += 1
        await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))


async def run_fault(
    fault: str,
    min_replicas: int,
    *,
    rate: float = 200.0,
    delay: float = 0.5,
    before: float = 3.0,
    after: float = 12.0,
    thaw_after: float = 3.0,
    kill_after: float = 0.3,
    drain_timeout: float = 60.0,
) -> dict[str, Any]:
    """One fault under load; returns the figures."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {FAULTS}")
    recorder = Recorder()
    ok: list[str] = []
    returned: dict[str, float] = {}
    errors: collections.Counter[str] = collections.Counter()
    with RedisSentinelSet(startup_timeout=STARTUP_TIMEOUT) as sentinels:
        workers = [EventService.from_url(sentinels.url, **_options(min_replicas)) for _ in (1, 2)]
        producer = EventService.from_url(
            sentinels.url, enable_scheduling=False, **_options(min_replicas)
        )
        for worker in workers:
            worker.add_handler(SentinelJob, recorder, concurrency=32)
        stop = asyncio.Event()
        old_master = sentinels.master()
        promoted_after = failovers_s = float("nan")
        before_fault = 0
        failovers = 1
        try:
            for worker in workers:
                await worker.start()
            producing = asyncio.create_task(
                _produce(producer, rate, delay, stop, ok, errors, returned)
            )
            await asyncio.sleep(before)
            fault_at = time.monotonic()
            before_fault = len(ok)
            if fault.startswith("planned"):
                await _ask_failover(sentinels)
                if fault == "planned-kill":
                    await asyncio.sleep(kill_after)
                    old_master.kill()
            elif fault == "kill":
                old_master.kill()
            else:
                old_master.freeze()
            while sentinels.master() is old_master:
                await asyncio.sleep(0.02)
            promoted_after = time.monotonic() - fault_at
            if fault == "planned-kill-new":
                old_master = sentinels.master()
                old_master.kill()
                while sentinels.master() is old_master:
                    await asyncio.sleep(0.02)
                failovers += 1
            for _ in range(int(fault[-1]) - 1 if fault[-1].isdigit() else 0):
                # the next failover as soon as the sentinels name the new master
                current = sentinels.master()
                await _ask_failover(sentinels)
                while sentinels.master() is current:
                    await asyncio.sleep(0.02)
                failovers += 1
            failovers_s = time.monotonic() - fault_at
            if fault == "freeze":
                await asyncio.sleep(thaw_after)
                old_master.thaw()
            elif fault in ("kill", "planned-kill", "planned-kill-new"):
                await asyncio.sleep(thaw_after)
                old_master.start()  # the sentinels make it a replica of the new master
            # at least 2 s of load once the set is whole again: on a loaded machine the
            # failovers alone could take most of `after`, leaving the check on what was
            # enqueued after the fault without teeth (or failing it)
            end = max(fault_at + after, time.monotonic() + _SETTLED_LOAD_S)
            await asyncio.sleep(max(0.0, end - time.monotonic()))
            stop.set()
            await producing
            deadline = time.monotonic() + drain_timeout
            while time.monotonic() < deadline and not set(ok) <= recorder.runs.keys():
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await producer.aclose()
            for worker in workers:
                await worker.aclose()
    times = sorted(recorder.times)
    window = [t for t in times if t >= fault_at - 1]
    gap = max((b - a for a, b in itertools.pairwise(window)), default=float("nan"))
    lost = [i for i in ok if i not in recorder.runs]
    return {
        "fault": fault,
        "min_replicas": min_replicas,
        "enqueued": len(ok),
        "enqueued_after_fault": len(ok) - before_fault,
        "enqueue_errors": dict(errors),
        "handled": len(recorder.runs),
        "lost": len(lost),
        "lost_sample": lost[:10],
        # when the lost enqueues returned, in seconds after the fault (first, last)
        "lost_returned_s": [
            round(returned[lost[0]] - fault_at, 3),
            round(returned[lost[-1]] - fault_at, 3),
        ]
        if lost
        else [],
        "duplicates": sum(1 for n in recorder.runs.values() if n > 1),
        "failovers": failovers,
        "promoted_after_s": promoted_after,
        "all_promoted_after_s": failovers_s,
        "longest_gap_s": gap,
        # the longest time without an enqueue returning (the producer waits for each one)
        "longest_enqueue_pause_s": max(
            (b - a for a, b in itertools.pairwise(sorted(returned.values()))), default=float("nan")
        ),
    }


async def throughput(min_replicas: int, n: int) -> dict[str, Any]:
    """Enqueue and handle ``n`` events (no fault); events per second both ways."""
    recorder = Recorder()
    with RedisSentinelSet(startup_timeout=STARTUP_TIMEOUT) as sentinels:
        worker = EventService.from_url(sentinels.url, **_options(min_replicas))
        worker.add_handler(SentinelJob, recorder, concurrency=64)
        producer = EventService.from_url(
            sentinels.url, enable_scheduling=False, **_options(min_replicas)
        )
        try:
            start = time.monotonic()
            sem = asyncio.Semaphore(100)

            async def one(i: int) -> None:
                async with sem:
                    await producer.enqueue_with_delay(SentinelJob(id=f"t-{i}", n=i), 0)

            await asyncio.gather(*(one(i) for i in range(n)))
            enqueue_s = time.monotonic() - start
            start = time.monotonic()
            await worker.start()
            while len(recorder.runs) < n:
                await asyncio.sleep(0.01)
            handle_s = time.monotonic() - start
        finally:
            await producer.aclose()
            await worker.aclose()
    return {
        "min_replicas": min_replicas,
        "events": n,
        "enqueue_per_s": n / enqueue_s,
        "handled_per_s": n / handle_s,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the faults and the throughput pass; print the table; write the JSON."""
    args = parse_args(argv)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    settings = [int(x) for x in args.min_replicas.split(",") if x.strip()]
    results, speed = [], []
    for min_replicas in settings:
        for fault, _ in itertools.product(faults, range(args.runs)):
            print(f"{fault}, min_replicas={min_replicas} ...", flush=True)
            results.append(asyncio.run(run_fault(
                fault, min_replicas, rate=args.rate, delay=args.delay, before=args.before,
                after=args.after, thaw_after=args.thaw_after, kill_after=args.kill_after,
                drain_timeout=args.drain_timeout,
            )))  # fmt: skip
        if args.throughput_events:
            speed.append(asyncio.run(throughput(min_replicas, args.throughput_events)))
    print(
        f"\n{args.rate:.0f} events/s, due {args.delay} s after enqueue, 2 worker services; "
        f"sentinels: down after 1 s; {os.cpu_count()} CPUs"
    )
    print(
        f"{'fault':<12} {'min_replicas':>12} {'enqueued':>8} {'after fault':>11} {'lost':>5} "
        f"{'dups':>5} "
        f"{'promoted s':>10} {'all s':>6} {'no delivery s':>13} {'no enqueue s':>12}  "
        "enqueue errors"
    )
    for r in results:
        print(
            f"{r['fault']:<12} {r['min_replicas']:>12} {r['enqueued']:>8} "
            f"{r['enqueued_after_fault']:>11} {r['lost']:>5} "
            f"{r['duplicates']:>5} {r['promoted_after_s']:>10.2f} "
            f"{r['all_promoted_after_s']:>6.2f} {r['longest_gap_s']:>13.2f} "
            f"{r['longest_enqueue_pause_s']:>12.2f}  "
            f"{r['enqueue_errors'] or '-'}"
        )
    if speed:
        print(f"\n{'min_replicas':>12} {'enqueue/s':>10} {'handled/s':>10}")
        for s in speed:
            print(
                f"{s['min_replicas']:>12} {s['enqueue_per_s']:>10,.0f} {s['handled_per_s']:>10,.0f}"
            )
    if not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = args.out / f"sentinel-{stamp}.json"
        path.write_text(json.dumps({
            "benchmark": "sentinel_failover", "when": stamp,
            "argv": sys.argv[1:] if argv is None else argv, "cpus": os.cpu_count(),
            "python": platform.python_version(), "faults": results, "throughput": speed,
        }, indent=2) + "\n")  # fmt: skip
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
