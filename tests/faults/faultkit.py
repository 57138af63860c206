"""Shared pieces of the fault-injection suite and ``scripts/soak.py``.

* :class:`Job` — the event type every fault test and the soak enqueue;
* :class:`WorkerPool` — starts ``faultworker.py`` OS processes against a queue Redis, kills
  them with SIGKILL, freezes them with SIGSTOP, and remembers which events each killed or
  frozen process was in the middle of;
* :func:`reconcile` — compares what was enqueued with what the workers recorded.

Workers record into a separate *recorder* Redis (never the queue's, so a queue Redis crash
cannot erase the evidence), under ``rec:{run}:``:

=========================== ====== ==========================================================
``rec:{run}:start``         HASH   id -> handler starts
``rec:{run}:end``           HASH   id -> handler successes
``rec:{run}:fail``          HASH   id -> handler failures (planned ones, ``Job.fail_times``)
``rec:{run}:inprog:{pid}``  SET    ids process ``pid`` started and has not yet acked or failed
``rec:{run}:ready``         HASH   pid -> 1 once its service has started
``rec:{run}:tokens``        HASH   scheduler token -> pid
``rec:{run}:late``          LIST   lateness (ms, Redis clock) of each first delivery
``rec:{run}:due-late``      LIST   ``"<due ms> <lateness ms>"`` of each first delivery
``rec:{run}:moves``         HASH   leader / standby -> scheduler ``move_due`` calls
                                   (with ``--count-moves``)
``rec:{run}:stalled``       HASH   id -> times it was in progress in a process whose event
                                   loop a ``Job.block_ms`` handler then blocked
``rec:{run}:declared``      LIST   ``"<pid> <unix s>"`` when a process declared its schedule
                                   (with ``--declare-every``)
=========================== ====== ==========================================================

An id still in ``inprog:{pid}`` when ``pid`` dies was *interrupted*: the handler was running,
or had finished but its ack had not been written yet. Such an event may legitimately run again.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from delayq import Event

__all__ = [
    "WORKER",
    "Job",
    "Reconciliation",
    "WorkerPool",
    "job_types",
    "read_counter",
    "read_records",
    "reconcile",
]

WORKER = str(Path(__file__).with_name("faultworker.py"))


class Job(Event, event_name="fault-job"):
    """A test event: the handler sleeps ``sleep_ms`` (awaiting), blocks the event loop for
    ``block_ms`` (``time.sleep``), and fails on its first ``fail_times`` deliveries."""

    seq: int = 0
    sleep_ms: int = 0
    block_ms: int = 0
    fail_times: int = 0


_JOB_TYPES: list[type[Job]] = [Job]


def job_types(n: int) -> list[type[Job]]:
    """``Job`` and ``n - 1`` more types like it (wire names ``fault-job-2`` ...), made once
    per process so that producers and workers agree."""
    while len(_JOB_TYPES) < n:
        name = f"fault-job-{len(_JOB_TYPES) + 1}"
        _JOB_TYPES.append(type(name, (Job,), {"__doc__": f"{name} events"}, event_name=name))
    return _JOB_TYPES[:n]


def rec_key(run: str, what: str) -> str:
    """The recorder key ``rec:{run}:{what}``."""
    return f"rec:{run}:{what}"


@dataclass
class Worker:
    """One worker OS process."""

    proc: subprocess.Popen[bytes]
    args: list[str]
    log_path: str

    @property
    def pid(self) -> int:
        """Its process id."""
        return self.proc.pid


@dataclass
class WorkerPool:
    """Worker processes running ``faultworker.py`` against one queue Redis.

    ``interrupted`` counts, per event id, how many times a process died (SIGKILL) or was
    frozen past its lease while that event was in progress there.
    """

    url: str
    rec_url: str
    prefix: str
    run: str
    log_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="delayq-workers-"))
    workers: list[Worker] = field(default_factory=list)
    interrupted: collections.Counter[str] = field(default_factory=collections.Counter)
    kills: int = 0

    def spawn(self, *extra: str, count: int = 1) -> list[Worker]:
        """Start ``count`` workers with extra command-line options (see faultworker.py)."""
        started = []
        for _ in range(count):
            args = [
                sys.executable,
                WORKER,
                "--url",
                self.url,
                "--rec-url",
                self.rec_url,
                "--prefix",
                self.prefix,
                "--run",
                self.run,
                *extra,
            ]
            log_path = os.path.join(self.log_dir, f"worker-{len(self.workers)}.log")
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            worker = Worker(proc, list(extra), log_path)
            self.workers.append(worker)
            started.append(worker)
        return started

    @property
    def alive(self) -> list[Worker]:
        """Workers whose process is still running."""
        return [w for w in self.workers if w.proc.poll() is None]

    async def wait_ready(self, rec: aioredis.Redis, workers: Iterable[Worker], timeout=30.0):
        """Wait until each of ``workers`` reported that its service started."""
        pending = {w.pid: w for w in workers}
        deadline = time.monotonic() + timeout
        while pending:
            ready = await rec.hgetall(rec_key(self.run, "ready"))
            for pid in [p for p in pending if str(p).encode() in ready]:
                del pending[pid]
            for w in pending.values():
                if w.proc.poll() is not None:
                    raise RuntimeError(f"worker {w.pid} exited early:\n{self.tail(w)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers {sorted(pending)} did not start in {timeout}s")
            await _sleep(0.05)

    async def kill(self, rec: aioredis.Redis, worker: Worker) -> set[str]:
        """SIGKILL ``worker``; return (and count as interrupted) the ids it was handling."""
        with contextlib.suppress(ProcessLookupError):
            worker.proc.send_signal(signal.SIGCONT)  # a frozen process dies the same way
            worker.proc.kill()
        worker.proc.wait()
        self.kills += 1
        return await self.mark_interrupted(rec, worker.pid)

    async def mark_interrupted(self, rec: aioredis.Redis, pid: int) -> set[str]:
        """Count every id in progress at ``pid`` right now as interrupted once."""
        ids = {m.decode() for m in await rec.smembers(rec_key(self.run, f"inprog:{pid}"))}
        self.interrupted.update(ids)
        return ids

    def stop_all(self, timeout: float = 10.0) -> None:
        """SIGTERM every live worker (they close their service), SIGKILL stragglers."""
        for w in self.alive:
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGCONT)
                w.proc.terminate()
        deadline = time.monotonic() + timeout
        for w in self.workers:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()

    def tail(self, worker: Worker, lines: int = 30) -> str:
        """The last lines of a worker's log."""
        try:
            return "\n".join(
                Path(worker.log_path).read_text(errors="replace").splitlines()[-lines:]
            )
        except FileNotFoundError:
            return ""

    def logs(self, lines: int = 15) -> str:
        """The tail of every worker's log, for failure messages."""
        return "\n".join(f"--- worker {w.pid} ---\n{self.tail(w, lines)}" for w in self.workers)


