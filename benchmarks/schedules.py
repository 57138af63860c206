"""``python -m benchmarks.schedules``: what recurring schedules cost (issue 21).

Against a fresh private redis-server, with one service process (scheduler on):

* **idle, no schedules** — client commands/s (counted with MONITOR, commands run
  inside scripts excluded) and the service's CPU while nothing is scheduled: the
  cost for users who never call ``schedule()``;
* **fire lateness** — ``--lateness-schedules`` every-second schedules for
  ``--seconds`` s: the fire's lag (fire time minus the slot's nominal time, the
  ``schedule_lag`` metric) and the handler's lateness (claim minus nominal slot),
  p50/p99/max;
* **N schedules** — ``--schedules`` schedules (every hour, all sharing one slot):
  creation rate, Redis memory per schedule, idle commands/s and CPU while they
  wait, and the time from their shared slot until every one has fired.

    python -m benchmarks.schedules                       # 100,000 schedules
    python -m benchmarks.schedules --smoke --no-write    # seconds, for the test suite

Prints a table and writes ``benchmarks/results/schedules-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import select
import socket
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis

from delayq import Event, EventService, current_delivery
from delayq.testing import RedisServer

HERE = Path(__file__).resolve().parent


class Beat(Event, event_name="bench-sched"):
    """The lateness schedules' event."""

    n: int = 0


class Bulk(Event, event_name="bench-sched-bulk"):
    """The N schedules' event (no handler: fires wait in the ready list)."""

    n: int = 0


class Sink:
    """A metrics sink keeping what the benchmark reads."""

    def __init__(self) -> None:
        self.fires = 0
        self.lags: list[float] = []

    def increment(self, name: str, value: int = 1, *, event_type: str = "") -> None:
        """Count schedule fires."""
        if name == "schedule_fires":
            self.fires += value

    def gauge(self, name: str, value: float, *, event_type: str = "") -> None:
        """Ignore gauges."""

    def observe(
        self, name: str, seconds: float, *, event_type: str = "", outcome: str = ""
    ) -> None:
        """Keep schedule lags."""
        if name == "schedule_lag":
            self.lags.append(seconds * 1000)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schedules", type=int, default=100_000)
    p.add_argument("--skip-bulk", action="store_true", help="only the idle and lateness parts")
    p.add_argument("--lateness-schedules", type=int, default=5)
    p.add_argument("--seconds", type=float, default=30.0, help="lateness run length")
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--smoke", action="store_true", help="tiny sizes (the test suite)")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--no-write", action="store_true", help="print only, write no JSON")
    args = p.parse_args(argv)
    if args.smoke:
        args.schedules, args.seconds, args.idle_seconds = 500, 3.0, 3.0
    return args


