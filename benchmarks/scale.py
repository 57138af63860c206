"""Scale run: millions of timers on one Redis, and a million events due in the same second.

1. ``--timers`` events (100-byte payload) are scheduled over the next day (1 h to 25 h ahead),
   by ``--producers`` processes: Redis memory per scheduled event and the fill rate.
2. ``--burst`` events of a second type are scheduled (by as many processes) to come due in one
   and the same second, and ``--probes`` events of a third type are due every 10 ms from 1 s
   before that second to 9 s after it.
3. One worker process (a default ``EventService``) runs the scheduler and handles both types.
   Measured: how fast the burst leaves the schedule (moves/s) and is handled (acks/s), the
   longest single Redis command or script meanwhile (``SLOWLOG``, every call over
   ``--slowlog-us`` is logged; by script name), another client's ``PING`` round trips, the
   lateness of the probe events (claim time minus due time, on Redis's clock) and how late
   the scheduler moved them, and the worker's event-loop lag: one type's burst must not
   hold up the others, nor Redis's other clients.

    python benchmarks/scale.py --timers 10000000 --burst 1000000

Prints a table and writes ``benchmarks/results/scale-<stamp>.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from delayq import Event, EventService  # noqa: E402
from delayq.context import current_delivery  # noqa: E402
from delayq.keys import PrefixKeys  # noqa: E402
from delayq.lua import GROUPED, PER_TYPE, STANDALONE, source  # noqa: E402
from delayq.testing import RedisServer  # noqa: E402

PREFIX = "scale"
PAYLOAD = "x" * 100


class ScaleTimer(Event, event_name="scale-timer"):
    """A timer due within the next day."""

    payload: str = ""


class ScaleBurst(Event, event_name="scale-burst"):
    """One of the burst's events, all due in the same second."""


class ScaleProbe(Event, event_name="scale-probe"):
    """An event of another type due while the burst is moved."""


def _fill_timers(url: str, start: int, stop: int) -> None:
    async def go() -> None:
        service = EventService.from_url(url, prefix=PREFIX, enable_scheduling=False)
        try:
            step = 5_000
            for i in range(start, stop, step):
                batch = [
                    (ScaleTimer(id=f"t{j}", payload=PAYLOAD), 3600 + (j * 7919) % 86_400)
                    for j in range(i, min(stop, i + step))
                ]
                await service.enqueue_many(batch)
        finally:
            await service.aclose()

    asyncio.run(go())


def fill_timers(url: str, count: int, producers: int) -> float:
    """Schedule ``count`` timers from ``producers`` processes; return the seconds it took."""
    per = -(-count // producers)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_fill_timers, args=(url, k * per, min(count, (k + 1) * per)))
             for k in range(producers)]  # fmt: skip
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a timer producer failed (exit {p.exitcode})")
    return time.perf_counter() - t0


def _fill_burst(url: str, start: int, stop: int, at: float) -> None:
    async def go() -> None:
        service = EventService.from_url(url, prefix=PREFIX, enable_scheduling=False)
        try:
            step = 5_000
            for i in range(start, stop, step):
                delay = max(0.0, at - time.time())
                await service.enqueue_many(
                    [ScaleBurst(id=f"b{j}") for j in range(i, min(stop, i + step))], delay
                )
        finally:
            await service.aclose()

    asyncio.run(go())


def schedule_burst(url: str, burst: int, probes: int, lead: float, producers: int) -> float:
    """Schedule the burst due at one instant ``lead`` s from now (from ``producers``
    processes), and the probes around it; return that instant (unix seconds, this machine's
    clock, which is Redis's here)."""
    at = time.time() + lead
    per = -(-burst // producers)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_fill_burst, args=(url, k * per, min(burst, (k + 1) * per), at))
             for k in range(producers)]  # fmt: skip
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a burst producer failed (exit {p.exitcode})")

    async def add_probes() -> None:
        service = EventService.from_url(url, prefix=PREFIX, enable_scheduling=False)
        try:
            items = [(ScaleProbe(id=f"p{k}"), max(0.0, at - 1 + k * 0.01 - time.time()))
                     for k in range(probes)]  # fmt: skip
            await service.enqueue_many(items)
        finally:
            await service.aclose()

    asyncio.run(add_probes())
    if time.time() > at - 1:
        raise RuntimeError("the burst took longer to schedule than --lead: raise it")
    return at


def _write(path: str, text: str) -> None:
    Path(path).write_text(text)


