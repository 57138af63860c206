"""delayq's adapter: the shared workloads plus enqueue throughput and scheduler drain.

Runs in the project's own virtualenv. The worker is an ``EventService`` with
default options; its handler records ``Delivery.lateness_ms`` (claimed time
minus due time, both on Redis's clock) next to the handler's start time.
"""

from __future__ import annotations

import asyncio
import signal
import time
import types as pytypes
from collections.abc import Sequence
from typing import Any

import redis as sync_redis

from delayq import EventService
from delayq.context import current_delivery
from delayq.events import Event
from delayq.keys import TypeKeys

from . import _common as c

PREFIX = "bench"


class BenchEvent(Event, event_name="bench"):
    """The event every workload sends: an id and an optional payload."""

    payload: str = ""


def _idle_type(k: int) -> type[Event]:
    return pytypes.new_class(f"BenchIdle{k}", (Event,), {"event_name": f"bench-idle-{k}"})


IDLE_TYPES = [_idle_type(k) for k in range(1, 100)]


async def _handle(event: Any) -> None:
    delivery = current_delivery()
    late = delivery.lateness_ms if delivery is not None else None
    c.REC.record(event.id, "" if late is None else f"{late:.3f}")
    if c.is_crash(event.id):
        await asyncio.sleep(3600)


class DelayqAdapter(c.Adapter):
    """delayq with its documented defaults (one ``EventService`` per worker process)."""

    library = "delayq"
    distributions = ("delayq", "msgspec", "anyio")
    workloads = (
        "lateness", "sustained", "throughput", "crash", "memory", "idle", "enqueue", "drain",
    )  # fmt: skip
    # like the peers' adapters: the due time of a batch is read just before its call,
    # so big batches would inflate the handler-start lateness (not the Redis-clock one)
    enqueue_batch = 100
    bulk_batch = 1000

    def __init__(self, url: str, variant: str):
        super().__init__(url, variant)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.service: EventService | None = None

    def setup(self) -> None:
        """A producer-only service (never started: it enqueues, it does not consume)."""
        self.loop = asyncio.new_event_loop()
        self.service = EventService.from_url(self.url, prefix=PREFIX, **self.options)

    def teardown(self) -> None:
        """Close the producer's clients and loop."""
        if self.loop is not None and self.service is not None:
            self.loop.run_until_complete(self.service.aclose())
            self.loop.close()

    def enqueue(self, items: Sequence[tuple[str, float]], payload: str = "") -> list[float]:
        """One ``enqueue_many`` call; due times are counted by Redis from the call."""
        assert self.loop is not None and self.service is not None
        now = time.time()
        batch = [(BenchEvent(id=i, payload=payload), max(0.0, d)) for i, d in items]
        self.loop.run_until_complete(self.service.enqueue_many(batch))
        return [now + max(0.0, d) for _, d in items]

    def describe(self, workload: str, params: dict[str, Any]) -> list[str]:
        """How delayq runs each workload."""
        return [
            "EventService defaults (visibility_timeout 15 s, scheduling_interval 1 s, batch 500); "
            "enqueue through enqueue_many; lateness also reported on Redis's clock "
            "(redis_* = Delivery.lateness_ms)"
        ]

    def run_worker(self, concurrency: int, types: int) -> None:
        """An EventService with ``types`` handled event types (0: scheduler only)."""
        asyncio.run(self._worker(concurrency, types))

    async def _worker(self, concurrency: int, types: int) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        service = EventService.from_url(self.url, prefix=PREFIX, **self.options)
        if types >= 1:
            service.add_handler(BenchEvent, _handle, concurrency=concurrency)
        for event_type in IDLE_TYPES[: max(0, types - 1)]:
            service.add_handler(event_type, _handle, concurrency=concurrency)
        async with service:
            await stop.wait()


