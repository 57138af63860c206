"""What knowing the running deliveries costs a consumer per event (for the dashboard's
in-flight "running for" and "worker" columns).

The consumer keeps ``claim token -> (id, claim time)`` of each running handler: one
dict insert when it claims an event, one removal when the handler ends. This times
that pair next to the lease bookkeeping the consumer already did per event (a set
insert and removal of ``(shard, id, token)``), in CPU time per event
(``time.process_time``), best of ``--repeat`` loops of ``--n`` events, alternating
the two in one process so a busy machine affects both alike.

Prints a table and writes ``benchmarks/results/running-cost-<time>.json``::

    python -m benchmarks.running_cost
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path


def _per_event(body: Callable[[int], None], n: int) -> float:
    start = time.process_time()
    body(n)
    return (time.process_time() - start) / n * 1e9


def _started(n: int) -> None:
    started: dict[bytes, tuple[bytes, int]] = {}
    tokens = [str(i).encode() for i in range(64)]
    raw_id = b"order-000042"
    for i in range(n):
        token = tokens[i & 63]
        started[token] = (raw_id, 1_764_100_000_000_000 + i)
        started.pop(token, None)


def _leased(n: int) -> None:
    leased: set[tuple[str, bytes, bytes]] = set()
    tokens = [str(i).encode() for i in range(64)]
    raw_id = b"order-000042"
    for i in range(n):
        lease = ("bench", raw_id, tokens[i & 63])
        leased.add(lease)
        leased.discard(lease)


def _loop(n: int) -> None:
    tokens = [str(i).encode() for i in range(64)]
    for i in range(n):
        tokens[i & 63]


def main() -> None:
    """Time both, print the table, write the JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    best = {"loop": float("inf"), "started": float("inf"), "leased": float("inf")}
    for _ in range(args.repeat):
        for name, body in (("loop", _loop), ("started", _started), ("leased", _leased)):
            best[name] = min(best[name], _per_event(body, args.n))
    rows = [
        ("running deliveries (dict insert + pop)", best["started"] - best["loop"]),
        ("existing lease set (add + discard), for scale", best["leased"] - best["loop"]),
    ]
    print("| per event | CPU ns |\n|---|---|")
    for label, ns in rows:
        print(f"| {label} | {ns:.0f} |")
    out = Path(__file__).parent / "results"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    (out / f"running-cost-{stamp}.json").write_text(json.dumps({
        "n": args.n, "repeat": args.repeat, "python": platform.python_version(),
        "ns_per_event": dict(rows), "best_raw_ns": best,
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