def count_commands(url: str, seconds: float) -> int:
    """Commands clients sent during ``seconds`` (MONITOR; calls made inside scripts, shown
    as ``[0 lua]``, excluded)."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379))
    sock.sendall(b"MONITOR\r\n")
    buf, n = b"", 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sock], [], [], left)
        if not ready:
            break
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\r\n")
        n += sum(1 for line in lines if line.startswith(b"+1") and b" lua]" not in line)
    sock.close()
    return n


async def idle(url: str, seconds: float) -> tuple[float, float]:
    """(client commands/s, service CPU ms/s) over ``seconds`` of idling."""
    box: dict[str, int] = {}
    thread = threading.Thread(target=lambda: box.update(n=count_commands(url, seconds)))
    cpu = time.process_time()
    thread.start()
    while thread.is_alive():
        await asyncio.sleep(0.05)
    cpu = time.process_time() - cpu
    return box["n"] / seconds, cpu * 1000 / seconds


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement; the results as a dict."""
    out: dict[str, Any] = {}
    with RedisServer() as server:
        url = server.url
        raw = redis.Redis.from_url(url)
        sink = Sink()
        lateness: list[float] = []

        one_off: list[float] = []
        by_slot: dict[datetime, float] = {}  # slot -> its latest fire (the slots' fires are
        # claimed together: a slot's fires are late together, so per slot ~ per one-off event)

        async def handle(event: Beat) -> None:
            d = current_delivery()
            assert d is not None
            if d.slot is None:  # the one-off events of the comparison
                assert d.due_ms is not None
                one_off.append(d.claimed_us / 1000 - d.due_ms)
                return
            late = d.claimed_us / 1000 - d.slot.timestamp() * 1000
            lateness.append(late)
            by_slot[d.slot] = max(by_slot.get(d.slot, late), late)

        async def one_offs(seconds: float) -> None:
            """One ordinary delayed event each second, due half-way between two slots (A/B)."""
            end = time.time() + seconds
            k = 0
            while time.time() < end:
                due = datetime.fromtimestamp(int(time.time()) + 1.5, timezone.utc)
                k += 1
                await service.enqueue_at(Beat(id=f"one-off-{k}"), due)
                await asyncio.sleep(max(0.0, due.timestamp() - time.time()) + 0.3)

        service = EventService.from_url(url, prefix="bench", metrics=sink)
        service.add_handler(Beat, handle, concurrency=16)
        async with service:
            await asyncio.sleep(1.5)
            out["idle_no_schedules_cmds_per_s"], out["idle_no_schedules_cpu_ms_per_s"] = await idle(
                url, args.idle_seconds
            )
            # -- fire lateness
            for i in range(args.lateness_schedules):
                await service.schedule(
                    f"beat{i}", Beat, every=timedelta(seconds=1), overlap="allow"
                )
            out["load_before"] = os.getloadavg()[0]
            await one_offs(args.seconds)
            out["load_after"] = os.getloadavg()[0]
            for i in range(args.lateness_schedules):
                await service.unschedule(f"beat{i}")
            await asyncio.sleep(0.5)
            out["fires"] = len(lateness)
            out["lag_p50_ms"], out["lag_p99_ms"] = pct(sink.lags, 0.5), pct(sink.lags, 0.99)
            out["lag_max_ms"] = max(sink.lags, default=float("nan"))
            out["lateness_p50_ms"], out["lateness_p99_ms"] = pct(lateness, 0.5), pct(lateness, 0.99)
            out["lateness_max_ms"] = max(lateness, default=float("nan"))
            out["lateness_p90_ms"] = pct(lateness, 0.9)
            out["lateness_over_10ms"] = sum(v > 10 for v in lateness) / max(1, len(lateness))
            slots = list(by_slot.values())
            out["slots"] = len(slots)
            out["slot_p50_ms"], out["slot_p90_ms"] = pct(slots, 0.5), pct(slots, 0.9)
            out["one_off_p90_ms"] = pct(one_off, 0.9)
            out["one_off_over_10ms"] = sum(v > 10 for v in one_off) / max(1, len(one_off))
            out["one_off_events"] = len(one_off)
            out["one_off_p50_ms"], out["one_off_p99_ms"] = pct(one_off, 0.5), pct(one_off, 0.99)
            out["one_off_max_ms"] = max(one_off, default=float("nan"))
            if args.skip_bulk:
                out["redis_version"] = raw.info("server")["redis_version"]
                out["schedules"] = 0
                return out
            # -- N schedules: created with a slot a day away (what waiting costs), then
            # updated to share one slot soon (what firing it costs)
            n = args.schedules
            names = [f"bulk{i:06d}" for i in range(n)]

            async def create_all(start_at: datetime) -> float:
                t0 = time.perf_counter()
                for i in range(0, n, 50):
                    await asyncio.gather(*(
                        service.schedule(name, Bulk, every=timedelta(hours=1), start_at=start_at)
                        for name in names[i : i + 50]
                    ))  # fmt: skip
                return time.perf_counter() - t0

            far = datetime.now(timezone.utc) + timedelta(days=1)
            out["create_s"] = await create_all(far)
            out["create_per_s"] = n / out["create_s"]
            # the schedules' own keys (MEMORY USAGE, exact): connections' buffers excluded
            store = service.store
            keys = [
                *store.schedules.schedule_index_keys,
                *store.schedules.schedule_keys("bench-sched-bulk"),
            ]
            used = sum(int(raw.memory_usage(k, samples=0) or 0) for k in keys)
            out["memory_bytes_per_schedule"] = used / n
            await asyncio.sleep(1.0)
            out["idle_n_cmds_per_s"], out["idle_n_cpu_ms_per_s"] = await idle(
                url, args.idle_seconds
            )
            slot = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(
                seconds=out["create_s"] * 1.5 + 5
            )
            fires0 = sink.fires
            await create_all(slot)  # a changed definition: an update in place
            cpu0 = time.process_time()
            deadline = time.monotonic() + 600
            first: datetime | None = None
            while sink.fires - fires0 < n and time.monotonic() < deadline:
                if first is None and sink.fires > fires0:
                    first = datetime.now(timezone.utc)
                await asyncio.sleep(0.005)
            done = datetime.now(timezone.utc)
            out["shared_slot_fired"] = sink.fires - fires0
            out["shared_slot_s"] = (done - slot).total_seconds()
            out["shared_slot_cpu_s"] = time.process_time() - cpu0
            spent = (done - (first or slot)).total_seconds()
            out["shared_slot_per_s"] = n / spent if spent > 0 else float("nan")
        out["redis_version"] = raw.info("server")["redis_version"]
        raw.close()
    out["schedules"] = args.schedules
    return out


