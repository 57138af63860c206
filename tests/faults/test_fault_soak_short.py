"""A short run of ``scripts/soak.py``: 12 s of events or more, until every kind of fault was
injected once (``--min-faults``: a loaded machine takes longer per fault, never fewer kinds).

The full run (10+ minutes, 200k+ events) is documented in docs/RELIABILITY.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"


def test_short_soak_loses_nothing(tmp_path):
    out = tmp_path / "soak.json"
    args = (
        "--duration 12 --min-faults 5 --cycle --workers 3 --rate 150 --max-delay 5 "
        "--fault-every 1.5 2.5 --drain-timeout 90 --seed 7 --quiet"
    ).split()
    proc = subprocess.run(
        [sys.executable, str(SOAK), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    r = report["reconciliation"]
    print(
        f"short soak: enqueued={r['enqueued']} handled={r['handled']} dead={r['dead']} "
        f"lost={r['lost']} extra_runs={r['extra_runs']} (explained {r['explained']}) "
        f"faults={report['faults']} stalls={report['stall_after_fault_s']}"
    )
    assert r["lost"] == 0, report
    assert r["unexplained"] == 0, report
    assert r["still_queued"] == 0
    assert report["unexpected_dead"] == 0, report["unexpected_dead_sample"]
    assert r["enqueued"] == r["handled"] + r["dead"]
    assert set(report["faults"]) == {  # every kind of fault at least once
        "kill-worker",
        "client-kill",
        "redis-restart",
        "freeze-leader",
        "idle-timeout",
    }
    assert proc.returncode == 0
