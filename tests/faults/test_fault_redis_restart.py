"""Fault 2: Redis killed with SIGKILL mid-run and restarted on the same port.

With ``appendonly yes`` and ``appendfsync always`` every enqueue that returned is handled
after the restart, and the running services reconnect by themselves.
"""

from __future__ import annotations

import collections
import random
import time

import anyio
from faultkit import Job

from delayq import EventService, current_delivery


async def test_redis_kill9_and_restart_loses_no_acknowledged_enqueue(
    redis_server_factory, prefix, wait_for
):
    server = redis_server_factory({"appendonly": "yes", "appendfsync": "always"})
    starts: collections.Counter[str] = collections.Counter()
    done: dict[str, float] = {}
    in_handler: set[str] = set()
    lateness: list[tuple[float, float]] = []  # (monotonic end, lateness ms)

    async def handle(job: Job) -> None:
        starts[job.id] += 1
        in_handler.add(job.id)
        await anyio.sleep(job.sleep_ms / 1000)
        in_handler.discard(job.id)
        done.setdefault(job.id, time.monotonic())
        d = current_delivery()
        lateness.append((time.monotonic(), d.lateness_ms or 0.0))

    worker = EventService.from_url(
        server.url, prefix=prefix, visibility_timeout=5, scheduling_interval=0.2, lock_timeout=1
    )
    worker.add_handler(Job, handle, concurrency=16)
    producer = EventService.from_url(server.url, prefix=prefix, enable_scheduling=False)
    returned: list[str] = []
    failed_enqueues = 0
    stop_producing = anyio.Event()
    rnd = random.Random(2)

    async def produce():
        nonlocal failed_enqueues
        n = 0
        while not stop_producing.is_set():
            n += 1
            job = Job(id=f"r-{n}", seq=n, sleep_ms=rnd.randint(0, 20))
            try:
                await producer.enqueue_with_delay(job, rnd.uniform(0, 1.5))
                returned.append(job.id)
            except Exception:  # Redis is down: this enqueue did not return
                failed_enqueues += 1
                await anyio.sleep(0.05)
            await anyio.sleep(0.003)

    async with worker, producer, anyio.create_task_group() as tg:
        tg.start_soon(produce)
        await wait_for(lambda: len(done) > 200, timeout=20)
        in_flight_at_kill = set(in_handler)
        t_kill = time.monotonic()
        server.kill()
        await anyio.sleep(1.0)
        server.start()  # same port, same dir: the AOF is reloaded
        t_back = time.monotonic()
        await wait_for(lambda: any(t > t_back for t in done.values()), timeout=20)
        t_first = min(t for t in done.values() if t > t_back)
        await anyio.sleep(1.5)  # keep producing for a while after the restart
        stop_producing.set()
        expected = set(returned)
        await wait_for(
            lambda: expected <= done.keys(),
            timeout=30,
            message="every enqueue that returned is handled",
        )

        async def drained():
            c = await worker.stats_for(Job)
            return c.scheduled == c.ready == c.in_flight == c.dead == 0

        await wait_for(drained, timeout=20)

    duplicates = {i for i, n in starts.items() if n > 1}
    late_after = [ms for t, ms in lateness if t > t_back]
    print(
        f"redis restart: returned={len(returned)} failed_enqueues={failed_enqueues} "
        f"handled={len(done)} duplicates={len(duplicates)} outage={t_back - t_kill:.2f}s "
        f"first_delivery_after_restart={t_first - t_back:.2f}s "
        f"max_lateness_after_restart={max(late_after):.0f}ms"
    )
    assert expected <= done.keys()
    # Only events that were inside a handler when Redis died may run twice.
    assert duplicates <= in_flight_at_kill, duplicates - in_flight_at_kill
