"""The contract every adapter follows, and the workloads they share.

Runs inside each peer's own virtualenv, so it uses the standard library and
redis-py (which every peer depends on) only.

Command line of an adapter module ``benchmarks.peers.<name>``::

    python -m benchmarks.peers.<name> versions
    python -m benchmarks.peers.<name> run --workload W --variant V --redis-url URL --out FILE
                                          [--param key=value ...]
    python -m benchmarks.peers.<name> worker --variant V --redis-url URL --concurrency C
                                             [--types T]

``run`` writes one JSON object to ``FILE``::

    {"library", "variant", "label", "workload", "versions": {dist: version},
     "params": {...}, "ok": bool, "error": str | None, "notes": [str],
     "metrics": {...}, "samples": {"lateness_ms": [...]}, "duration_s": float}

How times are measured (all processes run on one machine, one clock):

* A handler's first action is :meth:`Recorder.record`, which appends
  ``"<id> <time.time()> <extra>"`` to ``$BENCH_REC_DIR/rec-<pid>.txt`` with
  one ``write`` system call (no Redis round trip, no lock).
* The due time of an event is ``time.time()`` taken by the producer just
  before the enqueue call, plus the delay it asked for. Lateness = handler
  start - due time. (delayq also reports its own ``Delivery.lateness_ms``,
  measured on Redis's clock, as ``extra``.)
* Client CPU is read from ``/proc`` for the whole worker process tree
  (user + system, including reaped children such as rq's work horses).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REC_DIR_ENV = "BENCH_REC_DIR"
CRASH_PREFIX = "crash"
PAYLOAD_BYTES = 100
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- recording


class Recorder:
    """Appends one line per handler start to ``$BENCH_REC_DIR/rec-<pid>.txt``.

    Reopens its file after a fork (rq forks a work horse per job, celery a
    pool of children), so each process writes its own file.
    """

    def __init__(self) -> None:
        self._pid = -1
        self._fd = -1

    def record(self, event_id: str, extra: str = "") -> float:
        """Record that the handler of ``event_id`` starts now; return the time."""
        now = time.time()
        pid = os.getpid()
        if pid != self._pid:
            directory = os.environ[REC_DIR_ENV]
            self._fd = os.open(
                os.path.join(directory, f"rec-{pid}.txt"),
                os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                0o644,
            )
            self._pid = pid
        os.write(self._fd, f"{event_id} {now:.6f} {extra}\n".encode())
        return now


REC = Recorder()


def is_crash(event_id: str) -> bool:
    """True for the events of the crash-recovery workload: their handler never returns."""
    return event_id.startswith(CRASH_PREFIX)


class Collector:
    """Reads the records written by workers, incrementally.

    :meth:`poll` only counts new lines (cheap, so the driver takes little CPU
    from the workers it measures); :attr:`records` parses them when asked.
    """

    def __init__(self, directory: Path):
        self.dir = directory
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self._raw: list[tuple[int, bytes]] = []  # (pid, complete lines) not parsed yet
        self._records: list[tuple[str, float, str, int]] = []  # id, time, extra, pid
        self.count = 0
        self.pids: set[int] = set()

    def poll(self) -> int:
        """Read new lines; return how many records there are in all."""
        for path in self.dir.glob("rec-*.txt"):
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
            if not data:
                continue
            self._offsets[path] = offset + len(data)
            data = self._partial.pop(path, b"") + data
            cut = data.rfind(b"\n") + 1
            if cut < len(data):
                self._partial[path] = data[cut:]
            if cut:
                pid = int(path.stem.split("-")[1])
                self._raw.append((pid, data[:cut]))
                self.count += data.count(b"\n", 0, cut)
                self.pids.add(pid)
        return self.count

    @property
    def records(self) -> list[tuple[str, float, str, int]]:
        """Every record read so far: (id, time, extra, pid)."""
        if self._raw:
            for pid, chunk in self._raw:
                for line in chunk.decode().splitlines():
                    parts = line.split(" ", 2)
                    extra = parts[2] if len(parts) > 2 else ""
                    self._records.append((parts[0], float(parts[1]), extra, pid))
            self._raw = []
        return self._records

    def first_by_id(self) -> dict[str, tuple[float, str]]:
        """The first record of each id (time, extra)."""
        first: dict[str, tuple[float, str]] = {}
        for event_id, t, extra, _ in self.records:
            if event_id not in first or t < first[event_id][0]:
                first[event_id] = (t, extra)
        return first

    def has_all(self, ids: set[str] | dict[str, Any], since: int = 0) -> bool:
        """True once every id has a record (parses only when the count allows it)."""
        if self.count - since < len(ids):
            return False
        seen = {r[0] for r in self.records}
        return all(i in seen for i in ids)


# --------------------------------------------------------------------------- processes


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode()
    except OSError:
        return None
    # the command name may contain spaces: split after its closing parenthesis
    return raw[raw.rfind(")") + 2 :].split()


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                children.setdefault(int(st[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def tree_cpu(roots: Sequence[int]) -> float:
    """CPU seconds (user + system, with reaped children) of processes and their descendants."""
    total = 0
    for root in roots:
        for pid in [root, *descendants(root)]:
            st = _stat(pid)
            if st is not None:
                # fields 14-17 of /proc/pid/stat: utime stime cutime cstime
                total += sum(int(x) for x in st[11:15])
    return total / _CLK_TCK


def kill_tree(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to a worker and everything it started, then reap it."""
    pids = [proc.pid, *descendants(proc.pid)]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    if sig == signal.SIGKILL:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def stop(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM a worker tree, then SIGKILL whatever is left after ``grace``."""
    if proc.poll() is None:
        pids = [proc.pid, *descendants(proc.pid)]
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    kill_tree(proc)


# --------------------------------------------------------------------------- redis helpers


def redis_info(url: str, section: str) -> dict[str, str]:
    """``INFO section`` as a dict of strings."""
    import redis

    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return {k: str(v) for k, v in client.info(section).items()}
    finally:
        client.close()


def flushall(url: str) -> None:
    """Empty the benchmark Redis before a workload."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushall()
    finally:
        client.close()


class Monitor:
    """Counts the commands Redis receives, via ``MONITOR`` on a raw socket."""

    def __init__(self, url: str):
        host_port = url.split("//", 1)[1].split("/", 1)[0]
        host, port = host_port.rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)))
        self._sock.sendall(b"MONITOR\r\n")
        self.commands: Counter[str] = Counter()
        self.total = 0
        self._stop = False
        self._buf = b""
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        first = True
        self._sock.settimeout(0.2)
        while not self._stop:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            self._buf += data
            *lines, self._buf = self._buf.split(b"\r\n")
            for line in lines:
                if first:  # +OK
                    first = False
                    continue
                # +1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "..."
                parts = line.split(b'"', 2)
                name = parts[1].decode(errors="replace").upper() if len(parts) > 1 else "?"
                if b"[0 lua]" in line:
                    continue  # calls made inside scripts: not sent by clients
                self.commands[name] += 1
                self.total += 1

    def close(self) -> None:
        """Stop counting."""
        self._stop = True
        self._thread.join(timeout=2)
        self._sock.close()


