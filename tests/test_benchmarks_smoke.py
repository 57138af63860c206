"""The benchmark harness must not rot: run every delayq workload with tiny sizes.

``python -m benchmarks --libraries delayq --profile smoke`` starts its own
redis-server, runs each workload as a subprocess adapter and writes the JSON
and Markdown outputs. No peer virtualenvs are built here, and no speed is
asserted: only that every workload runs to the end and reports sane numbers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from delayq.testing import find_redis_server_binary

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    """One smoke run of the harness; its compact JSON and Markdown."""
    try:
        find_redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(f"needs a redis-server binary: {exc}")
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--libraries", "delayq", "--profile", "smoke",
         "--out-dir", str(out), "--stamp", "smoke", "--no-plots"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "smoke.json").read_text()), (out / "smoke.md").read_text()


def _case(data: dict, name: str) -> dict:
    (result,) = [r for r in data["results"] if r["case"] == name]
    assert result["ok"], result["error"]
    return result["metrics"]


def test_every_delayq_workload_ran(smoke_run: tuple[dict, str]) -> None:
    data, _ = smoke_run
    cases = {r["case"] for r in data["results"]}
    assert cases == {
        "lateness", "sustained", "throughput-1p", "throughput-2p", "throughput-spread",
        "enqueue", "drain", "crash", "memory", "idle",
    }  # fmt: skip
    assert all(r["ok"] for r in data["results"])
    assert data["redis"]["version"]
    assert data["machine"]["nproc"] >= 1
    assert data["versions"]["delayq"]["delayq"]


def test_lateness_has_every_event_and_none_early(smoke_run: tuple[dict, str]) -> None:
    data, _ = smoke_run
    for case in ("lateness", "sustained"):
        m = _case(data, case)
        assert m["missing"] == 0
        assert m["redis_early"] == 0  # delayq never hands out an event before its due time
        assert m["redis_count"] == m["count"]
    (lateness,) = [r for r in data["results"] if r["case"] == "lateness"]
    assert len(lateness["cdf"]["redis_lateness_ms"]) == 1001


def test_throughput_handles_every_event(smoke_run: tuple[dict, str]) -> None:
    data, _ = smoke_run
    for case in ("throughput-1p", "throughput-2p", "throughput-spread"):
        m = _case(data, case)
        assert m["handled"] == m["n"]
        assert m["rate"] > 0
        assert m["cpu_per_event_us"] > 0


def test_other_workloads_report_their_figures(smoke_run: tuple[dict, str]) -> None:
    data, _ = smoke_run
    enqueue = _case(data, "enqueue")
    assert enqueue["single_rate"] > 0 and enqueue["many_rate"] > 0
    drain = _case(data, "drain")
    assert drain["moves_per_s"] > 0 and drain["script_calls"] >= 1
    crash = _case(data, "crash")
    # recovered through the lease, not before it could have expired
    assert crash["recovery_s"] is not None and crash["recovery_s"] > 1
    memory = _case(data, "memory")
    assert memory["bytes_per_event"] > memory["payload_bytes"]
    idle = _case(data, "idle")
    assert idle["commands_per_s"] >= 0 and idle["types"] == 3


def test_markdown_report(smoke_run: tuple[dict, str]) -> None:
    _, md = smoke_run
    assert md.startswith("Command: `python -m benchmarks --libraries delayq")
    for heading in (
        "## delayq against its targets",
        "## Lateness",
        "## End-to-end throughput",
        "## Crash recovery",
        "## Redis memory",
        "## Idle cost",
        "## Versions",
    ):
        assert heading in md  # fmt: skip


def test_ab_script_compares_two_commits(tmp_path: Path) -> None:
    """benchmarks/ab.py runs both commits' producer and worker and writes its table."""
    try:
        find_redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(f"needs a redis-server binary: {exc}")
    proc = subprocess.run(
        [sys.executable, "benchmarks/ab.py", "--a", "HEAD", "--b", "HEAD", "--events", "300",
         "--rounds", "2", "--out-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "median of per-round ratios" in proc.stdout
    (result,) = tmp_path.glob("ab-*.json")
    data = json.loads(result.read_text())
    assert len(data["runs"]["a"]) == len(data["runs"]["b"]) == 2


def test_ab_script_counts_instructions(tmp_path: Path) -> None:
    """benchmarks/ab.py --count: each commit's worker under valgrind, instructions per event."""
    try:
        find_redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(f"needs a redis-server binary: {exc}")
    if shutil.which("valgrind") is None:
        pytest.skip("needs valgrind (scripts/test.sh installs it with apt where it can)")
    proc = subprocess.run(
        [sys.executable, "benchmarks/ab.py", "--a", "HEAD", "--b", "HEAD", "--events", "200",
         "--count", "--out-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    (result,) = tmp_path.glob("ab-count-*.json")
    per_event = json.loads(result.read_text())["instructions_per_event"]
    # one commit twice: the two counts agree within a few per cent
    assert per_event["a"] > 0 and abs(per_event["b"] / per_event["a"] - 1) < 0.1


def test_producer_path_script_runs_the_enqueues_without_redis() -> None:
    """benchmarks/producer_path.py's child (what it runs under valgrind, for each commit):
    the stubs still fit the store, so its enqueues run to the end without Redis (one that
    reached Redis would fail: nothing listens on its port)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import producer_path
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    proc = subprocess.run(
        [sys.executable, "-c", producer_path.CHILD, "2000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_scale_script_runs_small(tmp_path: Path) -> None:
    """benchmarks/scale.py with tiny sizes: timers, a burst and probes all accounted for."""
    try:
        find_redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(f"needs a redis-server binary: {exc}")
    # --lead 6: the burst's producer process (spawned, importing delayq) and its 2000
    # enqueues must finish a second before it; 3 s was too little in loaded CI lanes
    proc = subprocess.run(
        [sys.executable, "benchmarks/scale.py", "--timers", "2000", "--burst", "2000",
         "--probes", "20", "--producers", "1", "--lead", "6", "--out-dir", str(tmp_path),
         "--tmp", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    (result,) = tmp_path.glob("scale-*.json")
    data = json.loads(result.read_text())
    assert data["bytes_per_timer"] > 0
    assert data["burst_move_rate"] > 0
    assert data["probe_late_p99_ms"] is not None
    assert data["burst_handle_rate"] > 0 and data["ping_rtt_max_ms"] is not None


def test_script_cost_runs_small(tmp_path: Path) -> None:
    """benchmarks/script_cost.py with tiny sizes: Redis CPU per call of each script."""
    try:
        find_redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(f"needs a redis-server binary: {exc}")
    proc = subprocess.run(
        [sys.executable, "benchmarks/script_cost.py", "--sizes", "8,16", "--calls", "5",
         "--events", "200", "--out-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    (result,) = tmp_path.glob("script-cost-*.json")
    rows = json.loads(result.read_text())["rows"]
    assert [r["size"] for r in rows] == [8, 16]
    assert all(r["claim_cpu_ms"] >= 0 and r["move_due_cpu_ms"] >= 0 for r in rows)


def test_hotpath_profile_runs_small() -> None:
    """benchmarks/hotpath_profile.py handles every event and prints its CPU per event."""
    proc = subprocess.run(
        [sys.executable, "benchmarks/hotpath_profile.py", "--events", "300", "--cprofile"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "300 events:" in proc.stdout and "µs CPU per event" in proc.stdout
    assert "total calls:" in proc.stdout


def test_flow_benchmark_runs_small(tmp_path: Path) -> None:
    """benchmarks/flow.py with tiny sizes: every throughput, the failing handlers and a
    partitioned type, each handles all its events (the claim and idle parts are slow)."""
    try:
        find_redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(f"needs a redis-server binary: {exc}")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.flow", "--events", "300", "--fail-events", "50",
         "--only", "throughput,partitioned,failing", "--out-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    (result,) = tmp_path.glob("flow-*.json")
    data = json.loads(result.read_text())
    assert len(data["throughput"]) == 3 and len(data["partitioned"]) == 4
    assert all(v > 0 for v in data["failing"].values())


def test_flow_keys_benchmark_runs_small(tmp_path: Path) -> None:
    """benchmarks/flow_keys.py with tiny sizes: every case handled and timed."""
    try:
        find_redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(f"needs a redis-server binary: {exc}")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.flow_keys", "--events", "300", "--keys", "20",
         "--rounds", "1", "--calls", "20", "--out-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    (result,) = tmp_path.glob("flow-keys-*.json")
    data = json.loads(result.read_text())
    assert set(data["throughput"]) == {"no keys", "one key", "20 keys",
                                       "20 keys, per_key_concurrency=1"}  # fmt: skip
    assert all(v > 0 for v in data["throughput"].values())
    assert all(v > 0 for v in data["claim_us"].values())
