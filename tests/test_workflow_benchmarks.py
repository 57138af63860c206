"""The workflow benchmarks must not rot: ``benchmarks/batches_bench.py``,
``dependencies_bench.py`` and ``results_bench.py`` run to the end with tiny sizes and
write their JSON. No time is asserted, only that every figure is there and the counts and
memory figures are sane (the scripts assert their own counts: every member handled, every
callback run once).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from delayq.testing import find_redis_server_binary

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    try:
        find_redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(f"needs a redis-server binary: {exc}")


def _run(module: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def test_batches_bench_runs_every_part(tmp_path: Path) -> None:
    out = _run(
        "batches_bench",
        *("--members", "600", "--chunk", "250", "--rounds", "1"),
        *("--inner", "2", "--leaves", "50", "--nested-rounds", "1"),
        *("--memory-members", "300", "--add-members", "300", "--add-chunks", "100,300"),
        *("--add-rounds", "1", "--out", str(tmp_path)),
    )
    (path,) = tmp_path.glob("batches-*.json")
    fig = json.loads(path.read_text())
    big = fig["big"]["median"]
    assert big["members"] == 600
    assert big["members_per_s"] > 0 and big["plain_events_per_s"] > 0
    assert big["worker_cpu_us_per_member"] > 0
    # the callbacks are claimed after the last member's ack, on Redis's clock
    assert big["last_ack_to_on_complete_claim_ms"] >= 0
    assert big["last_ack_to_on_success_claim_ms"] >= 0
    assert fig["nested"]["median"]["inner"] == 2
    assert fig["memory_pending"]["bytes_per_pending_member_beyond_plain"] > 0
    assert fig["memory_finished"]["members_hash_bytes_per_finished_member"] > 0
    assert set(fig["add"]) == {"100", "300"}
    assert fig["command"].startswith("python -m benchmarks.batches_bench")
    assert "| measure | value |" in out


def test_dependencies_bench_rounds(tmp_path: Path) -> None:
    _run(
        "dependencies_bench",
        *("--steps", "3", "--parents", "20", "--children", "50", "--rounds", "2"),
        *("--out", str(tmp_path)),
    )
    (path,) = tmp_path.glob("dependencies-*.json")
    fig = json.loads(path.read_text())
    assert fig["chain_steps"] == 3 and fig["fan_in_parents"] == 20
    assert len(fig["rounds"]) == 2
    assert fig["bytes_per_edge_beyond_a_plain_event"] > 0


def test_results_bench_rounds(tmp_path: Path) -> None:
    _run(
        "results_bench",
        *("--events", "200", "--waits", "5", "--rounds", "2", "--out", str(tmp_path)),
    )
    (path,) = tmp_path.glob("results-*.json")
    fig = json.loads(path.read_text())
    assert len(fig["rounds"]) == 2
    assert fig["wake_p50_ms"] > 0
    assert fig["bytes_per_kept_result"] > 0