# --------------------------------------------------------------------------- statistics


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (0..100) of an already sorted sequence."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def lateness_stats(values: Sequence[float], prefix: str = "") -> dict[str, float]:
    """p50/p90/p99/p99.9/max/min/mean and the count of early deliveries, in ms."""
    s = sorted(values)
    if not s:
        return {f"{prefix}count": 0}
    return {
        f"{prefix}count": len(s),
        f"{prefix}p50_ms": round(percentile(s, 50), 3),
        f"{prefix}p90_ms": round(percentile(s, 90), 3),
        f"{prefix}p99_ms": round(percentile(s, 99), 3),
        f"{prefix}p999_ms": round(percentile(s, 99.9), 3),
        f"{prefix}max_ms": round(s[-1], 3),
        f"{prefix}min_ms": round(s[0], 3),
        f"{prefix}mean_ms": round(sum(s) / len(s), 3),
        f"{prefix}early": sum(1 for v in s if v < 0),
    }


# --------------------------------------------------------------------------- adapters


class Adapter:
    """What a library adapter provides; the shared workloads live in :class:`Runner`.

    Subclasses set the class attributes and implement :meth:`enqueue` and
    :meth:`run_worker`; the rest has defaults.
    """

    library = ""
    """The library's name (and its adapter module's last component)."""
    distributions: tuple[str, ...] = ()
    """Installed distributions whose versions are reported."""
    variants: dict[str, dict[str, Any]] = {"default": {}}
    """Variant name -> options; "default" is the library's documented defaults."""
    workloads: tuple[str, ...] = ("lateness", "sustained", "throughput", "crash", "memory", "idle")
    """Workloads that make sense for this library."""
    lateness_grace = 30.0
    """Seconds to wait past the last due time before calling events missing."""
    enqueue_batch = 100
    """Events handed to one :meth:`enqueue` call by the shared workloads."""
    bulk_batch = 100
    """Events per :meth:`enqueue` call when filling Redis (memory workload)."""

    def __init__(self, url: str, variant: str):
        self.url = url
        self.variant = variant
        self.options = self.variants[variant]
        self.notes: list[str] = []

    # -- producer side ---------------------------------------------------------------

    def setup(self) -> None:
        """Connect the producer."""

    def teardown(self) -> None:
        """Release the producer's connections."""

    def enqueue(self, items: Sequence[tuple[str, float]], payload: str = "") -> list[float]:
        """Enqueue ``(id, delay seconds)`` items; return each one's due time (``time.time()`` base).

        A delay <= 0 means "run now" through the library's plain enqueue.
        """
        raise NotImplementedError

    def describe(self, workload: str, params: dict[str, Any]) -> list[str]:
        """Notes on how this library runs ``workload`` (settings, caveats)."""
        return []

    # -- worker side -----------------------------------------------------------------

    def worker_argv(self, concurrency: int, types: int) -> list[str]:
        """The command that starts one worker process (run from the repository root)."""
        return [
            sys.executable, "-m", f"benchmarks.peers.{self.library}", "worker",
            "--variant", self.variant, "--redis-url", self.url,
            "--concurrency", str(concurrency), "--types", str(types),
        ]  # fmt: skip

    def helper_argvs(self) -> list[list[str]]:
        """Extra processes a deployment needs (e.g. a separate scheduler), started once."""
        return []

    def run_worker(self, concurrency: int, types: int) -> None:
        """Body of a worker process: handle events until SIGTERM/SIGKILL."""
        raise NotImplementedError

    def versions(self) -> dict[str, str]:
        """Versions of the library and of redis-py in this environment."""
        found = {}
        for dist in (*self.distributions, "redis", "hiredis"):
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                found[dist] = importlib.metadata.version(dist)
        found["python"] = sys.version.split()[0]
        return found


