"""Several services and several OS processes on one prefix: exactly once, and redelivery after
SIGKILL (issue 2, behaviour 2).

The worker processes run ``tests/core_worker.py``; they record what they handled in Redis.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from core_support import Recorder, ServicePool, drained

from delayq import Event

WORKER = Path(__file__).with_name("core_worker.py")
ROOT = Path(__file__).resolve().parents[1]


class MpJob(Event, event_name="core-mp-job"):
    """Same wire name and shape as the workers' class."""

    n: int = 0


@pytest.fixture
async def services(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix)
    yield pool
    await pool.aclose()


class Workers:
    """Starts worker processes and makes sure every one has ended when the test does."""

    def __init__(self, url: str, prefix: str, logs: Path):
        self.url = url
        self.prefix = prefix
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, mode: str, *extra: str) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "wb") as log:  # the child keeps its own copy
            proc = subprocess.Popen(
                [sys.executable, str(WORKER), self.url, self.prefix, name, mode, *extra],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    async def stop(self, name: str, timeout: float = 15.0) -> int:
        """SIGTERM (graceful close), then SIGKILL if it does not end in time."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        for _ in range(int(timeout / 0.05)):
            if proc.poll() is not None:
                return proc.returncode
            await asyncio.sleep(0.05)
        proc.kill()
        proc.wait()
        raise AssertionError(f"worker {name} ignored SIGTERM:\n{self.log(name)}")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def workers(redis_url: str, prefix: str, tmp_path: Path):
    group = Workers(redis_url, prefix, tmp_path)
    yield group
    group.close()


async def test_services_in_one_process_handle_each_event_once(services, wait_for) -> None:
    total = 600
    recorders = [Recorder() for _ in range(3)]
    for recorder in recorders:
        service = await services.start()
        service.add_handler(MpJob, recorder, concurrency=5)
    producer = services.producer()
    items = [(MpJob(id=f"e{i}", n=i), (i % 7) * 0.05) for i in range(total)]
    assert await producer.enqueue_many(items) == [True] * total
    await wait_for(lambda: sum(r.finished for r in recorders) >= total, timeout=30)
    await wait_for(lambda: drained(producer, MpJob), timeout=10)
    counts: Counter[str] = Counter()
    for recorder in recorders:
        counts.update(recorder.counts)
    assert len(counts) == total
    assert set(counts.values()) == {1}
    print(f"\nper service: {[r.finished for r in recorders]}")
    assert sum(1 for r in recorders if r.finished) >= 2


async def test_worker_processes_handle_each_event_once(
    services, workers, redis_client, prefix, wait_for
) -> None:
    names = ["w1", "w2", "w3"]
    for name in names:
        workers.start(name, "count")
    test_key = f"{prefix}-test"

    async def all_ready() -> bool:
        return await redis_client.scard(f"{test_key}:ready") == len(names)

    await wait_for(all_ready, timeout=30)
    total = 300
    producer = services.producer()
    items = [(MpJob(id=f"p{i}", n=i), (i % 5) * 0.1) for i in range(total)]
    assert await producer.enqueue_many(items) == [True] * total

    async def all_counted() -> bool:
        return await redis_client.hlen(f"{test_key}:count") == total

    await wait_for(all_counted, timeout=60)
    await wait_for(lambda: drained(producer, MpJob), timeout=10)
    counts = await redis_client.hgetall(f"{test_key}:count")
    assert {int(v) for v in counts.values()} == {1}
    by = Counter(
        v.split(b":")[0].decode() for v in (await redis_client.hgetall(f"{test_key}:by")).values()
    )
    print(f"\nper worker process: {dict(by)}")
    assert len(by) >= 2
    for name in names:
        assert await workers.stop(name) == 0, workers.log(name)
    assert (await producer.stats_for(MpJob)).dead == 0


async def test_sigkill_mid_handler_is_redelivered(
    services, workers, redis_client, prefix, wait_for
) -> None:
    test_key = f"{prefix}-test"
    victim = workers.start("victim", "hang", "--visibility", "2")

    async def ready(name: str) -> bool:
        return bool(await redis_client.sismember(f"{test_key}:ready", name))

    await wait_for(lambda: ready("victim"), timeout=30)
    producer = services.producer()
    assert await producer.enqueue_with_delay(MpJob(id="k"), 0)

    async def started() -> bytes | None:
        return await redis_client.hget(f"{test_key}:started", "k")

    assert await wait_for(started, timeout=15) == b"victim:1"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert (await producer.stats_for(MpJob)).in_flight == 1  # the lease is still held

    workers.start("rescuer", "count", "--visibility", "2")

    async def handled() -> bytes | None:
        return await redis_client.hget(f"{test_key}:by", "k")

    assert await wait_for(handled, timeout=30) == b"rescuer:2"
    await wait_for(lambda: drained(producer, MpJob), timeout=10)
    assert int(await redis_client.hget(f"{test_key}:count", "k")) == 1
    assert await workers.stop("rescuer") == 0, workers.log("rescuer")
