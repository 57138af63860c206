"""``python -m benchmarks``: delayq and its Python peers, side by side, on one fresh Redis.

The harness

1. builds (or reuses) each peer's virtualenv from its pinned requirements
   (``benchmarks/peers/requirements/<name>.txt``, venvs in ``benchmarks/.venvs``);
2. starts its own ``redis-server`` (``delayq.testing.RedisServer``);
3. runs every (library, variant, workload) one at a time as a subprocess
   adapter (``python -m benchmarks.peers.<name> run ...``, see
   ``benchmarks/peers/_common.py`` for the contract), emptying Redis before each;
   the crash-recovery cases, which mostly wait, run last and all at once;
4. writes ``<out>/<stamp>.json`` (summary), ``<out>/raw/<stamp>.json`` (every
   sample), ``<out>/<stamp>.md`` (tables) and PNG plots.

Examples::

    python -m benchmarks                         # everything, full sizes (about an hour)
    python -m benchmarks --quick                 # smaller sizes, same shape
    python -m benchmarks --libraries delayq,arq --workloads lateness,throughput
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import envs, report

ROOT = envs.ROOT
LIBRARIES = ("delayq", "arq", "saq", "bullmq", "rq", "dramatiq", "celery", "taskiq")
WORKLOADS = ("lateness", "sustained", "throughput", "enqueue", "drain", "crash", "memory", "idle")
# workloads a non-default variant (a documented speed-up option) is run with
VARIANT_WORKLOADS = ("lateness", "sustained")

# case name -> (workload, params); {lib} overrides for delayq where the issue asks for more
PROFILES: dict[str, dict[str, Any]] = {
    "full": {
        "lateness": {"n": 5000, "spread": 10.0},
        "sustained": {"rate": 2000.0, "duration": 10.0, "delay": 1.0},
        "throughput": {"n": 100_000, "cap": 60.0},
        "throughput_spread": {"n": 100_000, "spread": 5.0, "cap": 60.0},
        "enqueue": {"n_single": 30_000, "tasks": 100, "n_many": 300_000, "batch": 1000},
        "drain": {"total": 1_000_000, "due": 200_000},
        "crash": {"cap": 330.0},
        "memory": {"n": 100_000},
        "memory_delayq": {"n": 1_000_000},
        "idle": {"types": 20, "duration": 20.0},
    },
    "quick": {
        "lateness": {"n": 1000, "spread": 3.0},
        "sustained": {"rate": 2000.0, "duration": 3.0, "delay": 1.0},
        "throughput": {"n": 10_000, "cap": 20.0},
        "throughput_spread": {"n": 10_000, "spread": 2.0, "cap": 20.0},
        "enqueue": {"n_single": 5000, "tasks": 100, "n_many": 50_000, "batch": 1000},
        "drain": {"total": 100_000, "due": 20_000},
        "crash": {"cap": 60.0},
        "memory": {"n": 20_000},
        "memory_delayq": {"n": 20_000},
        "idle": {"types": 20, "duration": 5.0},
    },
    # the test suite's smoke run: seconds per workload
    "smoke": {
        "lateness": {"n": 200, "spread": 1.0, "min_delay": 0.5},
        "sustained": {"rate": 500.0, "duration": 1.0, "delay": 0.3},
        "throughput": {"n": 2000, "cap": 60.0},
        "throughput_spread": {"n": 2000, "spread": 1.0, "cap": 60.0},
        "enqueue": {"n_single": 1000, "tasks": 20, "n_many": 5000, "batch": 1000},
        "drain": {"total": 6000, "due": 2000, "lead": 0.5},
        "crash": {"cap": 40.0},
        "memory": {"n": 2000},
        "memory_delayq": {"n": 2000},
        "idle": {"types": 3, "duration": 1.0, "settle": 0.5},
    },
}


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[{dt.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def _cases(lib: str, variants: list[str], workloads: list[str], profile: dict[str, Any],
           lib_workloads: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    cases: list[dict[str, Any]] = []
    for variant in variants:

        def add(name: str, workload: str, params: dict[str, Any], variant: str = variant) -> None:
            cases.append(dict(library=lib, variant=variant, name=name, workload=workload,
                              params=dict(params)))  # fmt: skip

        for workload in WORKLOADS:
            if workload not in workloads or workload not in lib_workloads:
                continue
            if variant != "default" and workload not in VARIANT_WORKLOADS:
                continue
            if workload == "throughput":
                add("throughput-1p", workload, {**profile["throughput"], "procs": 1})
                add("throughput-2p", workload, {**profile["throughput"], "procs": 2})
                if lib == "delayq":
                    add("throughput-spread", workload, profile["throughput_spread"])
            elif workload == "memory":
                add("memory", workload, profile["memory_delayq" if lib == "delayq" else "memory"])
            else:
                add(workload, workload, profile[workload])
    return cases


def _adapter_cmd(python: str, lib: str) -> list[str]:
    return [python, "-m", f"benchmarks.peers.{lib}"]


def _run_case(case: dict[str, Any], python: str, url: str, workdir: Path,
              timeout: float) -> subprocess.Popen[bytes]:  # fmt: skip
    out = workdir / "out.json"
    argv = [
        *_adapter_cmd(python, case["library"]), "run", "--workload", case["workload"],
        "--variant", case["variant"], "--redis-url", url, "--out", str(out),
        "--workdir", str(workdir),
    ]  # fmt: skip
    for key, value in case["params"].items():
        argv += ["--param", f"{key}={json.dumps(value)}"]
    log_file = open(workdir / "adapter.log", "wb")
    try:
        return subprocess.Popen(argv, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)
    finally:
        log_file.close()


def _collect(case: dict[str, Any], proc: subprocess.Popen[bytes], workdir: Path,
             timeout: float, started: float) -> dict[str, Any]:  # fmt: skip
    try:
        proc.wait(timeout=max(1.0, started + timeout - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    out = workdir / "out.json"
    if out.exists():
        result = json.loads(out.read_text())
    else:
        tail = (workdir / "adapter.log").read_text(errors="replace")[-3000:]
        result = {
            "library": case["library"], "variant": case["variant"], "workload": case["workload"],
            "label": case["library"] if case["variant"] == "default"
            else f"{case['library']} ({case['variant']})",
            "ok": False, "error": f"adapter exited with {proc.returncode} and no result:\n{tail}",
            "metrics": {}, "samples": {}, "notes": [], "params": case["params"], "versions": {},
        }  # fmt: skip
    result["case"] = case["name"]
    result["load_before"] = case.get("load_before")
    return result


def _timeout(case: dict[str, Any]) -> float:
    p = case["params"]
    if case["workload"] == "crash":
        return p.get("cap", 330) + 300
    if case["workload"] == "lateness":
        return p.get("spread", 10) + 600
    return 1800.0


def _machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }


def _wakeup_cost() -> dict[str, Any]:
    """CPU this machine charges an idle asyncio process that wakes 5 times a second.

    On virtual machines a wake-up can cost milliseconds of accounted CPU, which
    dominates every library's idle-CPU figure; this baseline puts them in scale.
    """
    code = (
        "import asyncio\nasync def m():\n  while True: await asyncio.sleep(0.2)\nasyncio.run(m())"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(1.0)
        t0 = time.monotonic()
        a = int(Path(f"/proc/{proc.pid}/schedstat").read_text().split()[0])
        time.sleep(5.0)
        b = int(Path(f"/proc/{proc.pid}/schedstat").read_text().split()[0])
        pct = 100 * (b - a) / 1e9 / (time.monotonic() - t0)
    except OSError:
        pct = None
    finally:
        proc.kill()
        proc.wait()
    return {"asyncio_loop_waking_5_per_s_cpu_percent": None if pct is None else round(pct, 2)}


def _git() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty_delayq": bool(git("status", "--porcelain",
            "delayq"))}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--libraries",
        default=",".join(LIBRARIES),
        help=f"comma-separated subset of {','.join(LIBRARIES)}",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS)}",
    )
    parser.add_argument(
        "--variants",
        choices=("all", "default"),
        default="all",
        help="also run each peer's labelled speed-up variants (default: all)",
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--quick", action="store_true", help="same as --profile quick")
    parser.add_argument("--lateness-n", type=int, help="events in the lateness workload")
    parser.add_argument("--throughput-n", type=int, help="events in the throughput workload")
    parser.add_argument(
        "--memory-n", type=int, help="events in the memory workload (all libraries)"
    )
    parser.add_argument("--crash-cap", type=float, help="seconds to wait for crash recovery")
    parser.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--stamp", help="file name stem of the outputs (default: today's date)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--redis-server", help="redis-server binary (default: found as in tests)")
    args = parser.parse_args(argv)
    profile_name = "quick" if args.quick else args.profile
    profile = json.loads(json.dumps(PROFILES[profile_name]))
    if args.lateness_n:
        profile["lateness"]["n"] = args.lateness_n
    if args.throughput_n:
        profile["throughput"]["n"] = profile["throughput_spread"]["n"] = args.throughput_n
    if args.memory_n:
        profile["memory"]["n"] = profile["memory_delayq"]["n"] = args.memory_n
    if args.crash_cap:
        profile["crash"]["cap"] = args.crash_cap
    libraries = [x for x in args.libraries.split(",") if x]
    workloads = [x for x in args.workloads.split(",") if x]
    for lib in libraries:
        if lib not in LIBRARIES:
            parser.error(f"unknown library {lib!r}")
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}")
    out_dir = Path(args.out_dir)
    (out_dir / "raw").mkdir(parents=True, exist_ok=True)
    stamp = args.stamp or dt.date.today().isoformat()
    if not args.stamp and (out_dir / f"{stamp}.json").exists():
        stamp = f"{dt.datetime.now():%Y-%m-%d-%H%M}"
    command = "python -m benchmarks" + ("" if argv is None and len(sys.argv) <= 1 else " " +
              shlex.join(sys.argv[1:] if argv is None else argv))  # fmt: skip

    # 1. environments
    pythons: dict[str, str] = {}
    freezes: dict[str, list[str]] = {}
    for lib in libraries:
        if lib == "delayq":
            pythons[lib] = sys.executable
        else:
            pythons[lib] = str(envs.ensure(lib, log=log))
            freezes[lib] = envs.freeze(pythons[lib])
    infos = {}
    for lib in libraries:
        out = subprocess.run([*_adapter_cmd(pythons[lib], lib), "info"], cwd=ROOT,
                             capture_output=True, text=True, check=True)  # fmt: skip
        infos[lib] = json.loads(out.stdout)
    plan: list[dict[str, Any]] = []
    for lib in libraries:
        variants = infos[lib]["variants"] if args.variants == "all" else ["default"]
        plan += _cases(lib, variants, workloads, profile, infos[lib]["workloads"])
    log(f"{len(plan)} cases; profile {profile_name}; outputs {out_dir}/{stamp}.*")

    # 2. one fresh Redis
    import redis as redis_sync

    from delayq.testing import RedisServer

    wakeup = _wakeup_cost()
    started = dt.datetime.now().astimezone()
    results: list[dict[str, Any]] = []
    loads = [os.getloadavg()]
    with (
        tempfile.TemporaryDirectory(prefix="delayq-bench-") as tmp,
        RedisServer(binary=args.redis_server, config={"maxmemory-policy": "noeviction"}) as server,
    ):
        client = redis_sync.Redis.from_url(server.url, decode_responses=True)
        info = client.info("server")
        redis_meta = {
            "version": info["redis_version"],
            "binary": server.binary,
            "allocator": client.info("memory").get("mem_allocator"),
            "config": {k: client.config_get(k).get(k) for k in (
                "save", "appendonly", "maxmemory-policy", "hz", "io-threads")},
        }  # fmt: skip
        log(f"redis {redis_meta['version']} at {server.url}")
        serial = [c for c in plan if c["workload"] != "crash"]
        crash = [c for c in plan if c["workload"] == "crash"]
        for i, case in enumerate(serial, 1):
            workdir = Path(tmp) / f"{i:03d}-{case['library']}-{case['variant']}-{case['name']}"
            workdir.mkdir()
            case["load_before"] = list(os.getloadavg())
            loads.append(os.getloadavg())
            log(f"({i}/{len(plan)}) {case['library']} [{case['variant']}] {case['name']} "
                f"{case['params']}")  # fmt: skip
            t0 = time.monotonic()
            proc = _run_case(case, pythons[case["library"]], server.url, workdir, _timeout(case))
            result = _collect(case, proc, workdir, _timeout(case), t0)
            results.append(result)
            log("    " + report.one_line(result))
        if crash:
            # Crash recovery is mostly waiting for timeouts: all libraries at once,
            # each with its own keys, on one emptied Redis.
            client.flushall()
            log(f"crash recovery: {len(crash)} libraries at once (cap {profile['crash']['cap']} s)")
            running = []
            for case in crash:
                case["params"]["flush"] = False
                workdir = Path(tmp) / f"crash-{case['library']}-{case['variant']}"
                workdir.mkdir()
                case["load_before"] = list(os.getloadavg())
                proc = _run_case(case, pythons[case["library"]], server.url, workdir,
                                 _timeout(case))  # fmt: skip
                running.append((case, proc, workdir, time.monotonic()))
            for case, proc, workdir, t0 in running:
                result = _collect(case, proc, workdir, _timeout(case), t0)
                results.append(result)
                log("    " + report.one_line(result))
        loads.append(os.getloadavg())
        client.close()
    finished = dt.datetime.now().astimezone()

    summary = {
        "command": command,
        "profile": profile_name,
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "machine": {**_machine(), **wakeup},
        "load_average": {
            "before": loads[0],
            "after": loads[-1],
            "max_1min": max(x[0] for x in loads),
            "min_1min": min(x[0] for x in loads),
        },
        "redis": redis_meta,
        "git": _git(),
        "versions": {r["library"]: r.get("versions", {}) for r in results if r.get("versions")},
        "pip_freeze": freezes,
        "results": results,
    }
    raw_path = out_dir / "raw" / f"{stamp}.json"
    raw_path.write_text(json.dumps(summary))
    compact = report.compact(summary)
    json_path = out_dir / f"{stamp}.json"
    json_path.write_text(json.dumps(compact, indent=1))
    plots: list[str] = []
    if not args.no_plots:
        plots = _plots(json_path, out_dir, stamp)
    md_path = out_dir / f"{stamp}.md"
    md_path.write_text(report.markdown(compact, plots=plots))
    log(f"wrote {json_path}, {md_path}, {raw_path}" + (f" and {len(plots)} plots" if plots else ""))
    return 0 if all(r["ok"] for r in results) else 1


def _plots(json_path: Path, out_dir: Path, stamp: str) -> list[str]:
    try:
        python = envs.ensure(envs.PLOT_ENV, log=log)
    except Exception as exc:  # plots are a nicety; the numbers are in the JSON
        log(f"no plots: cannot build the plotting venv ({exc})")
        return []
    proc = subprocess.run(
        [str(python), "-m", "benchmarks.plot", str(json_path), str(out_dir), stamp],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        log(f"plotting failed:\n{proc.stderr[-2000:]}")
        return []
    return [line for line in proc.stdout.splitlines() if line.endswith(".png")]


if __name__ == "__main__":
    sys.exit(main())
