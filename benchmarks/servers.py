"""``python -m benchmarks.servers``: delayq on Redis and on Valkey, in one run.

What switching servers costs: the same delayq adapter (``benchmarks/peers/delayq.py``, the
shared workloads of ``benchmarks/peers/_common.py``) runs the ``lateness`` and ``throughput``
workloads against a fresh private server of each kind, in alternating order over several
rounds (A B, B A, ...) so that a change in the machine's load hits both. Besides the adapter's
figures (lateness p50/p99, events/s, the worker's CPU per event) it reads the server process's
own CPU time (``/proc/<pid>/stat``) before and after each case: server CPU per event is the
steadiest figure on a shared machine.

Servers are named as for ``delayq.testing`` (``redis``, ``valkey8``, ``valkey9``, a path).
Prints a table (medians over the rounds) and writes ``<out>/servers-<stamp>.json`` and ``.md``.

Examples::

    python -m benchmarks.servers                          # redis vs valkey9, 3 rounds
    python -m benchmarks.servers --servers redis,valkey8,valkey9 --rounds 2 --profile quick
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from delayq.testing import RedisServer

ROOT = Path(__file__).resolve().parent.parent
CASES: dict[str, dict[str, dict[str, Any]]] = {
    "full": {
        "lateness": {"n": 3000, "spread": 5.0},
        "throughput": {"n": 30_000, "cap": 60.0},
    },
    # the test suite's smoke run (tests/test_servers_benchmark.py)
    "smoke": {
        "lateness": {"n": 100, "spread": 0.5, "min_delay": 0.3},
        "throughput": {"n": 1000, "cap": 30.0},
    },
    "quick": {
        "lateness": {"n": 1000, "spread": 3.0},
        "throughput": {"n": 10_000, "cap": 30.0},
    },
}
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def _run(workload: str, params: dict[str, Any], url: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="delayq-bench-") as work:
        out = Path(work) / "out.json"
        argv = [sys.executable, "-m", "benchmarks.peers.delayq", "run", "--workload", workload,
                "--variant", "default", "--redis-url", url, "--out", str(out), "--workdir", work]  # fmt: skip
        for key, value in params.items():
            argv += ["--param", f"{key}={json.dumps(value)}"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}  # fmt: skip
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        if not out.exists():
            raise RuntimeError(
                f"{workload} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        result: dict[str, Any] = json.loads(out.read_text())
    if not result.get("ok"):
        raise RuntimeError(f"{workload} failed: {result.get('error')}")
    return result


def _one(server_name: str, cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    with RedisServer(binary=server_name, config={"maxmemory-policy": "noeviction"}) as server:
        assert server.pid is not None
        row: dict[str, Any] = {"server": server_name, "label": server.label}
        for workload, params in cases.items():
            before = _cpu_s(server.pid)
            result = _run(workload, params, server.url)
            spent = _cpu_s(server.pid) - before
            m = result["metrics"]
            n = m.get("handled") or m.get("count") or params["n"]
            row[workload] = {
                **{
                    k: m[k]
                    for k in (
                        "p50_ms",
                        "p99_ms",
                        "max_ms",
                        "redis_p50_ms",
                        "redis_p99_ms",
                        "rate",
                        "cpu_per_event_us",
                    )
                    if k in m
                },
                "server_cpu_per_event_us": round(spent / n * 1e6, 1),
            }
        return row


def _median(rows: list[dict[str, Any]], workload: str, key: str) -> float | None:
    values = [r[workload][key] for r in rows if key in r.get(workload, {})]
    return round(statistics.median(values), 1) if values else None


def table(rounds: list[dict[str, Any]], servers: list[str]) -> str:
    """The markdown table: medians over the rounds, one row per server."""
    lines = [
        "| server | lateness p50 / p99 (ms) | on Redis's clock p50 / p99 (ms) | throughput (events/s) "
        "| worker CPU/event (µs) | server CPU/event (µs): lateness run, throughput run |",
        "|---|---|---|---|---|---|",
    ]
    for name in servers:
        rows = [r for r in rounds if r["server"] == name]

        def m(workload: str, key: str, rows: list[dict[str, Any]] = rows) -> float | None:
            return _median(rows, workload, key)

        lines.append(
            f"| {rows[0]['label']} | {m('lateness', 'p50_ms')} / {m('lateness', 'p99_ms')} | "
            f"{m('lateness', 'redis_p50_ms')} / {m('lateness', 'redis_p99_ms')} | "
            f"{m('throughput', 'rate')} | {m('throughput', 'cpu_per_event_us')} | "
            f"{m('lateness', 'server_cpu_per_event_us')}, "
            f"{m('throughput', 'server_cpu_per_event_us')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print the table; write the results."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.servers", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--servers", default="redis,valkey9", help="comma-separated server names or paths"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", choices=sorted(CASES), default="full", help="case sizes")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    cases = CASES[args.profile]
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        order = servers if i % 2 == 0 else servers[::-1]
        for name in order:
            t0 = time.monotonic()
            row = _one(name, cases)
            row["round"] = i + 1
            rounds.append(row)
            print(f"round {i + 1} {row['label']}: {json.dumps({w: row[w] for w in cases})} "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)  # fmt: skip
    md = table(rounds, servers)
    print(md)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d-%H%M")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.servers " + " ".join(argv if argv is not None else sys.argv[1:])
    summary = {"command": command.strip(), "cases": cases, "rounds": rounds,
               "loadavg": os.getloadavg(), "cpus": os.cpu_count()}  # fmt: skip
    (out / f"servers-{stamp}.json").write_text(json.dumps(summary, indent=1))
    (out / f"servers-{stamp}.md").write_text(f"`{summary['command']}`\n\n{md}\n")
    print(f"wrote {out / f'servers-{stamp}.json'} and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
