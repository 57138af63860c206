"""benchmarks/observability.py must not rot: a tiny run of every mode (no speed asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from delayq.testing import find_redis_server_binary

ROOT = Path(__file__).resolve().parent.parent


def test_observability_benchmark_runs(tmp_path: Path) -> None:
    try:
        find_redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(f"needs a redis-server binary: {exc}")
    out = tmp_path / "obs.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/observability.py", "--events", "300", "--rounds", "1",
         "--modes", "plain,prometheus,otel,observed,otel-api,observed-api", "--handler", "redis",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(out.read_text())
    assert set(data["best"]) == {
        "plain", "prometheus", "otel", "observed", "otel-api", "observed-api"
    }  # fmt: skip
    assert data["cpu_us_added_median"]["plain"]["cpu_us"] == 0
    assert all(v["cpu_us"] > 0 for v in data["cpu_us_median"].values())
    for rounds in data["rounds"].values():
        (r,) = rounds
        assert r["enqueue_per_s"] > 0 and r["handle_per_s"] > 0 and r["end_to_end_per_s"] > 0
        assert r["redis_commands_per_event"] > 1  # the handler's GET counts too
        assert r["enqueue_cpu_us"] > 0 and r["handle_cpu_us"] > 0
    assert data["spans_exported"] == 2 * 2 * 300  # a send and a process span per event, twice
    assert "| observed |" in proc.stdout


def test_otel_span_cost_script_runs(tmp_path: Path) -> None:
    """benchmarks/otel_span_cost.py (the SDK's cost per span beside delayq's hooks) runs."""
    out = tmp_path / "span-cost.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/otel_span_cost.py", "--n", "50", "--repeat", "1",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(out.read_text())["us_per_call"]
    assert any(k.startswith("sdk: ") for k in figures)
    assert any(k.startswith("delayq: ") for k in figures)