def table(r: dict[str, Any]) -> str:
    """The results as a Markdown table."""
    bulk = "create_per_s" in r
    rows = [
        ("idle, no schedules: client commands/s", f"{r['idle_no_schedules_cmds_per_s']:.2f}"),
        ("idle, no schedules: service CPU ms/s", f"{r['idle_no_schedules_cpu_ms_per_s']:.2f}"),
        ("fires measured (every-second schedules)", f"{r['fires']}"),
        ("fire lag p50 / p99 / max (ms)", f"{r['lag_p50_ms']:.1f} / {r['lag_p99_ms']:.1f} / {r['lag_max_ms']:.1f}"),
        ("fires: handler lateness p50 / p99 / max (ms)", f"{r['lateness_p50_ms']:.1f} / {r['lateness_p99_ms']:.1f} / {r['lateness_max_ms']:.1f}"),
        (f"same run, {r['one_off_events']} one-off delayed events: p50 / p99 / max (ms)", f"{r['one_off_p50_ms']:.1f} / {r['one_off_p99_ms']:.1f} / {r['one_off_max_ms']:.1f}"),
        ("p90 (ms), share over 10 ms: fires / one-offs", f"{r['lateness_p90_ms']:.1f}, {r['lateness_over_10ms']:.1%} / {r['one_off_p90_ms']:.1f}, {r['one_off_over_10ms']:.1%}"),
        (f"each of the {r['slots']} slots' latest fire: p50 / p90 (ms)", f"{r['slot_p50_ms']:.1f} / {r['slot_p90_ms']:.1f}"),
        ("load average (1 min) before / after the lateness run", f"{r['load_before']:.1f} / {r['load_after']:.1f}"),
    ]  # fmt: skip
    if bulk:
        rows += [
        (f"{r['schedules']:,} schedules: created per s", f"{r['create_per_s']:.0f}"),
        ("Redis memory per schedule (bytes)", f"{r['memory_bytes_per_schedule']:.0f}"),
        ("idle with them: client commands/s", f"{r['idle_n_cmds_per_s']:.2f}"),
        ("idle with them: service CPU ms/s", f"{r['idle_n_cpu_ms_per_s']:.2f}"),
        ("one slot shared by all: fired", f"{r['shared_slot_fired']:,}"),
        ("one slot shared by all: last fire after the slot, s (fires start 0.2 s ahead)", f"{r['shared_slot_s']:.2f}"),
        ("one slot shared by all: fires/s, firer CPU s", f"{r['shared_slot_per_s']:.0f}, {r['shared_slot_cpu_s']:.2f}"),
        ]  # fmt: skip
    lines = ["| measure | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run, print the table, write the JSON."""
    args = parse_args(argv)
    result = asyncio.run(run(args))
    print(table(result))
    if not args.no_write:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d-%H%M")
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"schedules-{stamp}.json"
        result["machine"] = {"python": platform.python_version(), "platform": platform.platform()}
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")
    bulk_ok = args.skip_bulk or result.get("shared_slot_fired") == args.schedules
    return 0 if bulk_ok and result["fires"] > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
