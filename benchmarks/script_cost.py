"""Redis's own time for one ``move_due``, ``claim`` and ``ack`` call, by batch size (and for
one ``enqueue`` call of ``ENQUEUE_CHUNK`` events, the same in every row).

A script blocks every other client of the Redis while it runs, so the batch
sizes of the scheduler and the consumers bound how long another client may
wait. For each size, ``--calls`` calls of each script run against a private
redis-server holding ``--events`` events of one type: Redis's own CPU time per
call (``INFO cpu``, main thread) is the script's cost, whatever else runs on
the machine; the longest call (``SLOWLOG``, calls over 1 ms) adds this
machine's scheduling noise.

    python benchmarks/script_cost.py --sizes 64,128,256,500,1000

Prints a table and writes ``benchmarks/results/script-cost-<stamp>.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from benchmarks.scale import calls_by_name  # noqa: E402
from delayq import Event, EventService  # noqa: E402
from delayq.storage.store import ENQUEUE_CHUNK  # noqa: E402
from delayq.testing import RedisServer  # noqa: E402

PREFIX = "cost"


class CostEvent(Event, event_name="cost-event"):
    """A due event with a 100-byte payload."""

    payload: str = ""


def server_cpu(r: redis.Redis) -> float:
    """CPU seconds Redis's main thread has used (user + system): unlike wall time, not
    inflated when the machine's other work takes the CPU from it."""
    info = r.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


async def measure(url: str, sizes: list[int], calls: int, events: int) -> list[dict[str, Any]]:
    """Per size: Redis's CPU time and the longest call of move_due, claim and ack."""
    r = redis.Redis.from_url(url)
    service = EventService.from_url(url, prefix=PREFIX, enable_scheduling=False)
    store = service.store
    name = CostEvent.event_name
    rows: list[dict[str, Any]] = []
    try:
        for size in sizes:
            need = max(events, size * calls)
            r.flushall()
            r.slowlog_reset()
            cpu0 = server_cpu(r)
            for i in range(0, need, 5000):
                batch = [CostEvent(id=f"e{j}", payload="x" * 100)
                         for j in range(i, min(need, i + 5000))]  # fmt: skip
                await service.enqueue_many(batch, 0.05)  # scheduled, due in 50 ms
            # enqueue_many sends ENQUEUE_CHUNK events per script call, whatever the size
            cpu = server_cpu(r) - cpu0
            slow = calls_by_name(r.slowlog_get(1_000_000)).get("enqueue", [])
            row: dict[str, Any] = {"size": size}
            row["enqueue_cpu_ms"] = round(cpu * 1000 * ENQUEUE_CHUNK / need, 3)
            row["enqueue_cpu_us_per_entry"] = round(cpu * 1e6 / need, 2)
            row["enqueue_max_ms"] = round(max(slow), 2) if slow else "<1"
            await asyncio.sleep(0.1)
            claimed_all: list[Any] = []

            async def move(size: int = size) -> None:
                await store.scheduling.move_due(name, size, 60_000, 10)

            async def claim(size: int = size, out: list[Any] = claimed_all) -> None:
                out.append((await store.deliveries.claim(name, [], size, 60_000))[1])

            async def ack(out: list[Any] = claimed_all) -> None:
                claimed = out.pop()
                await store.deliveries.ack(name, [(c.raw_id, c.token) for c in claimed])

            for script, call in (("move_due", move), ("claim", claim), ("ack", ack)):
                r.slowlog_reset()
                cpu0 = server_cpu(r)
                for _ in range(calls):
                    await call()
                cpu = server_cpu(r) - cpu0
                slow = calls_by_name(r.slowlog_get(1_000_000)).get(script, [])
                row[f"{script}_cpu_ms"] = round(cpu * 1000 / calls, 3)
                row[f"{script}_cpu_us_per_entry"] = round(cpu * 1e6 / calls / size, 2)
                row[f"{script}_max_ms"] = round(max(slow), 2) if slow else "<1"
            rows.append(row)
            print(row, flush=True)
    finally:
        await service.aclose()
        r.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="32,64,128,256,500,1000")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--events", type=int, default=100_000,
                        help="events stored while measuring (at least sizes x calls)")  # fmt: skip
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    config = {"slowlog-log-slower-than": "1000", "slowlog-max-len": "1000000"}
    with RedisServer(config=config) as server:
        rows = asyncio.run(measure(server.url, sizes, args.calls, args.events))
    command = (f"python benchmarks/script_cost.py --sizes {args.sizes} --calls {args.calls} "
               f"--events {args.events}")  # fmt: skip
    cols = ["size"] + [f"{s}_{k}" for s in ("move_due", "claim", "ack", "enqueue")
                       for k in ("cpu_ms", "cpu_us_per_entry", "max_ms")]  # fmt: skip
    lines = [f"Command: `{command}` (load average {os.getloadavg()[0]:.1f})", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]  # fmt: skip
    lines += ["| " + " | ".join(str(row[c]) for c in cols) + " |" for row in rows]
    text = "\n".join(lines)
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d-%H%M")
    (args.out_dir / f"script-cost-{stamp}.md").write_text(text + "\n")
    (args.out_dir / f"script-cost-{stamp}.json").write_text(
        json.dumps({"command": command, "rows": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
