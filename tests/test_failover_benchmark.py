"""The fault benchmark of issue 9 must not rot: a short run of every scenario.

``python -m benchmarks.failover`` (see benchmarks/RESULTS.md for the full run and its
figures) with a few seconds per scenario. No lateness is asserted here, only what must hold
whatever the machine's speed: nothing lost, no duplicate in a rolling restart, every other
duplicate explained by a killed process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_failover_benchmark_short(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.failover", "--duration", "7", "--every", "3.5",
         "--rate", "100", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    print(proc.stdout)
    (path,) = tmp_path.glob("failover-*.json")
    results = {r["scenario"]: r for r in json.loads(path.read_text())["results"]}
    assert set(results) == {"leader-kill", "rolling", "crash"}, proc.stderr[-3000:]
    for r in results.values():
        assert r["faults"] >= 1 and r["enqueued"] > 0
        assert r["lost"] == 0 and r["handled"] == r["enqueued"], r
        assert r["duplicates_unexplained"] == 0, r
    assert results["rolling"]["duplicate_runs"] == 0, results["rolling"]
