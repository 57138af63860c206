"""``python -m benchmarks.servers`` runs end to end (tiny cases, one server, one round)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_servers_benchmark_smoke(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.servers", "--servers", "redis", "--rounds", "1",
         "--profile", "smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| server | lateness p50" in result.stdout
    (summary,) = tmp_path.glob("servers-*.json")
    (row,) = json.loads(summary.read_text())["rounds"]
    assert row["lateness"]["p50_ms"] >= 0 and row["throughput"]["rate"] > 0
    assert row["throughput"]["server_cpu_per_event_us"] > 0
