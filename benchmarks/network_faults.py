"""``python -m benchmarks.network_faults``: a network fault or a freeze on one of two workers.

Runs the scenarios of ``tests/faults/netfaults.py`` (the fault suite's, longer): two worker
processes (``tests/faults/faultworker.py``) handle a steady stream of events (``--rate``/s,
each due 0-1 s after its enqueue, handlers of 100-600 ms); one of them reaches Redis through
a :class:`delayq.testing.FaultProxy`, or is SIGSTOPped, for ``--fault`` seconds:

* ``blackhole`` - nothing forwarded, nothing closed (a half-open path), longer than the lease;
* ``latency`` - ``--latency`` seconds added to each direction;
* ``sigstop`` - the process frozen past its leases, then thawed.

For each it reports what the history check found (lost events, extra runs and whether the
fault's window explains every one, stale outcomes and lost leases of each process) and
the recovery: how long after the fault the faulted process ran a newly claimed event again,
how long after the fault began the events caught in it ran in the other process, and the
lateness of first deliveries (overall, and of the events due during the fault).

    python -m benchmarks.network_faults                          # ~2 minutes
    python -m benchmarks.network_faults --scenarios sigstop --fault 5

Prints a table and writes ``benchmarks/results/network-faults-<stamp>.json``. Exit status 1
when the history check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "faults"))

import redis.asyncio as aioredis  # noqa: E402
from faultkit import WorkerPool  # noqa: E402
from netfaults import SCENARIOS, Outcome, scenario, verdict  # noqa: E402

from delayq.testing import RedisServer  # noqa: E402

# the visibility timeout of each scenario: short, so that a fault outlasts the lease
VISIBILITY = {"blackhole": 1.0, "latency": 2.0, "sigstop": 1.0}


async def run_one(name: str, args: argparse.Namespace, recorder: RedisServer) -> Outcome:
    """One scenario against a fresh queue Redis."""
    prefix, run = f"nf-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:8]
    made: list[WorkerPool] = []

    def pools(url: str) -> WorkerPool:
        pool = WorkerPool(url=url, rec_url=recorder.url, prefix=prefix, run=run)
        made.append(pool)
        return pool

    rec = aioredis.Redis.from_url(recorder.url, protocol=2)
    try:
        with RedisServer() as queue:
            return await scenario(
                name,
                queue=queue,
                rec=rec,
                pools=pools,
                prefix=prefix,
                run=run,
                rate=args.rate,
                fault_s=args.fault if args.fault else (3.0 if name == "sigstop" else 10.0),
                visibility=VISIBILITY[name],
                latency=args.latency,
            )
    finally:
        for pool in made:
            pool.stop_all()
        await rec.aclose()


def row(o: Outcome) -> list[str]:
    """One line of the table."""
    f, h = o.metrics["faulted"], o.metrics["healthy"]

    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    return [
        o.scenario,
        f"{o.fault_s:g}",
        str(o.enqueued),
        str(len(o.lost)),
        f"{o.extra_runs} ({o.extra_runs - len(o.unexplained)} in window)",
        str(o.in_window),
        f"{f.get('stale_outcomes', 0)}/{h.get('stale_outcomes', 0)}",
        f"{f.get('leases_lost', 0)}/{h.get('leases_lost', 0)}",
        s(o.recovery_s),
        s(o.redelivered_s),
        f"{o.lateness_ms['p50']:.0f}/{o.lateness_ms['p99']:.0f}",
        f"{o.lateness_ms['max_due_in_fault']:.0f}",
    ]


HEADER = [
    "fault", "s", "events", "lost", "extra runs", "caught", "stale f/h", "leases lost f/h",
    "faulted back after s", "caught ran elsewhere after s", "lateness p50/p99 ms",
    "max lateness due in fault ms",
]  # fmt: skip


async def main(argv: list[str] | None = None) -> int:
    """Run, print, write the results; 1 when a history check failed."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--fault", type=float, default=0.0, help="seconds (default 10; sigstop 3)")
    p.add_argument("--rate", type=float, default=30.0, help="events per second")
    p.add_argument("--latency", type=float, default=0.2, help="seconds each way (latency)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--out-dir", default=str(HERE / "results"))
    args = p.parse_args(argv)
    outcomes: list[Outcome] = []
    failures: list[str] = []
    with RedisServer() as recorder:
        for _ in range(args.repeat):
            for name in args.scenarios:
                o = await run_one(name, args, recorder)
                outcomes.append(o)
                failures += [f"{name}: {w}" for w in verdict(o)]
    rows = [HEADER, *(row(o) for o in outcomes)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print("f/h: the faulted process / the healthy one")
    for f in failures:
        print("HISTORY CHECK FAILED:", f)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out: dict[str, Any] = {
        "command": "python -m benchmarks.network_faults " + " ".join(argv or sys.argv[1:]),
        "when": stamp,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "results": [o.as_dict() for o in outcomes],
        "failures": failures,
    }
    path = Path(args.out_dir) / f"network-faults-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