async def _sleep(seconds: float) -> None:
    import anyio

    await anyio.sleep(seconds)


@dataclass
class Records:
    """What the workers recorded for one run."""

    start: dict[str, int]
    end: dict[str, int]
    fail: dict[str, int]


async def read_records(rec: aioredis.Redis, run: str) -> Records:
    """Read the start/end/fail hashes of ``run``."""

    async def counts(what: str) -> dict[str, int]:
        raw = await rec.hgetall(rec_key(run, what))
        return {k.decode(): int(v) for k, v in raw.items()}

    return Records(await counts("start"), await counts("end"), await counts("fail"))


async def read_counter(rec: aioredis.Redis, run: str, what: str) -> collections.Counter[str]:
    """Read the hash ``rec:{run}:{what}`` as a Counter."""
    raw = await rec.hgetall(rec_key(run, what))
    return collections.Counter({k.decode(): int(v) for k, v in raw.items()})


@dataclass
class Reconciliation:
    """The verdict of :func:`reconcile`."""

    enqueued: int
    handled: int
    dead: int
    still_queued: int
    lost: list[str]
    duplicated: int
    """Ids whose handler succeeded more than once."""
    extra_runs: int
    """Handler runs beyond one success plus the planned failures (all causes)."""
    explained: int
    """Ids with extra runs, all of which are covered by interruptions."""
    unexplained: list[str]
    """Ids that ran more often than their interruptions allow."""
    interrupted_events: int

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly summary (lists shortened)."""
        d = dict(self.__dict__)
        d["lost"] = len(self.lost)
        d["lost_sample"] = self.lost[:10]
        d["unexplained"] = len(self.unexplained)
        d["unexplained_sample"] = self.unexplained[:10]
        return d

    def __str__(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)


def reconcile(
    ids: Iterable[str],
    records: Records,
    interrupted: collections.Counter[str],
    *,
    dead: Iterable[str] = (),
    queued: Iterable[str] = (),
) -> Reconciliation:
    """Check every enqueued id: handled, dead or still queued; extra runs only if interrupted.

    An id counts as handled when its handler succeeded at least once. Extra runs of an id
    (starts - 1 - planned failures, counting only runs that did not fail) must not exceed the
    number of times a process died or stalled while that id was in progress there.
    """
    ids = list(ids)
    dead_set, queued_set = set(dead), set(queued)
    lost, unexplained = [], []
    handled = dead_n = still = duplicated = extra_total = explained = 0
    for i in ids:
        ends = records.end.get(i, 0)
        if ends:
            handled += 1
        elif i in dead_set:
            dead_n += 1
        elif i in queued_set:
            still += 1
        else:
            lost.append(i)
        if ends > 1:
            duplicated += 1
        extra = records.start.get(i, 0) - records.fail.get(i, 0) - (1 if ends else 0)
        if extra > 0:
            extra_total += extra
            if extra <= interrupted.get(i, 0):
                explained += 1
            else:
                unexplained.append(i)
    return Reconciliation(
        enqueued=len(ids),
        handled=handled,
        dead=dead_n,
        still_queued=still,
        lost=lost,
        duplicated=duplicated,
        extra_runs=extra_total,
        explained=explained,
        unexplained=unexplained,
        interrupted_events=sum(1 for i in ids if interrupted.get(i)),
    )
