"""``python -m benchmarks.priorities``: what priority levels cost and what they buy (issue 34).

Against a fresh private redis-server:

* **insert script time**: Redis's own time per ``enqueue`` call (``SLOWLOG`` with a 0 µs
  threshold: every command with its duration, the enqueue's EVALSHA picked by its SHA),
  one event at level 0 and one at level 5 per call, with 0, 100,000 and 1,000,000 events
  already ready at level 9 (the backlog is written by a Lua loop, not enqueued: seconds,
  not minutes).
* **throughput**: ``--events`` events due now, handled by one process (no-op handler,
  concurrency 64), all at level 0 (no level ever used) and spread over the 10 levels.
* **urgent lateness**: ``--workers`` worker processes (no-op handler, concurrency 32 each)
  busy with a backlog of ``--backlog`` ready events at level 9, while a producer enqueues
  ``--probes`` events at level 0, due now, one every 20 ms; each probe's lateness is its
  claim time minus its due time, both on Redis's clock (``current_delivery()``). The same
  probes against an empty queue are the baseline.

    python -m benchmarks.priorities                       # defaults: 1,000,000 backlog
    python -m benchmarks.priorities --backlog 100000 --probes 100   # quick

Prints a table and writes ``benchmarks/results/priorities-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from delayq import Event, EventService, lua
from delayq.codec import Codec
from delayq.keys import TypeKeys
from delayq.testing import RedisServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# Writes `count` events ready at one level straight into a type's keys, as the scripts
# would (envelope, level, ready entry, queued score, push counter), `chunk` per call.
_FILL = """
local n0, count, level, span = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
  1099511627776
