"""A graceful stop acks what finished (issue 9, part 1).

When ``aclose()`` returns, every handler that finished successfully has been acked and every
failure recorded in Redis. Checked many times, with handlers finishing before, during and at
the end of the drain, with concurrency 1 and 64.
"""

from __future__ import annotations

import asyncio

import pytest
from core_support import ServicePool

from delayq import Event


class Drain(Event, event_name="drain-ev"):
    """An event whose handler sleeps ``sleep`` seconds, then succeeds or fails."""

    sleep: float = 0.0
    fail: bool = False


class Handler:
    """Records which events finished; fails those marked ``fail``."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.done: list[str] = []
        self.running = 0

    async def __call__(self, event: Drain) -> None:
        self.started.set()
        self.running += 1
        try:
            await asyncio.sleep(event.sleep)
        finally:
            self.running -= 1
        self.done.append(event.id)
        if event.fail:
            raise RuntimeError("planned failure")


async def test_aclose_acks_the_handler_that_finished_during_the_drain(
    redis_url: str, prefix: str
) -> None:
    # the reproduction: one event, a 0.4 s handler, aclose() while it runs
    for run in range(20):
        pool = ServicePool(redis_url, f"{prefix}-{run}", shutdown_grace=5, visibility_timeout=3)
        handler = Handler()
        try:
            service = pool.make()
            service.add_handler(Drain, handler, concurrency=1)
            await service.start()
            assert await service.enqueue_with_delay(Drain(id="one", sleep=0.4), 0)
            await asyncio.wait_for(handler.started.wait(), 10)
            await service.aclose()
            assert handler.done == ["one"]
            counts = await pool.producer().stats_for(Drain)
            assert (counts.scheduled, counts.ready, counts.in_flight) == (0, 0, 0), (run, counts)
        finally:
            await pool.aclose()


async def _drain_once(redis_url: str, prefix: str, concurrency: int, shift: int, wait_for) -> None:
    grace = 1.0
    # finishing before the stop, during the drain, just before its end, and never (cancelled)
    sleeps = [0.0, 0.05, 0.3, 0.6, grace - 0.1, grace * 3]
    pool = ServicePool(redis_url, prefix, shutdown_grace=grace, visibility_timeout=30)
    events = [
        Drain(id=f"e{i}", sleep=sleeps[(i + shift) % len(sleeps)], fail=i % 5 == 4)
        for i in range(max(concurrency, len(sleeps)) if concurrency > 1 else 1)
    ]
    handler = Handler()
    try:
        service = pool.make(retry_attempts=5)
        service.add_handler(Drain, handler, concurrency=concurrency)
        await service.start()
        assert all(await service.enqueue_many(events))
        want = min(len(events), concurrency)
        await wait_for(lambda: len(handler.done) + handler.running >= want, timeout=10)
        await service.aclose()
        ok = {e.id for e in events if e.id in handler.done and not e.fail}
        failed = {e.id for e in events if e.id in handler.done and e.fail}
        cancelled = {e.id for e in events} - ok - failed
        checker = pool.producer()
        counts = await checker.stats_for(Drain)
        # succeeded: gone; failed: scheduled for its retry; cancelled or never started: leased
        # or still waiting in the ready list
        assert counts.scheduled == len(failed), (shift, counts, failed)
        assert counts.in_flight + counts.ready == len(cancelled), (shift, counts, cancelled)
        store = checker.store
        left = await store.redis.hkeys(store.keys.for_type("drain-ev").events)
        assert {k.decode() for k in left} == failed | cancelled
    finally:
        await pool.aclose()


@pytest.mark.parametrize("concurrency", [1, 64])
async def test_aclose_settles_every_finished_handler(
    redis_url: str, prefix: str, wait_for, concurrency: int
) -> None:
    for shift in range(6 if concurrency == 64 else 12):
        await _drain_once(redis_url, f"{prefix}-{shift}", concurrency, shift, wait_for)