def worker(url: str, out: str, probes: int, batch_size: int) -> None:
    """The worker process: handles both types; writes the probes' lateness, and how late its
    event loop ran a 5 ms sleep while they came, when all ran."""

    async def go() -> None:
        lateness: list[float] = []
        lag: list[float] = []
        done = asyncio.Event()

        async def watch_loop() -> None:
            while not done.is_set():
                t0 = time.perf_counter()
                await asyncio.sleep(0.005)
                lag.append((time.perf_counter() - t0 - 0.005) * 1000)

        async def on_probe(event: ScaleProbe) -> None:
            delivery = current_delivery()
            if delivery is not None and delivery.lateness_ms is not None:
                lateness.append(delivery.lateness_ms)
            if len(lateness) >= probes:
                done.set()

        async def on_burst(event: ScaleBurst) -> None:
            return None

        service = EventService.from_url(url, prefix=PREFIX, scheduling_batch_size=batch_size)
        # how late the scheduler moved the probes (the rest of their lateness is the
        # consumer's): observed around the store's call, nothing changed
        moved_late: list[float] = []
        move_due = service.store.scheduling.move_due

        async def observed_move_due(type_name: str, *args: Any, **kwargs: Any) -> Any:
            result = await move_due(type_name, *args, **kwargs)
            if type_name == ScaleProbe.event_name and result.moved:
                moved_late.append(result.late_ms)
            return result

        service.store.scheduling.move_due = observed_move_due  # type: ignore[method-assign]
        service.add_handler(ScaleProbe, on_probe, concurrency=16)
        service.add_handler(ScaleBurst, on_burst, concurrency=256)
        async with service:
            _write(out + ".ready", "1")
            watcher = asyncio.create_task(watch_loop())
            await done.wait()
            await watcher
            _write(out, json.dumps({"lateness": lateness, "lag": lag, "moved": moved_late}))
            await asyncio.sleep(3600)  # until SIGTERM

    asyncio.run(go())


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``, nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")


SINGLE_KEY = ("HGET", "HSET", "HDEL", "HINCRBY", "HEXISTS", "ZCARD", "ZSCORE", "RPOP", "GET", "SET",
              "EXISTS", "LLEN", "ZCOUNT")  # fmt: skip


def script_names() -> dict[str, str]:
    """SHA1 of each delayq script as sent to Redis -> its name (EVALSHA in SLOWLOG)."""
    return {hashlib.sha1(source(n).encode()).hexdigest(): n
            for n in (*PER_TYPE, *GROUPED, *STANDALONE)}  # fmt: skip


def calls_by_name(entries: list[dict[str, Any]]) -> dict[str, list[float]]:
    """SLOWLOG entries -> durations (ms) by script name (or command name)."""
    names = script_names()
    out: dict[str, list[float]] = {}
    for e in entries:
        cmd = e["command"]
        cmd = cmd.decode("utf-8", "replace") if isinstance(cmd, bytes) else str(cmd)
        words = cmd.split()
        name = words[0].upper() if words else "?"
        if name in ("EVALSHA", "EVALSHA_RO") and len(words) > 1:
            name = names.get(words[1].lower(), words[1][:12])
        out.setdefault(name, []).append(e["duration"] / 1000)
    return out


class Pinger:
    """Another client: PING every ``every`` s; its round trips show how long Redis made
    other clients wait (this process's own scheduling on a loaded machine included)."""

    def __init__(self, url: str, every: float = 0.002):
        self._r = redis.Redis.from_url(url)
        self._every = every
        self._stop = threading.Event()
        self.rtt_ms: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self._r.ping()
            self.rtt_ms.append((time.perf_counter() - t0) * 1000)
            time.sleep(self._every)

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._r.close()


class HostWatch:
    """What the machine took from the run: the CPU time the hypervisor gave other guests
    (``steal`` in /proc/stat), and how long redis-server waited for a core while it had
    work (``run_delay`` in its /proc/<pid>/schedstat). Either, in the second of a long
    call, says the call was held up, not slow (Linux only; None elsewhere)."""

    def __init__(self, pid: int | None, every: float = 0.02):
        self._pid = pid
        self._every = every
        self._stop = threading.Event()
        self.samples: list[tuple[float, float, float]] = []  # (time, steal ms, run_delay ms)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                steal = int(f.readline().split()[8]) * 1000 / os.sysconf("SC_CLK_TCK")
            delay = 0.0
            if self._pid is not None:
                with open(f"/proc/{self._pid}/schedstat") as f:
                    delay = int(f.read().split()[1]) / 1e6
        except (OSError, IndexError, ValueError):
            return None
        return time.time(), steal, delay

    def _run(self) -> None:
        while not self._stop.is_set():
            sample = self._read()
            if sample is None:
                return
            self.samples.append(sample)
            time.sleep(self._every)

    def __enter__(self) -> HostWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def in_second(self, second: int) -> tuple[float, float] | None:
        """The steal and redis-server's run delay (ms) within the unix second ``second``."""
        inside = [x for x in self.samples if second <= x[0] < second + 1]
        before = [x for x in self.samples if x[0] < second]
        if not inside:
            return None
        first = before[-1] if before else inside[0]
        return round(inside[-1][1] - first[1], 1), round(inside[-1][2] - first[2], 1)

    def figures(self, window: float = 0.1) -> dict[str, float | None]:
        """Totals over the watch, and the most in any ``window`` seconds."""
        s = self.samples
        if len(s) < 2:
            return {"steal_ms": None, "steal_max_100ms": None,
                    "redis_run_delay_ms": None, "redis_run_delay_max_100ms": None}  # fmt: skip
        worst_steal = worst_delay = 0.0
        j = 0
        for i in range(len(s)):
            while s[i][0] - s[j][0] > window:
                j += 1
            worst_steal = max(worst_steal, s[i][1] - s[j][1])
            worst_delay = max(worst_delay, s[i][2] - s[j][2])
        return {
            "steal_ms": round(s[-1][1] - s[0][1], 1),
            "steal_max_100ms": round(worst_steal, 1),
            "redis_run_delay_ms": round(s[-1][2] - s[0][2], 1),
            "redis_run_delay_max_100ms": round(worst_delay, 1),
        }