local env, now = ARGV[4], ARGV[5]
local field = level == 0 and 'pushed' or ('pushed:' .. level)
local seq = redis.call('HINCRBY', KEYS[3], field, count) - count
local envs, prios, entries, scored = {}, {}, {}, {}
for i = 1, count do
  local id = 'bg-' .. (n0 + i)
  envs[#envs + 1] = id; envs[#envs + 1] = env
  prios[#prios + 1] = id; prios[#prios + 1] = level
  entries[i] = now .. ':' .. id
  scored[#scored + 1] = level * span + seq + i; scored[#scored + 1] = id
end
redis.call('HSET', KEYS[1], unpack(envs))
if level > 0 then redis.call('HSET', KEYS[2], unpack(prios)) end
redis.call('LPUSH', KEYS[4], unpack(entries))
redis.call('ZADD', KEYS[5], unpack(scored))
return count
"""


class Urgent(Event, event_name="prio-bench"):
    """The benchmark's event (the backlog's envelopes decode to it too)."""

    sent: float = 0.0


async def fill_backlog(
    client: aioredis.Redis, prefix: str, type_name: str, count: int, level: int, envelope: bytes
) -> None:
    """Make ``count`` events ready at ``level`` in a few seconds (a Lua loop, 2,000 a call)."""
    keys = TypeKeys(prefix, type_name)
    lists = (keys.ready, *keys.level_lists())
    seconds, micros = await client.time()
    now = str(int(seconds) * 1000 + int(micros) // 1000)
    script = client.register_script(_FILL)
    for n0 in range(0, count, 2000):
        k = [keys.events, keys.prio, keys.meta, lists[level], keys.queued]
        await script(keys=k, args=[n0, min(2000, count - n0), level, envelope, now])


def _envelope(service: EventService) -> bytes:
    """An envelope of the event type (the id is the hash field: any id opens it)."""
    return Codec().encode(Urgent(id="x"), None)


async def insert_times(url: str, sizes: list[int], calls: int) -> dict[str, Any]:
    """Median and p99 µs of Redis's time per enqueue call at each backlog size."""
    client = aioredis.Redis.from_url(url)
    sha = client.register_script(lua.source("enqueue")).sha
    out: dict[str, Any] = {}
    for size in sizes:
        prefix = f"ins{size}"
        service = EventService.from_url(url, prefix=prefix, enable_scheduling=False)
        async with service:
            await fill_backlog(client, prefix, "prio-bench", size, 9, _envelope(service))
            await service.enqueue_with_delay(Urgent(id="warm"), priority=3)  # loads the script
            await client.config_set("slowlog-log-slower-than", 0)
            await client.config_set("slowlog-max-len", 50 * calls + 100)
            await client.slowlog_reset()
            for i in range(calls):
                await service.enqueue_with_delay(Urgent(id=f"u{i}"), priority=0)
                await service.enqueue_with_delay(Urgent(id=f"l{i}"), priority=5)
            log = await client.slowlog_get(50 * calls + 100)
            await client.config_set("slowlog-log-slower-than", 10000)
        await client.flushdb()  # a private server: the next size starts from nothing
        times = [
            int(e["duration"])
            for e in log
            if e["command"].startswith(b"EVALSHA " + sha.encode())
            or e["command"].startswith(b"EVALSHA " + sha.encode().upper())
        ]
        times.sort()
        out[str(size)] = {
            "calls": len(times),
            "median_us": statistics.median(times),
            "p99_us": times[int(0.99 * (len(times) - 1))],
        }
    await client.aclose()
    return out


async def throughput(url: str, events: int, levels: int) -> float:
    """Events/s of one process handling ``events`` ready events spread over ``levels``."""
    prefix = f"tp{levels}-{time.monotonic_ns()}"
    producer = EventService.from_url(url, prefix=prefix, enable_scheduling=False)
    async with producer:
        for level in range(levels):
            share = [Urgent(id=f"{level}-{i}") for i in range(events // levels)]
            for i in range(0, len(share), 1000):
                await producer.enqueue_many(share[i : i + 1000], priority=level)
    done = asyncio.Event()
    count = 0
    target = events // levels * levels

    async def handle(event: Urgent) -> None:
        nonlocal count
        count += 1
        if count >= target:
            done.set()

    service = EventService.from_url(url, prefix=prefix)
    service.add_handler(Urgent, handle, concurrency=64)
    t0 = time.perf_counter()
    async with service:
        await asyncio.wait_for(done.wait(), 600)
        elapsed = time.perf_counter() - t0
    return target / elapsed


WORKER = r"""
import asyncio, sys
from delayq import Event, EventService, current_delivery

class Urgent(Event, event_name="prio-bench"):
    sent: float = 0.0

url, prefix, out = sys.argv[1], sys.argv[2], sys.argv[3]

async def main() -> None:
    lines = open(out, "a", buffering=1)

    async def handle(event: Urgent) -> None:
        if event.id.startswith("probe-"):
            d = current_delivery()
            lines.write(f"{event.id} {d.claimed_us / 1000 - d.due_ms:.3f}\n")

    service = EventService.from_url(url, prefix=prefix)
    service.add_handler(Urgent, handle, concurrency=32)
    async with service:
        await asyncio.Event().wait()

asyncio.run(main())
"""


async def lateness(url: str, backlog: int, probes: int, workers: int, tmp: Path) -> dict[str, Any]:
    """p50/p99 lateness (ms) of level-0 probes behind ``backlog`` level-9 ready events."""
    prefix = f"late{backlog}-{time.monotonic_ns()}"
    client = aioredis.Redis.from_url(url)
    producer = EventService.from_url(url, prefix=prefix, enable_scheduling=False)
    out = tmp / f"{prefix}.txt"
    out.write_text("")
    procs: list[subprocess.Popen[bytes]] = []
    async with producer:
        if backlog:
            await fill_backlog(client, prefix, "prio-bench", backlog, 9, _envelope(producer))
        script = tmp / f"{prefix}-worker.py"  # a temporary directory's, not results/
        script.write_text(WORKER)
        for _ in range(workers):
            procs.append(
                # started once per run, before anything is timed
                subprocess.Popen([sys.executable, str(script), url, prefix, str(out)], cwd=ROOT)  # noqa: ASYNC220
            )
        try:
            await asyncio.sleep(3.0)  # the workers start and get busy with the backlog
            for i in range(probes):
                await producer.enqueue_with_delay(Urgent(id=f"probe-{i}"), priority=0)
                await asyncio.sleep(0.02)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if len(out.read_text().splitlines()) >= probes:
                    break
                await asyncio.sleep(0.1)
            left = (await producer.stats_for(Urgent)).ready
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
    await client.flushdb()  # a private server: the next run starts from nothing
    await client.aclose()
    late = sorted(float(line.split()[1]) for line in out.read_text().splitlines())
    return {
        "backlog": backlog,
        "backlog_left": left,
        "probes": len(late),
        "p50_ms": statistics.median(late),
        "p99_ms": late[int(0.99 * (len(late) - 1))],
        "max_ms": late[-1],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--only", default="insert,throughput,lateness")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    results: dict[str, Any] = {"backlog": args.backlog}
    results_dir = HERE / "results"
    results_dir.mkdir(exist_ok=True)
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        url = server.url
        if "insert" in parts:
            sizes = sorted({0, min(100_000, args.backlog), args.backlog})
            results["insert"] = await insert_times(url, sizes, args.calls)
            print("insert script time (µs, Redis's own, SLOWLOG)")
            print(f"{'ready at level 9':>18} {'median':>8} {'p99':>8}")
            for size, r in results["insert"].items():
                print(f"{int(size):>18,} {r['median_us']:>8} {r['p99_us']:>8}")
        if "throughput" in parts:
            results["throughput"] = {
                "no levels": await throughput(url, args.events, 1),
                "10 levels": await throughput(url, args.events, 10),
            }
            print("throughput (events/s, one process, concurrency 64)")
            for label, rate in results["throughput"].items():
                print(f"{label:>18} {rate:>10,.0f}")
        if "lateness" in parts:
            results["lateness"] = [
                await lateness(url, 0, args.probes, args.workers, tmp),
                await lateness(url, args.backlog, args.probes, args.workers, tmp),
            ]
            print(f"urgent lateness (ms, {args.workers} workers, level-0 probes)")
            print(f"{'level-9 backlog':>18} {'p50':>8} {'p99':>8} {'max':>8} {'left':>10}")
            for r in results["lateness"]:
                print(
                    f"{r['backlog']:>18,} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
                    f"{r['max_ms']:>8.2f} {r['backlog_left']:>10,}"
                )
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = results_dir / f"priorities-{stamp}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    asyncio.run(main())
