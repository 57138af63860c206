"""How fast the dashboard's pages are on big queues, and what each Redis call costs.

    python -m benchmarks.dashboard [--scheduled 1000000] [--dead 100000] [--repeat 20]

Starts a private redis-server, fills one event type with ``--scheduled`` events
(due over the next 30 days, enqueued with ``enqueue_many``) and ``--dead`` dead
letters (made the real way: due now, handled by a worker whose handler always
fails, no retries), plus a few in-flight events, a second small type, full
history rings and a worker heartbeat. Then serves the dashboard with
``python -m delayq.dashboard`` (uvicorn, its own process) and fetches every page
``--repeat`` times over loopback.

Per page it reports the wall time of the HTTP request (p50 and max) and, from
Redis's SLOWLOG (``slowlog-log-slower-than 0``: every command is logged with its
execution time), the number of Redis calls one page load makes and the slowest
one (a script counts as one call). Targets (issue 12): every page < 200 ms, no
single Redis call > 5 ms. Also prints the memory of full history rings.
Writes benchmarks/results/dashboard-<date>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import msgspec
import psutil
import redis

from delayq import Event, EventService, lua
from delayq.runtime.history import COARSE_SECONDS, COARSE_SLOTS, LATENESS_BOUNDS_MS, MINUTE_SLOTS
from delayq.testing import RedisServer

PREFIX = "bench"
BIG = "big-type"


class BigEvent(Event, event_name=BIG):
    """A typical small event (about 120 bytes stored)."""

    order_id: int = 0
    note: str = ""


class SmallEvent(Event, event_name="small-type"):
    """A second type, so the overview and search have more than one."""


async def _always_fails(event: BigEvent) -> None:
    raise RuntimeError(f"downstream refused order {event.order_id}")


async def _hang(event: SmallEvent) -> None:
    await asyncio.sleep(3600)


async def fill(url: str, scheduled: int, dead: int) -> EventService:
    """Fill the queues; return the worker that holds in-flight events (keep it running)."""
    producer = EventService.from_url(url, prefix=PREFIX, enable_scheduling=False)
    t0 = time.perf_counter()
    chunk = 20_000
    month = 30 * 86400
    for start in range(0, scheduled, chunk):
        await producer.enqueue_many(
            [
                (BigEvent(id=f"s-{i:08d}", order_id=i, note="x" * 40), 60 + (i * 7919) % month)
                for i in range(start, min(scheduled, start + chunk))
            ]
        )
    print(f"  {scheduled:,} scheduled in {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    failer = EventService.from_url(
        url, prefix=PREFIX, retry_attempts=0, history_interval=1, scheduling_batch_size=2000
    )
    failer.add_handler(BigEvent, _always_fails, concurrency=50)
    await failer.start()
    for start in range(0, dead, chunk):
        await producer.enqueue_many(
            [BigEvent(id=f"d-{i:08d}", order_id=i) for i in range(start, min(dead, start + chunk))]
        )
    while (await producer.stats_for(BIG)).dead < dead:
        await asyncio.sleep(0.5)
    await failer.aclose()
    print(f"  {dead:,} dead letters in {time.perf_counter() - t0:.1f} s", flush=True)
    worker = EventService.from_url(url, prefix=PREFIX, history_interval=1, heartbeat_interval=1)
    worker.add_handler(SmallEvent, _hang, concurrency=20)
    await worker.start()
    await producer.enqueue_many([SmallEvent(id=f"f-{i}") for i in range(20)])
    await producer.enqueue_many([(SmallEvent(id=f"w-{i}"), 3600) for i in range(1000)])
    await producer.aclose()
    return worker


def full_rings(client: redis.Redis) -> dict[str, int]:
    """Fill every slot of both rings of one type with realistic values; their memory in bytes."""
    now = time.time()
    for ring, period, slots in (
        ("minute", 60, MINUTE_SLOTS),
        ("coarse", COARSE_SECONDS, COARSE_SLOTS),
    ):
        current = int(now // period)
        fields = {}
        for index in range(current - slots + 1, current + 1):
            buckets = [0] * (len(LATENESS_BOUNDS_MS) + 1)
            for b, n in ((3, 120), (4, 900), (5, 3000), (6, 800), (8, 40), (10, 3)):
                buckets[b] = n * period // 60
            handled = 5000 * period // 60
            fields[str(index % slots)] = msgspec.msgpack.encode(
                [index, handled, handled // 100, *buckets]
            )
        client.hset(f"{{{PREFIX}}}:history:{ring}:ring-probe", mapping=fields)
    return {
        ring: int(client.memory_usage(f"{{{PREFIX}}}:history:{ring}:ring-probe") or 0)
        for ring in ("minute", "coarse")
    }


def _name_call(command: bytes) -> str:
    """``EVALSHA <sha>`` as ``EVALSHA <script name>``, other commands as their first words."""
    words = command.split(b" ")
    if words[0].upper() == b"EVALSHA" and len(words) > 1:
        return "EVALSHA " + _SHAS.get(words[1].decode(), words[1].decode()[:12])
    return command[:40].decode("utf-8", "replace")


_SHAS = {
    hashlib.sha1(lua.source(name).encode()).hexdigest(): f"{name}.lua"
    for name in (*lua.PER_TYPE, *lua.STANDALONE)
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduled", type=int, default=1_000_000)
    parser.add_argument("--dead", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    with RedisServer() as server:
        print(f"filling Redis {server.url} ...", flush=True)
        loop = asyncio.new_event_loop()
        worker = loop.run_until_complete(fill(server.url, args.scheduled, args.dead))
        client = redis.Redis.from_url(server.url, protocol=2)
        ring_bytes = full_rings(client)
        client.delete(f"{{{PREFIX}}}:history:minute:ring-probe")
        client.delete(f"{{{PREFIX}}}:history:coarse:ring-probe")
        # keep the worker's heartbeat alive in the background while pages load
        import threading

        threading.Thread(target=loop.run_forever, daemon=True).start()
        port = _free_port()
        web = subprocess.Popen(
            [sys.executable, "-m", "delayq.dashboard", "--redis-url", server.url,
             "--prefix", PREFIX, "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            http = httpx.Client(base_url=base, timeout=30)
            for _ in range(200):
                try:
                    http.get("/workers")
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            mid = args.scheduled // 2
            pages = [
                ("overview", "/"),
                ("overview, last day", "/?window=day"),
                ("overview live fragment", "/live/overview"),
                ("type page", f"/type?name={BIG}"),
                ("type page, deep pages", f"/type?name={BIG}&offset={mid}&dead_offset={args.dead - 30}"),
                ("type live fragment", f"/live/type?name={BIG}"),
                ("event page (scheduled)", f"/event?type={BIG}&id=s-{mid:08d}"),
                ("event page (dead letter)", f"/event?type={BIG}&id=d-00000007"),
                ("search, any type", f"/event?id=s-{mid + 1:08d}"),
                ("search by id prefix (matches)", f"/event?type={BIG}&id=s-{mid // 1000:05d}"),
                ("search by id prefix (none: every scan at its cap)", f"/event?type={BIG}&id=zz-"),
                ("type page, dead letters filtered by error (no match)",
                 f"/type?name={BIG}&error=no-such-text"),
                ("workers", "/workers"),
            ]  # fmt: skip
            http.get("/")  # warm-up: scripts loaded, connections open
            client.config_set("slowlog-log-slower-than", 0)
            client.config_set("slowlog-max-len", 100_000)
            rows = []
            for label, path in pages:
                walls, calls, durations, slowest, slowest_cmd = [], [], [], 0, ""
                for _ in range(args.repeat):
                    client.slowlog_reset()
                    t0 = time.perf_counter()
                    r = http.get(path)
                    walls.append((time.perf_counter() - t0) * 1000)
                    # a search that finds nothing answers 404 (with its page)
                    expected = 404 if "id=zz-" in path else 200
                    assert r.status_code == expected, (path, r.status_code)
                    log = client.slowlog_get(100_000)
                    # the worker's heartbeat, renewals and BRPOPs run meanwhile: count only
                    # the calls from the dashboard process's connections
                    ports = {
                        f"127.0.0.1:{c.laddr.port}".encode()
                        for c in psutil.Process(web.pid).net_connections(kind="tcp")
                        if c.raddr and c.raddr.port == server.port
                    }
                    mine = [e for e in log if e.get("client_address") in ports]
                    calls.append(len(mine))
                    durations.extend(e["duration"] for e in mine)
                    for e in mine:
                        if e["duration"] > slowest:
                            slowest = e["duration"]
                            slowest_cmd = _name_call(e["command"])
                rows.append({
                    "page": label,
                    "path": path,
                    "p50_ms": round(statistics.median(walls), 1),
                    "max_ms": round(max(walls), 1),
                    "redis_calls": int(statistics.median(calls)),
                    "p99_call_ms": round(statistics.quantiles(durations, n=100)[98] / 1000, 3)
                    if len(durations) > 1 else 0.0,
                    "slowest_call_ms": round(slowest / 1000, 3),
                    "slowest_call": slowest_cmd,
                })  # fmt: skip
            client.config_set("slowlog-log-slower-than", 10_000)
        finally:
            web.terminate()
            web.wait(timeout=10)
        memory = client.info("memory")["used_memory"]
        asyncio.run_coroutine_threadsafe(worker.aclose(), loop).result(timeout=30)

    print()
    print(f"dashboard on {args.scheduled:,} scheduled + {args.dead:,} dead letters "
          f"(Redis used_memory {memory / 2**20:,.0f} MiB), {args.repeat} loads per page")  # fmt: skip
    print(f"{'page':28} {'p50 ms':>8} {'max ms':>8} {'Redis calls':>12} {'p99 call ms':>12} "
          f"{'slowest call ms':>16}  slowest call")  # fmt: skip
    for r in rows:
        print(f"{r['page']:28} {r['p50_ms']:8.1f} {r['max_ms']:8.1f} {r['redis_calls']:12} "
              f"{r['p99_call_ms']:12.3f} {r['slowest_call_ms']:16.3f}  {r['slowest_call']}")  # fmt: skip
    print(f"full history rings of one type: minute {ring_bytes['minute']:,} B, "
          f"coarse {ring_bytes['coarse']:,} B")  # fmt: skip
    print("load average at the end: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
    ok = all(r["max_ms"] < 200 and r["slowest_call_ms"] <= 5 for r in rows)
    print("targets (every page < 200 ms, every Redis call <= 5 ms):", "met" if ok else "NOT met")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d-%H%M")
    (out / f"dashboard-{stamp}.json").write_text(json.dumps({
        "scheduled": args.scheduled, "dead": args.dead, "repeat": args.repeat,
        "redis_used_memory": memory, "pages": rows, "history_ring_bytes": ring_bytes,
        "python": sys.version.split()[0], "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
