"""A child process for tests/test_loop_pacing.py: runs one background loop of delayq into a
state that used to make it spin, counts what it sends to Redis for 1 s and prints JSON.

``python tests/pacing_child.py CASE REDIS_URL``. A watchdog thread exits with code 3 if
the event loop stops turning for 3 s (a loop that never awaits cannot be cancelled, so
the test would hang instead of failing). Cases:

* ``spread-readonly``: the partitions' spread has joined, Redis refuses writes (now a
  replica: READONLY) and a wake-up for an owned partition is pending;
* ``spread-pool``: the same with the client's pool exhausted (``MaxConnectionsError`` is
  raised before any await);
* ``spread-no-units``: a wake-up is pending when the last partitioned type goes;
* ``scheduler-readonly``: the leader's lock renewals get READONLY with a wake-up pending;
* ``scheduler-resubscribe``: the scheduler's wake-up subscription is killed as soon as it
  is made (``CLIENT KILL TYPE pubsub`` every 20 ms), for 1.5 s;
* ``firer-pool``: the schedule firer's reads fail at once (pool exhausted) while
  ``wake()`` is called every 10 ms;
* ``supervisor-drain``: ``delayq worker --processes 2``'s supervisor, SIGTERMed, waits for
  two children that take 1.5 s to drain (its CPU time meanwhile);
* ``supervisor-early``: the SIGTERM came before the supervisor's event loop ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from redis.asyncio import Redis

from delayq import EventService, InMemoryMetrics
from delayq.partitions.spread import Spread
from delayq.runtime.scheduler import Scheduler
from delayq.schedules.firing import ScheduleFirer
from delayq.storage.store import Store

FAST: dict[str, Any] = {"visibility_timeout": 2.0, "scheduling_interval": 0.2,
                        "lock_timeout": 1.0, "polling_timeout": 1.0}  # fmt: skip


def watchdog(beat: list[float]) -> None:
    while True:
        time.sleep(0.5)
        if time.monotonic() - beat[0] > 3.0:
            print(json.dumps({"blocked": True}), flush=True)
            os._exit(3)


def counting(obj: Any, name: str, counts: dict[str, int]) -> None:
    real = getattr(obj, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        counts[name] = counts.get(name, 0) + 1
        return await real(*args, **kwargs)

    setattr(obj, name, counted)


async def spread_case(case: str, url: str, counts: dict[str, int]) -> dict[str, Any]:
    redis = Redis.from_url(url, max_connections=2 if case == "spread-pool" else 100)
    admin = Redis.from_url(url)
    store = Store(redis, "pacing")
    counting(store.scheduling, "scheduler_membership", counts)

    async def drain(unit: str, nexts: dict[str, float], active: set[str]) -> int:
        await redis.ping()
        nexts.pop(unit, None)
        return 0

    spread = Spread(store, token="t", interval=0.2, takeover_delay=0.5, member_ttl_ms=3000,
                    drain=drain, on_error=lambda: None)  # fmt: skip
    spread.set_units({"job#0", "job#1"})
    spread.listening()
    async with anyio.create_task_group() as tg:
        tg.start_soon(spread.run)
        # joined, and its first moves (each a task of its own, a connection each) ended
        while not spread._joined or spread._moving:
            await asyncio.sleep(0.01)
        if case == "spread-readonly":
            await admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # writes: READONLY
        elif case == "spread-pool":
            for _ in range(2):  # both connections busy: the pool is exhausted
                tg.start_soon(Redis(connection_pool=redis.connection_pool).blpop, ["x"], 10)
        await asyncio.sleep(0.3)  # the next beat is due (and fails)
        spread.on_message("job#0")
        if case == "spread-no-units":
            spread.set_units(set())
        before = dict(counts)
        await asyncio.sleep(1.0)
        out = {k: counts.get(k, 0) - before.get(k, 0) for k in counts}
        if case == "spread-readonly":
            await admin.execute_command("REPLICAOF", "NO", "ONE")
        spread.stop()
        tg.cancel_scope.cancel()
    await admin.aclose()
    return out


@contextlib.asynccontextmanager
async def leading(url: str) -> AsyncIterator[tuple[Redis, Scheduler]]:
    """An admin client and a service's scheduler once it leads."""
    admin = Redis.from_url(url)
    async with EventService.from_url(url, prefix="pacing", **FAST) as service:
        scheduler = service._scheduler
        assert scheduler is not None
        while not scheduler.is_leader:
            await asyncio.sleep(0.01)
        yield admin, scheduler
    await admin.aclose()