class Runner:
    """Runs one workload of one adapter and builds the JSON result."""

    def __init__(self, adapter: Adapter, workload: str, params: dict[str, Any], workdir: Path):
        self.a = adapter
        self.workload = workload
        self.params = params
        self.workdir = workdir
        self.rec_dir = workdir / "rec"
        self.rec_dir.mkdir(parents=True, exist_ok=True)
        self.collector = Collector(self.rec_dir)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.helpers: list[subprocess.Popen[bytes]] = []
        self.metrics: dict[str, Any] = {}
        self.samples: dict[str, list[float]] = {}
        self._spawned = 0

    # -- process control ----------------------------------------------------------

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        self._spawned += 1
        log = open(self.workdir / f"proc-{self._spawned}.log", "wb")
        env = {**os.environ, REC_DIR_ENV: str(self.rec_dir), "PYTHONUNBUFFERED": "1"}
        try:
            return subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                cwd=Path(__file__).resolve().parents[2],
            )  # fmt: skip
        finally:
            log.close()

    def start_workers(self, count: int, concurrency: int, types: int = 1) -> None:
        """Start ``count`` worker processes (and the library's helpers once)."""
        if not self.helpers:
            self.helpers = [self._spawn(argv) for argv in self.a.helper_argvs()]
        for _ in range(count):
            self.procs.append(self._spawn(self.a.worker_argv(concurrency, types)))

    def stop_all(self) -> None:
        """Stop every process this runner started."""
        for proc in self.procs + self.helpers:
            stop(proc, grace=3.0)
        self.procs, self.helpers = [], []

    def check_alive(self) -> None:
        """Raise when a worker died on its own (its log tells why)."""
        for i, proc in enumerate(self.procs + self.helpers):
            if proc.poll() is not None:
                raise RuntimeError(f"process {i} exited with {proc.returncode}: {self.tail_logs()}")

    def tail_logs(self, chars: int = 1500) -> str:
        """The end of every process log, for error messages."""
        out = []
        for path in sorted(self.workdir.glob("proc-*.log")):
            text = path.read_text(errors="replace")
            out.append(f"--- {path.name}\n{text[-chars:]}")
        return "\n".join(out)

    def worker_roots(self) -> list[int]:
        """Pids of the worker processes (not helpers)."""
        return [p.pid for p in self.procs]

    def cpu_roots(self) -> list[int]:
        """Pids whose process trees count as client CPU: workers and helpers."""
        return [p.pid for p in self.procs + self.helpers]

    def wait_records(
        self, predicate: Callable[[], bool], timeout: float, poll: float = 0.02,
        on_poll: Callable[[], None] | None = None,
    ) -> bool:  # fmt: skip
        """Poll the records until ``predicate()`` or ``timeout``; check workers stay alive."""
        deadline = time.monotonic() + timeout
        last_check = 0.0
        while True:
            self.collector.poll()
            if on_poll is not None:
                on_poll()
            if predicate():
                return True
            if time.monotonic() > deadline:
                return False
            if time.monotonic() - last_check > 1.0:
                self.check_alive()
                last_check = time.monotonic()
            time.sleep(poll)

    def warm_up(self, timeout: float = 60.0) -> None:
        """Send immediate probe events until one is handled: the workers are up."""
        deadline = time.monotonic() + timeout
        k = 0
        while time.monotonic() < deadline:
            probe = f"warm-{k}"
            self.a.enqueue([(probe, 0.0)])
            if self.wait_records(lambda p=probe: self._seen(p), timeout=min(3.0, timeout)):
                return
            k += 1
        raise RuntimeError(f"workers did not handle a probe within {timeout}s: {self.tail_logs()}")

    def _seen(self, event_id: str) -> bool:
        return any(r[0] == event_id for r in self.collector.records)

    # -- workloads ---------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run the workload; return the JSON result."""
        started = time.time()
        result: dict[str, Any] = {
            "library": self.a.library,
            "variant": self.a.variant,
            "label": self.a.library
            if self.a.variant == "default"
            else f"{self.a.library} ({self.a.variant})",
            "workload": self.workload,
            "versions": self.a.versions(),
            "params": self.params,
            "ok": False,
            "error": None,
            "notes": list(self.a.describe(self.workload, self.params)),
        }
        flush = self.params.pop("flush", True)
        try:
            if flush:
                flushall(self.a.url)
            self.a.setup()
            try:
                getattr(self, f"w_{self.workload}")(**self.params)
            finally:
                self.stop_all()
                self.a.teardown()
            result["ok"] = True
        except Exception as exc:  # reported in the JSON, the harness goes on
            result["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
            self.stop_all()
        result["notes"] += self.a.notes
        result["metrics"] = self.metrics
        result["samples"] = self.samples
        result["duration_s"] = round(time.time() - started, 2)
        return result

    def _enqueue_all(
        self, items: Sequence[tuple[str, float]], payload: str = "", step: int = 0
    ) -> dict[str, float]:
        dues: dict[str, float] = {}
        step = step or self.a.enqueue_batch
        for i in range(0, len(items), step):
            chunk = items[i : i + step]
            for (event_id, _), due in zip(chunk, self.a.enqueue(chunk, payload), strict=True):
                dues[event_id] = due
        return dues

    def _lateness(self, dues: dict[str, float]) -> None:
        first = self.collector.first_by_id()
        late = [(first[i][0] - due) * 1000 for i, due in dues.items() if i in first]
        self.metrics.update(lateness_stats(late))
        self.samples["lateness_ms"] = [round(v, 3) for v in late]
        counts = Counter(r[0] for r in self.collector.records if r[0] in dues)
        self.metrics["missing"] = len(dues) - len(counts)
        self.metrics["duplicates"] = sum(c - 1 for c in counts.values())
        # delayq reports Delivery.lateness_ms (Redis's clock) as the record's extra field
        redis_late = []
        for i in dues:
            if i in first and first[i][1].strip():
                with contextlib.suppress(ValueError):
                    redis_late.append(float(first[i][1]))
        if redis_late:
            self.metrics.update(lateness_stats(redis_late, prefix="redis_"))
            self.samples["redis_lateness_ms"] = [round(v, 3) for v in redis_late]

    def w_lateness(
        self, n: int = 5000, spread: float = 10.0, min_delay: float = 2.0, concurrency: int = 100,
        seed: int = 1,
    ) -> None:  # fmt: skip
        """N events, delays uniform in [min_delay, min_delay + spread], one worker."""
        rng = random.Random(seed)
        items = [(f"L{i}", min_delay + spread * rng.random()) for i in range(n)]
        self.start_workers(1, concurrency)
        self.warm_up()
        cpu0 = tree_cpu(self.cpu_roots())
        t0 = time.time()
        dues = self._enqueue_all(items)
        self.metrics["enqueue_s"] = round(time.time() - t0, 3)
        last_due = max(dues.values())
        self.wait_records(
            lambda: self.collector.has_all(dues),
            timeout=max(0.0, last_due - time.time()) + self.a.lateness_grace,
            poll=0.1,
        )
        self.metrics["worker_cpu_s"] = round(tree_cpu(self.cpu_roots()) - cpu0, 3)
        self._lateness(dues)

    def w_sustained(
        self, rate: float = 2000.0, duration: float = 10.0, delay: float = 1.0,
        concurrency: int = 100,
    ) -> None:  # fmt: skip
        """Enqueue ``rate`` events/s for ``duration`` s, each due ``delay`` s later."""
        self.start_workers(1, concurrency)
        self.warm_up()
        tick = 0.01
        per_tick = max(1, round(rate * tick))
        dues: dict[str, float] = {}
        start = time.monotonic()
        sent = 0
        behind = 0
        while time.monotonic() - start < duration:
            chunk = [(f"S{sent + j}", delay) for j in range(per_tick)]
            for (event_id, _), due in zip(chunk, self.a.enqueue(chunk), strict=True):
                dues[event_id] = due
            sent += per_tick
            target = start + sent / rate
            pause = target - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                behind += 1
        elapsed = time.monotonic() - start
        self.metrics["offered_rate"] = rate
        self.metrics["achieved_rate"] = round(sent / elapsed, 1)
        self.metrics["sent"] = sent
        ids = set(dues)
        self.wait_records(
            lambda: self.collector.has_all(ids), timeout=delay + self.a.lateness_grace, poll=0.1
        )
        self._lateness(dues)

    def w_throughput(
        self, n: int = 100_000, procs: int = 1, concurrency: int = 100, cap: float = 60.0,
        spread: float = 0.0, lead: float = 5.0,
    ) -> None:  # fmt: skip
        """N events due now (or over ``spread`` s), handled by ``procs`` worker processes.

        Due-now: the events are enqueued before the workers start. The rate is
        counted from the moment every worker process has handled an event (so
        start-up is excluded) to the last handled event, or to ``cap`` seconds.
        """
        self.metrics["n"] = n
        if spread > 0:
            self._throughput_spread(n, procs, concurrency, cap, spread, lead)
            return
        items = [(f"T{i}", 0.0) for i in range(n)]
        t0 = time.time()
        deadline = t0 + cap
        dues: dict[str, float] = {}
        step = self.a.enqueue_batch
        for i in range(0, n, step):
            chunk = items[i : i + step]
            for (event_id, _), due in zip(chunk, self.a.enqueue(chunk), strict=True):
                dues[event_id] = due
            if time.time() > deadline:
                self.notes_add(f"enqueue stopped after {cap}s at {len(dues)} events")
                break
        enq_s = time.time() - t0
        self.metrics["enqueued"] = len(dues)
        self.metrics["enqueue_rate"] = round(len(dues) / enq_s, 1)
        spawned = time.time()
        self.start_workers(procs, concurrency)
        state: dict[str, Any] = {}
        roots = self.worker_roots()
        cpu_roots = self.cpu_roots()

        def on_poll() -> None:
            if "t0" in state or not self.collector.count:
                return
            if len(self._roots_with_records(roots)) >= len(roots):
                state["t0"] = time.time()
                state["count0"] = self.collector.count
                state["cpu0"] = tree_cpu(cpu_roots)

        # start-up (slow on a loaded machine) does not count against the cap
        if not self.wait_records(lambda: self.collector.count > 0, timeout=120, poll=0.02):
            raise RuntimeError(f"no event handled within 120 s of start: {self.tail_logs()}")
        finished = self.wait_records(
            lambda: self.collector.count >= len(dues), timeout=cap, on_poll=on_poll,
            poll=0.02,
        )  # fmt: skip
        if not finished:
            self.notes_add(f"stopped after the {cap}s cap")
        cpu1 = tree_cpu(cpu_roots)
        count = len(self.collector.records)
        t_last = max(r[1] for r in self.collector.records) if count else time.time()
        if "t0" not in state or count - state["count0"] <= 0:
            # the work ended before (or just as) every worker had handled an event (a
            # small n):
            # count from the first handled event; CPU then includes start-up
            t_first = min(r[1] for r in self.collector.records) if count else spawned
            state.update(t0=t_first, count0=0, cpu0=0.0)
            self.notes_add("not every worker started before the work ended: rate counted "
                           "from the first handled event, CPU includes start-up")  # fmt: skip
        if cpu1 - state["cpu0"] <= 0:
            # the window was shorter than the clock tick (10 ms) of /proc CPU times
            state["cpu0"] = 0.0
            self.notes_add("the work took less than a CPU clock tick: CPU includes start-up")
        self.metrics["handled"] = count
        self.metrics["startup_s"] = round(state["t0"] - spawned, 3)
        window = max(1e-9, t_last - state["t0"])
        self.metrics["rate"] = round((count - state["count0"]) / window, 1)
        self.metrics["cpu_per_event_us"] = round(
            1e6 * (cpu1 - state["cpu0"]) / max(1, count - state["count0"]), 1
        )
        self.metrics["window_s"] = round(window, 3)

    def _throughput_spread(
        self, n: int, procs: int, concurrency: int, cap: float, spread: float, lead: float
    ) -> None:
        """N events due uniformly over ``spread`` s, starting ``lead`` s from now.

        The workers run while the events are enqueued; every due time lies in
        one window after the enqueueing ends, so the window offers n/spread
        events per second whatever the producer's speed. The rate counts from
        the window's start to the last handled event.
        """
        self.start_workers(procs, concurrency)
        self.warm_up()
        count0 = self.collector.poll()
        cpu0 = tree_cpu(self.cpu_roots())
        rng = random.Random(2)
        t_window = time.time() + lead
        offsets = [spread * rng.random() for _ in range(n)]
        dues: dict[str, float] = {}
        step = self.a.enqueue_batch
        t0 = time.time()
        for i in range(0, n, step):
            now = time.time()
            chunk = [(f"T{j}", t_window + offsets[j] - now) for j in range(i, min(n, i + step))]
            for (event_id, _), due in zip(chunk, self.a.enqueue(chunk), strict=True):
                dues[event_id] = due
        t1 = time.time()
        self.metrics["enqueue_rate"] = round(n / (t1 - t0), 1)
        if t1 > t_window:
            self.notes_add(f"enqueueing ran {t1 - t_window:.2f}s into the due window")
        self.wait_records(
            lambda: self.collector.has_all(dues, since=count0), timeout=lead + spread + cap,
            poll=0.05,
        )  # fmt: skip
        cpu1 = tree_cpu(self.cpu_roots())
        done = [r for r in self.collector.records[count0:] if r[0] in dues]
        t_last = max((r[1] for r in done), default=t_window)
        self.metrics.update(
            n=n,
            spread_s=spread,
            handled=len(done),
            offered_rate=round(n / spread, 1),
            rate=round(len(done) / max(1e-9, t_last - t_window), 1),
            cpu_per_event_us=round(1e6 * (cpu1 - cpu0) / max(1, len(done)), 1),
        )
        self._lateness(dues)
        self.samples.pop("lateness_ms", None)
        self.samples.pop("redis_lateness_ms", None)

    def notes_add(self, note: str) -> None:
        """Add a note to the result."""
        self.a.notes.append(note)

    def _roots_with_records(self, roots: list[int]) -> set[int]:
        pid_root = {}
        for root in roots:
            pid_root[root] = root
            for pid in descendants(root):
                pid_root[pid] = root
        return {pid_root[pid] for pid in self.collector.pids if pid in pid_root}

    def w_crash(self, cap: float = 330.0, run_for: float = 1.0) -> None:
        """SIGKILL a worker mid-handler; time until another worker starts the event."""
        self.start_workers(1, 10)
        self.warm_up()
        event_id = f"{CRASH_PREFIX}-1"
        self.a.enqueue([(event_id, 0.0)])
        if not self.wait_records(lambda: self._seen(event_id), timeout=30):
            raise RuntimeError("the crash event never started")
        time.sleep(run_for)
        victim = self.procs.pop()
        kill_tree(victim)
        killed = time.time()
        self.start_workers(1, 10)
        count = sum(1 for r in self.collector.records if r[0] == event_id)
        recovered = self.wait_records(
            lambda: sum(1 for r in self.collector.records if r[0] == event_id) > count,
            timeout=cap,
            poll=0.1,
        )
        if recovered:
            again = max(r[1] for r in self.collector.records if r[0] == event_id)
            self.metrics["recovery_s"] = round(again - killed, 2)
        else:
            self.metrics["recovery_s"] = None
            self.metrics["recovery_over_s"] = cap
        self.metrics["cap_s"] = cap

    def w_memory(
        self, n: int = 100_000, payload: int = PAYLOAD_BYTES, delay: float = 3600.0
    ) -> None:
        """Redis ``used_memory`` per scheduled event with a ``payload``-byte payload."""
        text = "x" * payload
        self.a.enqueue([("mem-warm", delay)], text)  # create keys and load scripts first
        before = int(redis_info(self.a.url, "memory")["used_memory"])
        t0 = time.time()
        self._enqueue_all([(f"M{i:07d}", delay) for i in range(n)], text, self.a.bulk_batch)
        self.metrics["enqueue_rate"] = round(n / (time.time() - t0), 1)
        after = int(redis_info(self.a.url, "memory")["used_memory"])
        per_event = (after - before) / n
        self.metrics.update(
            n=n,
            payload_bytes=payload,
            used_memory_before=before,
            used_memory_after=after,
            bytes_per_event=round(per_event, 1),
            overhead_bytes_per_event=round(per_event - payload, 1),
        )

    def w_idle(self, types: int = 20, duration: float = 20.0, settle: float = 3.0) -> None:
        """Commands/s (MONITOR) and CPU of one idle worker with ``types`` event types."""
        self.start_workers(1, 10, types)
        self.warm_up()
        time.sleep(settle)
        monitor = Monitor(self.a.url)
        cpu0 = tree_cpu(self.cpu_roots())
        t0 = time.monotonic()
        time.sleep(duration)
        cpu1 = tree_cpu(self.cpu_roots())
        elapsed = time.monotonic() - t0
        monitor.close()
        self.metrics.update(
            types=types,
            seconds=round(elapsed, 2),
            commands=monitor.total,
            commands_per_s=round(monitor.total / elapsed, 2),
            commands_per_s_per_type=round(monitor.total / elapsed / types, 3),
            cpu_percent=round(100 * (cpu1 - cpu0) / elapsed, 3),
            by_command=dict(monitor.commands.most_common(12)),
        )


# --------------------------------------------------------------------------- entry point


def _parse_params(pairs: Sequence[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        params[key] = json.loads(value)
    return params


def main(adapter_cls: type[Adapter], argv: Sequence[str] | None = None) -> None:
    """Command line of an adapter module (see the module docstring)."""
    parser = argparse.ArgumentParser(prog=f"benchmarks.peers.{adapter_cls.library}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("versions")
    sub.add_parser("info")
    run = sub.add_parser("run")
    run.add_argument("--workload", required=True)
    run.add_argument("--variant", default="default")
    run.add_argument("--redis-url", required=True)
    run.add_argument("--out", required=True)
    run.add_argument("--workdir", required=True)
    run.add_argument("--param", action="append", default=[])
    worker = sub.add_parser("worker")
    worker.add_argument("--variant", default="default")
    worker.add_argument("--redis-url", required=True)
    worker.add_argument("--concurrency", type=int, default=10)
    worker.add_argument("--types", type=int, default=1)
    args = parser.parse_args(argv)
    if args.cmd == "versions":
        print(json.dumps(adapter_cls("redis://unused:0", "default").versions()))
    elif args.cmd == "info":
        print(json.dumps({"variants": list(adapter_cls.variants),
                          "workloads": list(adapter_cls.workloads)}))  # fmt: skip
    elif args.cmd == "worker":
        adapter_cls(args.redis_url, args.variant).run_worker(args.concurrency, args.types)
    else:
        adapter = adapter_cls(args.redis_url, args.variant)
        runner_cls = getattr(adapter, "runner_class", Runner)
        runner = runner_cls(adapter, args.workload, _parse_params(args.param), Path(args.workdir))
        result = runner.run()
        Path(args.out).write_text(json.dumps(result))
        if not result["ok"]:
            print(result["error"], file=sys.stderr)
            sys.exit(1)
