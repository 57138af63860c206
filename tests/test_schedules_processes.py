"""Recurring schedules with several worker processes: each slot fired exactly once, also
while processes are SIGKILLed (workers: tests/schedule_worker.py)."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from delayq import Event, EventService

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "schedule_worker.py"


class SchedJob(Event, event_name="sched-job"):
    n: int = 0


class Procs:
    def __init__(self, url: str, prefix: str, logs: Path):
        self.url, self.prefix, self.logs = url, prefix, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *extra: str) -> None:
        with open(self.logs / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, str(WORKER), self.url, self.prefix, name, *extra],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    async def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            for _ in range(300):
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            else:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def procs(redis_url: str, prefix: str, tmp_path: Path):
    group = Procs(redis_url, prefix, tmp_path)
    yield group
    group.close()


@pytest.fixture
async def raw(redis_url: str):
    client = aioredis.Redis.from_url(redis_url, protocol=2)
    yield client
    await client.aclose()


async def _ready(raw: aioredis.Redis, prefix: str, n: int, wait_for) -> None:
    await wait_for(lambda: _count_ready(raw, prefix, n), timeout=60)


async def _count_ready(raw: aioredis.Redis, prefix: str, n: int) -> bool:
    return int(await raw.scard(f"{prefix}-test:ready")) >= n


def _check_once_per_slot(counts: dict[bytes, bytes], name: str, step_ms: int) -> int:
    """Every slot of ``name`` between its first and last fire fired exactly once."""
    mine = {k.decode(): int(v) for k, v in counts.items() if k.decode().startswith(name + "@")}
    assert mine, f"{name} never fired"
    doubled = {k: v for k, v in mine.items() if v != 1}
    assert not doubled, f"{name}: fired more than once: {doubled}"
    return len(mine)


async def _slots(raw: aioredis.Redis, prefix: str, name: str) -> list[int]:
    slots = await raw.hgetall(f"{prefix}-test:slot")
    return sorted(int(v) for k, v in slots.items() if k.decode().startswith(name + "@"))


@pytest.mark.parametrize("n", [1, 3, 8])
async def test_every_second_and_cron_fire_once_per_slot(
    redis_url: str, prefix: str, procs: Procs, raw, wait_for, n: int
) -> None:
    for i in range(n):
        procs.start(f"w{i}")
    await _ready(raw, prefix, n, wait_for)
    producer = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    await producer.schedule("every", SchedJob, every=timedelta(seconds=1), overlap="allow")
    await producer.schedule("cron", SchedJob, cron="* * * * * *", timezone="America/New_York",
                            overlap="allow")  # fmt: skip
    await asyncio.sleep(4.5)
    await producer.unschedule("every")
    await producer.unschedule("cron")
    await asyncio.sleep(1.0)
    await procs.stop_all()
    await producer.aclose()
    counts = await raw.hgetall(f"{prefix}-test:count")
    for name in ("every", "cron"):
        assert _check_once_per_slot(counts, name, 1000) >= 3
        slots = await _slots(raw, prefix, name)
        assert slots == list(range(slots[0], slots[-1] + 1, 1000)), f"{name}: a slot was lost"


async def test_buffer_one_never_runs_two_fires_at_once_across_processes(
    redis_url: str, prefix: str, procs: Procs, raw, wait_for
) -> None:
    for i in range(3):
        procs.start(f"w{i}", "--sleep", "2.2")  # 8 handler slots each: plenty to overlap
    await _ready(raw, prefix, 3, wait_for)
    producer = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    await producer.schedule("buf", SchedJob, every=timedelta(seconds=1), overlap="buffer_one")

    async def runs() -> int:
        return len(await _slots(raw, prefix, "buf"))

    await wait_for(lambda: _at_least(runs, 4), timeout=30)
    info = await producer.schedule_info("buf")
    await producer.unschedule("buf")
    await procs.stop_all()
    await producer.aclose()
    assert info is not None and info.skipped >= 2
    assert int(await raw.get(f"{prefix}-test:overlaps") or 0) == 0
    _check_once_per_slot(await raw.hgetall(f"{prefix}-test:count"), "buf", 1000)


async def _at_least(count, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await count() >= n


@pytest.mark.slow
async def test_sigkill_a_random_process_every_2s_loses_and_doubles_nothing(
    redis_url: str, prefix: str, procs: Procs, raw, wait_for
) -> None:
    names = [f"w{i}" for i in range(4)]
    for name in names:
        procs.start(name)
    await _ready(raw, prefix, len(names), wait_for)
    producer = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    await producer.schedule("chaos", SchedJob, every=timedelta(seconds=1), overlap="allow",
                            catch_up=timedelta(minutes=5))  # fmt: skip
    rng = random.Random(21)
    end = time.monotonic() + 60
    kills = 0
    while time.monotonic() < end:
        await asyncio.sleep(2)
        victim = rng.choice(names)
        procs.kill(victim)
        kills += 1
        procs.start(victim)
    await asyncio.sleep(3)  # the last slots fire (a standby takes over within the lock TTL)
    await producer.unschedule("chaos")
    # redeliveries of fires whose handler was killed come back after the visibility timeout
    await asyncio.sleep(7)
    await procs.stop_all()
    await producer.aclose()
    counts = await raw.hgetall(f"{prefix}-test:count")
    assert _check_once_per_slot(counts, "chaos", 1000) >= 55
    slots = await _slots(raw, prefix, "chaos")
    assert slots == list(range(slots[0], slots[-1] + 1, 1000)), "a slot was lost"
    assert kills >= 25
