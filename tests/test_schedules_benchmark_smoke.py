"""``benchmarks/schedules.py`` must not rot: a smoke run with tiny sizes (no speed asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_schedules_benchmark_smoke() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.schedules", "--smoke", "--no-write"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = proc.stdout
    for row in ("fire lag p50", "handler lateness", "Redis memory per schedule",
                "one slot shared by all: fired | 500"):  # fmt: skip
        assert row in out, out
