"""Plain delivery throughput of two commits, alternated in one run.

For each round and each commit (in alternating order, A B, then B A, ...): a fresh private
redis-server; N due events enqueued by a producer process running that commit's code; then a
fresh single-process worker running that commit's code (no metrics, tracing, groups or
partitions) handles them with a no-op handler. The worker reports the wall time from its start
to the last handler and the CPU its process used in that time. Each commit is checked out into
a temporary worktree (``git worktree add --detach``), so any two commits of this repository
can be compared, e.g. ``main`` against the commit before a change:

    python benchmarks/ab.py --a d58e710 --b main --events 30000 --rounds 5

Prints a table (events/s and CPU µs per event for every run, the medians, and the median of
the per-round ratios B/A) and writes ``benchmarks/results/ab-<stamp>.{json,md}``.

``--count`` measures what does not depend on the machine's load instead: the worker's
instructions per event under valgrind (``cachegrind``, no cache simulation), run once at
``--events`` and once at a tenth of it, so start-up and imports cancel out. It reads a
difference of 1-2 % where the timed rounds swing by ±30 % on a busy machine (runs of one
commit agree within about 1 %); valgrind runs the worker some 50 times slower::

    python benchmarks/ab.py --a d58e710 --b main --events 20000 --count

``--side producer`` measures the other end instead: N single ``enqueue_with_delay`` calls
awaited from 100 tasks (the web app's path), timed or counted the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from delayq.testing import RedisServer  # noqa: E402

# Runs in a child process against the commit's own code: only API every commit since the
# first release has (from_url, add_handler, enqueue_many, enqueue_with_delay, async with).
CHILD = r"""
import asyncio, json, sys, time
from datetime import timedelta
from delayq import Event, EventService

class AbJob(Event, event_name="ab-job"):
    pass

mode, url, n, conc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

async def fill() -> None:
    service = EventService.from_url(url, prefix="ab", enable_scheduling=False)
    for i in range(0, n, 1000):
        await service.enqueue_many([AbJob(id=str(j)) for j in range(i, min(n, i + 1000))])
    await service.aclose()

async def work() -> None:
    done = asyncio.Event()
    count = 0

    async def handle(event: AbJob) -> None:
        nonlocal count
        count += 1
        if count >= n:
            done.set()

    service = EventService.from_url(url, prefix="ab")
    service.add_handler(AbJob, handle, concurrency=conc)
    t0, c0 = time.perf_counter(), time.process_time()
    async with service:
        await asyncio.wait_for(done.wait(), 900)
        t1, c1 = time.perf_counter(), time.process_time()
    print(json.dumps({"seconds": t1 - t0, "cpu": c1 - c0}))

async def produce() -> None:
    # single awaited enqueues from 100 tasks (the web app's path), due in an hour
    service = EventService.from_url(url, prefix="ab", enable_scheduling=False)
    await service.enqueue_with_delay(AbJob(id="warm"), timedelta(hours=1))

    async def one_task(k: int) -> None:
        for j in range(k, n, 100):
            await service.enqueue_with_delay(AbJob(id=str(j)), timedelta(hours=1))

    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one_task(k) for k in range(100)))
    t1, c1 = time.perf_counter(), time.process_time()
    await service.aclose()
    print(json.dumps({"seconds": t1 - t0, "cpu": c1 - c0}))

asyncio.run({"fill": fill, "work": work, "produce": produce}[mode]())
"""


def _run(tree: Path, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("REDIS_URL", None)
    out = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, cwd=tree,
                         capture_output=True, text=True, timeout=1200)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"child failed in {tree}:\n{out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def one(tree: Path, events: int, concurrency: int, side: str = "worker") -> dict[str, float]:
    """Fill a fresh server with the commit's producer, then time its worker; or (``side``
    ``producer``) time the commit's producer making single awaited enqueues."""
    with RedisServer() as server:
        if side == "producer":
            result = json.loads(_run(tree, "produce", server.url, str(events), str(concurrency)))
            return {"rate": events / result["seconds"], "cpu_us": result["cpu"] / events * 1e6}
        _run(tree, "fill", server.url, str(events), str(concurrency))
        result = json.loads(_run(tree, "work", server.url, str(events), str(concurrency)))
    return {"rate": events / result["seconds"], "cpu_us": result["cpu"] / events * 1e6}


