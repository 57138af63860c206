"""``python -m benchmarks.dependencies_bench``: what dependencies cost (issue 33).

Against a fresh private redis-server, one service (scheduler, relay and handlers in one
process, ``scheduling_interval`` 1 s: the wake-ups, not the sweeps, carry each step):

* **chain** — ``--steps`` events, each enqueued ``after=`` the one before, the first due
  at once: the time from one step's handler start to the next one's, per step (median and
  max). A step is an ack, the relay's hand-over (read, apply in the child's slot, clear)
  and the scheduler's move of the released child.
* **fan-in** — ``--parents`` parents due at once, one child ``after=`` all of them: the
  time from the last parent's handler end to the child's handler start.
* **memory** — ``--children`` children each waiting for its own pending parent: Redis's
  ``used_memory`` growth per waiting edge (the child's edge, waiting record and count, the
  parent's link fields; the child's envelope and waiting entry counted separately).

    python -m benchmarks.dependencies_bench                       # 10 steps, 1,000 parents
    python -m benchmarks.dependencies_bench --children 2000       # quicker memory
    python -m benchmarks.dependencies_bench --rounds 5            # medians of 5 chains, fan-ins
    python -m benchmarks.dependencies_bench --out /tmp/figures    # the JSON elsewhere

Prints a table and writes ``benchmarks/results/dependencies-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from delayq import Event, EventService
from delayq.testing import RedisServer

HERE = Path(__file__).resolve().parent


class Link(Event, event_name="bench-dep-link"):
    pass


class Part(Event, event_name="bench-dep-part"):
    pass


class Join(Event, event_name="bench-dep-join"):
    pass


class Lone(Event, event_name="bench-dep-lone"):
    pass


async def _wait(pred: Any, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError("benchmark condition not met")
        await asyncio.sleep(0.001)


async def chain_and_fan_in(url: str, steps: int, parents: int) -> dict[str, Any]:
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}

    async def handle(event: Event) -> None:
        starts[event.id] = time.perf_counter()
        ends[event.id] = time.perf_counter()

    prefix = "b" + uuid.uuid4().hex[:8]
    async with EventService.from_url(url, prefix=prefix, polling_timeout=1.0) as service:
        for t in (Link, Part, Join):
            service.add_handler(t, handle, concurrency=64)
        await service.start()
        await service.enqueue_with_delay(Link(id="l0"), 0.5)
        for i in range(1, steps):
            await service.enqueue_with_delay(Link(id=f"l{i}"), 0, after=[(Link, f"l{i - 1}")])
        await _wait(lambda: f"l{steps - 1}" in starts)
        gaps = [(starts[f"l{i}"] - starts[f"l{i - 1}"]) * 1000 for i in range(1, steps)]
        await service.enqueue_many([Part(id=f"p{i}") for i in range(parents)], 1.0)
        refs = [(Part, f"p{i}") for i in range(parents)]
        await service.enqueue_with_delay(Join(id="j"), 0, after=refs)
        await _wait(lambda: "j" in starts)
        last = max(ends[f"p{i}"] for i in range(parents))
        return {
            "chain_steps": steps,
            "chain_step_ms_median": statistics.median(gaps),
            "chain_step_ms_max": max(gaps),
            "fan_in_parents": parents,
            "fan_in_ms_after_last_parent": (starts["j"] - last) * 1000,
        }


async def memory(url: str, children: int) -> dict[str, Any]:
    client = aioredis.Redis.from_url(url)
    prefix = "m" + uuid.uuid4().hex[:8]
    async with EventService.from_url(url, prefix=prefix, enable_scheduling=False) as service:
        await service.enqueue_many([Part(id=f"p{i:06d}") for i in range(children)], 3600)
        before = int((await client.info("memory"))["used_memory"])
        await service.enqueue_many([Lone(id=f"c{i:06d}") for i in range(children)], 0)
        plain = int((await client.info("memory"))["used_memory"]) - before
        await client.delete(f"{{{prefix}:bench-dep-lone}}:events", f"{{{prefix}:bench-dep-lone}}:ready",
                            f"{{{prefix}:bench-dep-lone}}:queued")  # fmt: skip
        before = int((await client.info("memory"))["used_memory"])
        for i in range(children):
            await service.enqueue_with_delay(Join(id=f"c{i:06d}"), 0, after=[(Part, f"p{i:06d}")])
        grown = int((await client.info("memory"))["used_memory"]) - before
    await client.aclose()
    return {
        "children": children,
        "bytes_per_waiting_child_with_one_edge": grown / children,
        "bytes_per_plain_ready_event": plain / children,
        "bytes_per_edge_beyond_a_plain_event": (grown - plain) / children,
    }


async def main() -> None:
    """Run the benchmarks; print and save the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--parents", type=int, default=1000)
    parser.add_argument("--children", type=int, default=10000)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="chain and fan-in rounds, a fresh server each (medians)",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results", help="where the JSON goes")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rounds = []
    for i in range(args.rounds):
        with RedisServer() as server:
            rounds.append(await chain_and_fan_in(server.url, args.steps, args.parents))
        if args.rounds > 1:
            print(f"round {i + 1}: " + json.dumps({k: round(v, 1) for k, v in rounds[-1].items()}))
    figures: dict[str, Any] = {
        k: v if isinstance(v, int) else statistics.median(r[k] for r in rounds)
        for k, v in rounds[0].items()
    }
    with RedisServer() as server:
        figures |= await memory(server.url, args.children)
    for name, value in figures.items():
        print(f"| {name} | {value:.1f} |" if isinstance(value, float) else f"| {name} | {value} |")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d-%H%M")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"dependencies-{stamp}.json"
    command = " ".join(["python -m benchmarks.dependencies_bench", *sys.argv[1:]])
    extra: dict[str, Any] = {"rounds": rounds} if args.rounds > 1 else {}
    machine = {
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    out.write_text(json.dumps({"command": command, **figures, **extra, **machine}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(main())