async def scheduler_case(url: str, counts: dict[str, int]) -> dict[str, Any]:
    async with leading(url) as (admin, scheduler):
        counting(scheduler._store.scheduling, "take_lock", counts)
        await admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # renewals: READONLY
        await asyncio.sleep(0.5)
        await admin.publish(scheduler._store.keys.wakeup_channel, "pacing-job")
        await asyncio.sleep(0.2)
        before, cpu = dict(counts), time.process_time()
        await asyncio.sleep(1.0)
        out: dict[str, Any] = {k: counts[k] - before.get(k, 0) for k in counts}
        out["cpu_s"] = time.process_time() - cpu
        await admin.execute_command("REPLICAOF", "NO", "ONE")
    return out


async def resubscribe_case(url: str, counts: dict[str, int]) -> dict[str, Any]:
    async with leading(url) as (admin, scheduler):
        store = scheduler._store
        real = store.wakeups

        def wakeups() -> Any:  # (a plain call: counting() wraps coroutines)
            counts["wakeups"] = counts.get("wakeups", 0) + 1
            return real()

        store.wakeups = wakeups  # type: ignore[method-assign]
        before = dict(counts)
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            await asyncio.sleep(0.02)
        out = {k: counts[k] - before.get(k, 0) for k in counts}
    return out


async def firer_case(url: str, counts: dict[str, int]) -> dict[str, Any]:
    redis = Redis.from_url(url, max_connections=1)
    store = Store(redis, "pacing")
    counting(store.schedules, "schedules_due", counts)
    firer = ScheduleFirer(store, InMemoryMetrics(), is_leader=lambda: True,
                          takeover_delay=0.5, sweep=1.0)  # fmt: skip
    async with anyio.create_task_group() as tg:
        tg.start_soon(Redis(connection_pool=redis.connection_pool).blpop, ["x"], 10)
        await asyncio.sleep(0.1)
        tg.start_soon(firer.run)
        await asyncio.sleep(0.5)  # failing, backing off
        before = dict(counts)
        for _ in range(100):  # wake-ups keep coming (schedules written elsewhere)
            firer.wake()
            await asyncio.sleep(0.01)
        out = {k: counts.get(k, 0) - before.get(k, 0) for k in counts}
        firer.stop()
        tg.cancel_scope.cancel()
    return out


async def supervisor_case(case: str) -> dict[str, Any]:
    from types import SimpleNamespace

    from delayq.cli import supervisor

    started: list[int] = []
    real_exec = asyncio.create_subprocess_exec

    async def child(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        # a real process in place of a worker: it drains for 1.5 s after SIGTERM
        code = (
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.5), sys.exit(0)))\n"
            "print('ready', flush=True)\n"
            "time.sleep(30)\n"
        )
        kwargs["stdout"] = asyncio.subprocess.PIPE
        proc = await real_exec(sys.executable, "-c", code, **kwargs)
        assert proc.stdout is not None
        await proc.stdout.readline()  # its handler is set
        started.append(proc.pid)
        return proc

    supervisor.asyncio.create_subprocess_exec = child  # type: ignore[attr-defined]
    cfg = SimpleNamespace(processes=2, child_args=lambda: [], metrics_port=None,
                          health_port=None, reload=False)  # fmt: skip
    early = [signal.SIGTERM] if case == "supervisor-early" else None
    if early is None:

        async def term_when_started() -> None:
            while len(started) < 2:
                await asyncio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)

        asyncio.get_running_loop().create_task(term_when_started())
    cpu, wall = time.process_time(), time.monotonic()
    code = await supervisor.supervise(cfg, early)
    return {"code": code, "started": len(started), "cpu_s": time.process_time() - cpu,
            "wall_s": time.monotonic() - wall}  # fmt: skip


async def main(case: str, url: str) -> None:
    beat = [time.monotonic()]
    threading.Thread(target=watchdog, args=(beat,), daemon=True).start()

    async def ticking() -> None:
        while True:
            beat[0] = time.monotonic()
            await asyncio.sleep(0.05)

    counts: dict[str, int] = {}
    ticker = asyncio.create_task(ticking())
    if case.startswith("spread-"):
        out = await spread_case(case, url, counts)
    elif case == "scheduler-readonly":
        out = await scheduler_case(url, counts)
    elif case == "scheduler-resubscribe":
        out = await resubscribe_case(url, counts)
    elif case.startswith("supervisor-"):
        out = await supervisor_case(case)
    else:
        out = await firer_case(url, counts)
    ticker.cancel()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.CRITICAL)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