def count(tree: Path, events: int, concurrency: int, side: str = "worker") -> float:
    """The worker's (or producer's) instructions per event: valgrind at ``events`` and at
    a tenth of it."""
    totals = []
    mode = "produce" if side == "producer" else "work"
    for n in (events // 10, events):
        with RedisServer() as server:
            if mode == "work":
                _run(tree, "fill", server.url, str(n), str(concurrency))
            env = dict(os.environ, PYTHONPATH=str(tree))
            env.pop("REDIS_URL", None)
            out = subprocess.run(
                ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                 sys.executable, "-c", CHILD, mode, server.url, str(n), str(concurrency)],
                env=env, cwd=tree, capture_output=True, text=True, timeout=3600,
            )  # fmt: skip
            found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
            if out.returncode != 0 or found is None:
                raise RuntimeError(f"valgrind failed in {tree}:\n{out.stderr[-2000:]}")
            totals.append(int(found.group(1).replace(",", "")))
    return (totals[1] - totals[0]) / (events - events // 10)


def main_count(args: argparse.Namespace, shas: dict[str, str], trees: dict[str, Path]) -> None:
    """``--count``: instructions per event of each commit's worker, a table and a JSON."""
    per_event = {}
    for name in ("a", "b"):
        per_event[name] = count(trees[name], args.events, args.concurrency, args.side)
        print(f"{name}={shas[name]}: {per_event[name] / 1000:.1f} k instructions/event",
              file=sys.stderr)  # fmt: skip
    command = (f"python benchmarks/ab.py --a {args.a} --b {args.b} --events {args.events} "
               f"--concurrency {args.concurrency} --side {args.side} --count")  # fmt: skip
    lines = [f"Command: `{command}`", "", f"| commit | instructions per event ({args.side}) |",
             "|---|---:|"]  # fmt: skip
    lines += [f"| {n} = {shas[n]} | {per_event[n] / 1000:,.1f} k |" for n in ("a", "b")]
    lines += ["", f"b/a instructions per event: {per_event['b'] / per_event['a']:.3f}"]
    text = "\n".join(lines)
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d-%H%M")
    (args.out_dir / f"ab-count-{stamp}.md").write_text(text + "\n")
    (args.out_dir / f"ab-count-{stamp}.json").write_text(json.dumps(
        {"command": command, "shas": shas, "instructions_per_event": per_event}, indent=2))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", default="HEAD~1", help="the baseline commit (default HEAD~1)")
    parser.add_argument("--b", default="HEAD", help="the commit compared with it (default HEAD)")
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--side", choices=("worker", "producer"), default="worker",
                        help="worker: handle N due events (default); producer: N single "
                        "awaited enqueue_with_delay calls from 100 tasks")  # fmt: skip
    parser.add_argument("--count", action="store_true",
                        help="instructions per event under valgrind instead of timed rounds")  # fmt: skip
    args = parser.parse_args()
    if args.count and shutil.which("valgrind") is None:
        parser.error("--count needs valgrind (apt install valgrind)")
    if args.count and args.events < 100:
        parser.error("--count needs --events of at least 100")

    shas = {}
    for name in ("a", "b"):
        ref = getattr(args, name)
        shas[name] = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout.strip()  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory(prefix="delayq-ab-") as tmp:
        trees = {}
        for name, sha in shas.items():
            trees[name] = Path(tmp) / name
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(trees[name]), sha],
                           cwd=ROOT, check=True)  # fmt: skip
        try:
            if args.count:
                main_count(args, shas, trees)
                return
            for r in range(args.rounds):
                order = ("a", "b") if r % 2 == 0 else ("b", "a")
                for name in order:
                    res = one(trees[name], args.events, args.concurrency, args.side)
                    runs[name].append(res)
                    print(f"round {r + 1} {name}={shas[name]}: {res['rate']:,.0f}/s, "
                          f"{res['cpu_us']:.1f} µs CPU/event", file=sys.stderr)  # fmt: skip
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)

    ratios = [b["rate"] / a["rate"] for a, b in zip(runs["a"], runs["b"])]
    cpu_ratios = [b["cpu_us"] / a["cpu_us"] for a, b in zip(runs["a"], runs["b"])]
    command = (f"python benchmarks/ab.py --a {args.a} --b {args.b} --events {args.events} "
               f"--rounds {args.rounds} --concurrency {args.concurrency} --side {args.side}")  # fmt: skip
    lines = [f"Command: `{command}`", "",
             "| commit | events/s per round | median | CPU µs/event per round | median |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name in ("a", "b"):
        rates = [x["rate"] for x in runs[name]]
        cpus = [x["cpu_us"] for x in runs[name]]
        lines.append(f"| {name} = {shas[name]} | {', '.join(f'{x:,.0f}' for x in rates)} | "
                     f"{statistics.median(rates):,.0f} | {', '.join(f'{x:.1f}' for x in cpus)} | "
                     f"{statistics.median(cpus):.1f} |")  # fmt: skip
    lines += ["", f"b/a throughput, median of per-round ratios: {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f}–{max(ratios):.3f})",
              f"b/a CPU per event, median of per-round ratios: {statistics.median(cpu_ratios):.3f} "
              f"(range {min(cpu_ratios):.3f}–{max(cpu_ratios):.3f})"]  # fmt: skip
    text = "\n".join(lines)
    print(text)
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d-%H%M")
    (out / f"ab-{stamp}.md").write_text(text + "\n")
    (out / f"ab-{stamp}.json").write_text(json.dumps(
        {"command": command, "shas": shas, "runs": runs, "ratios": ratios,
         "cpu_ratios": cpu_ratios}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
