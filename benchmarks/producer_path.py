"""The producer's own path of a single awaited enqueue, in CPU instructions, for two commits.

``ab.py --side producer --count`` counts a real producer against a real redis-server; its
reading of one commit moved by up to 2.5 % from run to run (b70db3c: 63.9 k to 65.6 k
instructions per enqueue; the cause is not pinned down: under valgrind the enqueues share
their script calls the same way on every run). This counts what a commit's own code spends per enqueue, without Redis: the
store's script call (``Enqueueing._send_enqueue``) and the layout registration
(``register_type``) are replaced by stubs answering "added", so the facade, the enqueue
operation, the router, the codec and the store's coalescing run as they do for real.
Under valgrind (``cachegrind``, no cache simulation, ``PYTHONHASHSEED=0``) at ``--events``
and at a tenth of it (start-up and imports cancel out), it reads the same figure, to a
few tens of instructions, on every run::

    python benchmarks/producer_path.py --a b70db3c --b HEAD

Prints a table and writes ``benchmarks/results/producer-path-<stamp>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs in a child process against the commit's own code: the ab.py producer's calls (100
# tasks, single awaited enqueue_with_delay calls due in an hour), Redis stubbed out.
CHILD = r"""
import asyncio, sys
from datetime import timedelta
from delayq import Event, EventService
from delayq.storage import enqueueing

class AbJob(Event, event_name="ab-job"):
    pass

async def send(self, shard, items, **options):
    await asyncio.sleep(0)  # a reply comes in a later iteration of the loop
    return [1] * len(items)

async def register_type(self, shard):
    return None

enqueueing.Enqueueing._send_enqueue = send
enqueueing.Layouts.register_type = register_type
n = int(sys.argv[1])

async def produce() -> None:
    # nothing listens on port 1: a call that reached Redis would fail the run
    service = EventService.from_url("redis://127.0.0.1:1/0", prefix="ab", enable_scheduling=False)
    await service.enqueue_with_delay(AbJob(id="warm"), timedelta(hours=1))

    async def one_task(k: int) -> None:
        for j in range(k, n, 100):
            await service.enqueue_with_delay(AbJob(id=str(j)), timedelta(hours=1))

    await asyncio.gather(*(one_task(k) for k in range(100)))

asyncio.run(produce())
"""


def count(tree: Path, events: int) -> float:
    """Instructions per enqueue of the commit checked out at ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    totals = []
    for n in (events // 10, events):
        out = subprocess.run(
            [
                "valgrind",
                "--tool=cachegrind",
                "--cache-sim=no",
                "--cachegrind-out-file=/dev/null",
                sys.executable,
                "-c",
                CHILD,
                str(n),
            ],
            env=env,
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
        if out.returncode != 0 or found is None:
            raise RuntimeError(f"valgrind failed in {tree}:\n{out.stderr[-2000:]}")
        totals.append(int(found.group(1).replace(",", "")))
    return (totals[1] - totals[0]) / (events - events // 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", default="HEAD~1", help="the baseline commit (default HEAD~1)")
    parser.add_argument("--b", default="HEAD", help="the commit compared with it (default HEAD)")
    parser.add_argument("--events", type=int, default=20_000, help="enqueues (default 20000)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        parser.error("valgrind is needed (apt install valgrind)")
    if args.events < 100:
        parser.error("--events must be at least 100")

    shas, per_event = {}, {}
    with tempfile.TemporaryDirectory(prefix="delayq-producer-path-") as tmp:
        for name in ("a", "b"):
            ref = getattr(args, name)
            shas[name] = subprocess.run(
                ["git", "rev-parse", "--short", ref],
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            tree = Path(tmp) / name
            subprocess.run(
                ["git", "worktree", "add", "--detach", "-q", str(tree), shas[name]],
                cwd=ROOT,
                check=True,
            )
            try:
                per_event[name] = count(tree, args.events)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
            print(
                f"{name}={shas[name]}: {per_event[name]:,.0f} instructions/enqueue", file=sys.stderr
            )
    command = f"python benchmarks/producer_path.py --a {args.a} --b {args.b} --events {args.events}"
    lines = [
        f"Command: `{command}`",
        "",
        "| commit | instructions per enqueue (Redis stubbed out) |",
        "|---|---:|",
    ]
    lines += [f"| {n} = {shas[n]} | {per_event[n]:,.0f} |" for n in ("a", "b")]
    lines += [
        "",
        f"b - a: {per_event['b'] - per_event['a']:+,.0f} instructions per enqueue; "
        f"b/a: {per_event['b'] / per_event['a']:.3f}",
    ]
    text = "\n".join(lines)
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d-%H%M")
    (args.out_dir / f"producer-path-{stamp}.md").write_text(text + "\n")
    (args.out_dir / f"producer-path-{stamp}.json").write_text(
        json.dumps(
            {"command": command, "shas": shas, "instructions_per_enqueue": per_event}, indent=2
        )
    )


if __name__ == "__main__":
    main()