class DelayqRunner(c.Runner):
    """The shared workloads plus the two that only concern delayq."""

    a: DelayqAdapter

    def w_enqueue(
        self, n_single: int = 30_000, tasks: int = 100, n_many: int = 300_000, batch: int = 1000,
        delay: float = 3600.0,
    ) -> None:  # fmt: skip
        """Awaited ``enqueue_with_delay`` from ``tasks`` tasks; ``enqueue_many`` in batches."""
        assert self.a.loop is not None and self.a.service is not None
        service = self.a.service

        async def singles() -> tuple[float, float]:
            per_task = n_single // tasks

            async def one_task(t: int) -> None:
                for i in range(per_task):
                    await service.enqueue_with_delay(BenchEvent(id=f"s{t}-{i}"), delay)

            await service.enqueue_with_delay(BenchEvent(id="warm"), delay)
            cpu0, t0 = time.process_time(), time.perf_counter()
            await asyncio.gather(*(one_task(t) for t in range(tasks)))
            return time.perf_counter() - t0, time.process_time() - cpu0

        async def many() -> tuple[float, float]:
            cpu0, t0 = time.process_time(), time.perf_counter()
            for start in range(0, n_many, batch):
                await service.enqueue_many(
                    [BenchEvent(id=f"m{i}") for i in range(start, min(n_many, start + batch))],
                    delay,
                )
            return time.perf_counter() - t0, time.process_time() - cpu0

        wall, cpu = self.a.loop.run_until_complete(singles())
        total = tasks * (n_single // tasks)
        self.metrics.update(
            single_n=total,
            single_tasks=tasks,
            single_rate=round(total / wall, 1),
            single_cpu_per_call_us=round(1e6 * cpu / total, 1),
        )
        wall, cpu = self.a.loop.run_until_complete(many())
        self.metrics.update(
            many_n=n_many,
            many_batch=batch,
            many_rate=round(n_many / wall, 1),
            many_cpu_per_event_us=round(1e6 * cpu / n_many, 2),
        )

    def w_drain(self, total: int = 1_000_000, due: int = 200_000, lead: float = 2.0) -> None:
        """``total`` scheduled, ``due`` of them due at once: time until all are in ready."""
        assert self.a.loop is not None and self.a.service is not None
        service = self.a.service
        client = sync_redis.Redis.from_url(self.a.url)
        ready_key = TypeKeys(PREFIX, "bench").ready
        try:
            t_due = time.time() + lead

            async def fill() -> None:
                for start in range(0, due, 1000):
                    ids = range(start, min(due, start + 1000))
                    # delays from now to the common due time: all become due at t_due
                    await service.enqueue_many(
                        [BenchEvent(id=f"d{i}") for i in ids], max(0.001, t_due - time.time())
                    )
                for start in range(due, total, 1000):
                    ids = range(start, min(total, start + 1000))
                    await service.enqueue_many([BenchEvent(id=f"f{i}") for i in ids], 86400)

            t0 = time.time()
            self.a.loop.run_until_complete(fill())
            self.metrics["fill_s"] = round(time.time() - t0, 2)
            self.metrics["fill_rate"] = round(total / (time.time() - t0), 1)
            if client.llen(ready_key):
                raise RuntimeError("events reached the ready list before the scheduler started")
            time.sleep(max(0.0, t_due + 0.1 - time.time()))
            # Redis 7 also logs the commands a script runs: log only calls over 1 ms
            client.config_set("slowlog-log-slower-than", 1000)
            client.config_set("slowlog-max-len", 100_000)
            client.config_set("latency-monitor-threshold", 1)
            client.slowlog_reset()
            client.execute_command("LATENCY", "RESET")
            client.config_resetstat()
            self.start_workers(1, 1, types=0)  # a service with no handlers: the scheduler
            t_first = None
            deadline = time.monotonic() + 120
            while True:
                n = client.llen(ready_key)
                now = time.perf_counter()
                if n and t_first is None:
                    t_first = now
                if n >= due:
                    t_done = now
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {n} of {due} moved within 120 s")
                time.sleep(0.001)
            latest = client.execute_command("LATENCY", "LATEST")
            entries = client.slowlog_get(100_000)
            stats = client.info("commandstats").get("cmdstat_evalsha", {})
        finally:
            client.config_set("slowlog-log-slower-than", 10_000)
            client.close()
        assert t_first is not None
        scripts = [e for e in entries if e["command"][:7].upper() in (b"EVALSHA", b"EVAL ")]
        durations = sorted(e["duration"] for e in scripts)  # µs, calls over 1 ms only
        seconds = t_done - t_first
        calls = int(stats.get("calls", 0))
        self.metrics.update(
            total=total,
            due=due,
            drain_s=round(seconds, 4),
            moves_per_s=round(due / seconds, 1),
            script_calls=calls,
            script_mean_ms=round(float(stats.get("usec", 0)) / max(1, calls) / 1000, 3),
            script_total_ms=round(float(stats.get("usec", 0)) / 1000, 1),
            script_max_ms=round(durations[-1] / 1000, 3) if durations else "< 1",
            scripts_over_1ms=len(durations),
            scripts_over_10ms=sum(1 for d in durations if d > 10_000),
            latency_latest=[
                [x.decode() if isinstance(x, bytes) else x for x in row] for row in latest
            ],
        )


DelayqAdapter.runner_class = DelayqRunner  # type: ignore[attr-defined]

if __name__ == "__main__":
    c.main(DelayqAdapter)