def loadavg() -> str:
    """The 1-minute load average of this machine."""
    return f"{os.getloadavg()[0]:.1f}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole scale run on one private redis-server; returns the figures."""
    config = {"slowlog-log-slower-than": str(args.slowlog_us), "slowlog-max-len": "1000000"}
    burst_keys = PrefixKeys(PREFIX).for_type(ScaleBurst.event_name)
    load_start = loadavg()
    with RedisServer(config=config) as server:
        if args.nice and server.pid is not None:
            os.setpriority(os.PRIO_PROCESS, server.pid, args.nice)
        r = redis.Redis.from_url(server.url)
        base = int(r.info("memory")["used_memory"])
        fill_s = fill_timers(server.url, args.timers, args.producers) if args.timers else 0.0
        used = int(r.info("memory")["used_memory"])
        per_event = (used - base) / args.timers if args.timers else 0.0
        slow_fill = r.slowlog_get(1_000_000)
        r.slowlog_reset()
        load_fill = loadavg()

        out = str(Path(args.tmp) / f"probes-{os.getpid()}.json")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, __file__, "--worker", server.url, out,
                                 str(args.probes), str(args.batch_size)], env=env)  # fmt: skip
        if args.nice:
            os.setpriority(os.PRIO_PROCESS, proc.pid, args.nice)
        try:
            deadline = time.monotonic() + 120
            while not Path(out + ".ready").exists():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the worker did not start")
                time.sleep(0.05)
            at = schedule_burst(server.url, args.burst, args.probes, args.lead, args.producers)
            r.slowlog_reset()  # the burst's own calls from here (not its enqueues)
            # how fast the burst leaves the schedule (moved to ready), then Redis (acked)
            first_move = last_move = last_ack = None
            with Pinger(server.url) as pinger, HostWatch(server.pid) as host:
                while True:
                    left = int(r.zcard(burst_keys.scheduled))
                    now = time.time()
                    if left < args.burst and first_move is None:
                        first_move = now
                    if left == 0 and last_move is None:
                        last_move = now
                    if last_move is not None and int(r.hlen(burst_keys.events)) == 0:
                        last_ack = now
                        break
                    if now > at + 600:
                        raise RuntimeError(f"{left} burst events still scheduled after 600 s")
                    time.sleep(0.005)
            load_burst = loadavg()
            deadline = time.monotonic() + 600
            while not Path(out).exists():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the worker did not handle every probe")
                time.sleep(0.05)
            got = json.loads(Path(out).read_text())
            lateness, lag, moved = got["lateness"], got["lag"], got["moved"]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
            for f in (out, out + ".ready"):
                Path(f).unlink(missing_ok=True)
        slow_burst = r.slowlog_get(1_000_000)
        peak = int(r.info("memory")["used_memory_peak"])
        r.close()

    def longest(entries: list[dict[str, Any]]) -> tuple[float, str]:
        by = calls_by_name(entries)
        if not by:
            return 0.0, f"none over {args.slowlog_us} µs"
        name = max(by, key=lambda k: max(by[k]))
        return max(by[name]), name

    def per_script(entries: list[dict[str, Any]]) -> str:
        by = calls_by_name(entries)
        return ", ".join(f"{k} {len(v)} (max {max(v):.1f}, >10 ms {sum(x > 10 for x in v)})"
                         for k, v in sorted(by.items(), key=lambda kv: -max(kv[1])))  # fmt: skip

    def spread(values: list[float]) -> str:
        if not values:
            return "none"
        return (f"{len(values)} calls: p50 {statistics.median(values):.1f}, p99 "
                f"{pct(values, 0.99):.1f}, p99.9 {pct(values, 0.999):.1f}, max {max(values):.1f}")  # fmt: skip

    by_burst = calls_by_name(slow_burst)
    # single-key commands (one member) can only take milliseconds when redis-server itself
    # is held up (the host, another process on its core): the run's stalls, not delayq's work
    single = [d for name in SINGLE_KEY for d in by_burst.get(name, [])]
    move_s = (last_move - first_move) if first_move and last_move else 0.0
    handle_s = (last_ack - first_move) if first_move and last_ack else 0.0
    lf, lf_cmd = longest(slow_fill)
    lb, lb_cmd = longest(slow_burst)
    burst_ms = [e["duration"] / 1000 for e in slow_burst]
    rtt = pinger.rtt_ms
    return {
        "timers": args.timers, "burst": args.burst, "probes": args.probes,
        "fill_seconds": round(fill_s, 1),
        "fill_rate": round(args.timers / fill_s) if fill_s else 0,
        "bytes_per_timer": round(per_event, 1),
        "used_memory_mb": round(used / 2**20, 1),
        "used_memory_peak_mb": round(peak / 2**20, 1),
        "burst_move_seconds": round(move_s, 2),
        "burst_move_rate": round(args.burst / move_s) if move_s else 0,
        "burst_handle_seconds": round(handle_s, 2),
        "burst_handle_rate": round(args.burst / handle_s) if handle_s else 0,
        "longest_call_fill_ms": round(lf, 2), "longest_call_fill": lf_cmd,
        "longest_call_burst_ms": round(lb, 2), "longest_call_burst": lb_cmd,
        f"calls_over_{args.slowlog_us}us_burst": len(slow_burst),
        "calls_over_10ms_burst": sum(d > 10 for d in burst_ms),
        "calls_burst_by_script": per_script(slow_burst),
        f"move_due_ms_burst_over_{args.slowlog_us}us": spread(by_burst.get("move_due", [])),
        "single_key_command_max_ms_burst": round(max(single), 2) if single else None,
        **{f"{k}_burst": v for k, v in host.figures().items()},
        # each call over 10 ms: (name, ms, steal ms and redis-server's run delay ms in its second)
        "calls_over_10ms_with_host": [
            (name, round(e["duration"] / 1000, 1), host.in_second(int(e["start_time"])))
            for e in slow_burst if e["duration"] > 10_000
            for name in [next(iter(calls_by_name([e])))]
        ],
        "ping_rtt_p99_ms": round(pct(rtt, 0.99), 2) if rtt else None,
        "ping_rtt_max_ms": round(max(rtt), 2) if rtt else None,
        "probe_late_p50_ms": round(statistics.median(lateness), 1) if lateness else None,
        "probe_late_p99_ms": round(pct(lateness, 0.99), 1) if lateness else None,
        "probe_late_max_ms": round(max(lateness), 1) if lateness else None,
        "probe_moved_late_p50_ms": round(statistics.median(moved), 1) if moved else None,
        "probe_moved_late_p99_ms": round(pct(moved, 0.99), 1) if moved else None,
        "worker_loop_lag_p99_ms": round(pct(lag, 0.99), 1) if lag else None,
        "worker_loop_lag_max_ms": round(max(lag), 1) if lag else None,
        "load_average_1m": f"{load_start} at start, {load_fill} after the fill, "
                           f"{load_burst} after the burst",
    }  # fmt: skip


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timers", type=int, default=10_000_000)
    parser.add_argument("--burst", type=int, default=1_000_000)
    parser.add_argument("--probes", type=int, default=1000)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--lead", type=float, default=0.0,
                        help="seconds from scheduling the burst to its due time "
                             "(default: 10 s + 200 µs per burst event / producers)")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=250,
                        help="the worker's scheduling_batch_size (250: the default)")  # fmt: skip
    parser.add_argument(
        "--slowlog-us",
        type=int,
        default=1000,
        help="SLOWLOG logs every call longer than this (µs; 0: every call)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run redis-server and the worker at this niceness (e.g. -10 on a "
        "machine shared with other work; needs root)",
    )
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--tmp", default="/tmp")
    args = parser.parse_args()
    if not args.lead:
        args.lead = 10 + args.burst * 200e-6 / args.producers
    res = run(args)
    command = (f"python benchmarks/scale.py --timers {args.timers} --burst {args.burst} "
               f"--probes {args.probes} --producers {args.producers} --lead {args.lead:g}"
               + (f" --batch-size {args.batch_size}" if args.batch_size != 250 else "")
               + (f" --nice {args.nice}" if args.nice else ""))  # fmt: skip
    lines = [f"Command: `{command}`", "", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in res.items()]
    text = "\n".join(lines)
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d-%H%M%S")
    (args.out_dir / f"scale-{stamp}.md").write_text(text + "\n")
    (args.out_dir / f"scale-{stamp}.json").write_text(json.dumps({"command": command, **res},
                                                                 indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
