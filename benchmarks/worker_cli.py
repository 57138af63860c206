"""Throughput of ``delayq worker``: 1 vs 2 processes (``--processes``), uvloop on and off.

For each configuration: a fresh private redis-server, the worker started as a real
process (``python -m delayq worker benchmarks.cli_bench_app:service``) and waited for
through its ``/readyz``; then N due events are enqueued with ``enqueue_many`` and the
clock runs until every one has been handled and acked (the type's counts are all 0).
The rate is N / that time, best of ``--repeat`` runs. Prints a table and writes
``benchmarks/results/worker-cli-<stamp>.{json,md}``.

    python benchmarks/worker_cli.py --events 100000 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cli_bench_app import BenchJob  # noqa: E402
from delayq import EventService  # noqa: E402
from delayq.cli.health import http_get  # noqa: E402
from delayq.testing import RedisServer, free_port  # noqa: E402


async def one_run(url: str, prefix: str, processes: int, uvloop: bool, events: int) -> float:
    port = free_port()
    env = dict(os.environ, REDIS_URL=url, DELAYQ_PREFIX=prefix, PYTHONPATH=str(ROOT))
    args = [sys.executable, "-m", "delayq", "worker", "benchmarks.cli_bench_app:service",
            "--processes", str(processes), "--uvloop" if uvloop else "--no-uvloop",
            "--health-port", str(port), "--health-host", "127.0.0.1", "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL)  # noqa: ASYNC220 (returns at once)
    producer = EventService.from_url(url, prefix=prefix, enable_scheduling=False)
    try:
        deadline = time.monotonic() + 60
        while (await http_get("127.0.0.1", port, "/readyz"))[0] != 200:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the worker did not become ready")
            await asyncio.sleep(0.05)
        start = time.perf_counter()
        await producer.enqueue_many(BenchJob(id=str(i)) for i in range(events))
        while True:
            c = await producer.stats_for(BenchJob)
            if c.scheduled + c.ready + c.in_flight == 0:
                break
            await asyncio.sleep(0.01)
        return events / (time.perf_counter() - start)
    finally:
        await producer.aclose()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    configs = [(1, False), (1, True), (2, False), (2, True)]
    results = []
    for processes, uvloop in configs:
        rates = []
        for n in range(args.repeat):
            with RedisServer() as server:
                rates.append(await one_run(server.url, f"b{n}", processes, uvloop, args.events))
        results.append({"processes": processes, "uvloop": uvloop, "best": max(rates),
                        "runs": [round(r) for r in rates]})  # fmt: skip
        print(f"processes={processes} uvloop={uvloop}: {max(rates):,.0f}/s", file=sys.stderr)
    base = {(r["processes"], r["uvloop"]): r["best"] for r in results}
    lines = [
        f"Command: `python benchmarks/worker_cli.py --events {args.events} --repeat {args.repeat}`",
        "",
        "| processes | event loop | handled/s (best) | runs | vs 1 process, same loop |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        ratio = r["best"] / base[(1, r["uvloop"])]
        lines.append(
            f"| {r['processes']} | {'uvloop' if r['uvloop'] else 'asyncio'} | {r['best']:,.0f} | "
            f"{', '.join(f'{x:,}' for x in r['runs'])} | ×{ratio:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    stamp = time.strftime("%Y-%m-%d-%H%M")
    out = ROOT / "benchmarks" / "results"
    (out / f"worker-cli-{stamp}.md").write_text(table + "\n")
    (out / f"worker-cli-{stamp}.json").write_text(
        json.dumps({"events": args.events, "repeat": args.repeat, "results": results}, indent=2)
    )


if __name__ == "__main__":
    asyncio.run(main())
