"""An ack or failure record whose lease has gone changes nothing, and is counted apart.

``succeeded`` counts the events the ack script removed, not the batch it was given: a
handler whose event was cancelled (or replaced, or redelivered after its lease expired)
while it ran succeeds into ``stale_outcomes``, and so does a failure record that found the
lease gone (it stays in ``failed``, as a handler run that failed, but is not ``retried``).
tests/faults/test_fault_frozen_worker.py runs the redelivery case with real processes.
"""

from __future__ import annotations

import asyncio

from delayq import Event, EventService, InMemoryMetrics


class Settled(Event, event_name="stale-settled"):
    fail: bool = False


async def test_acks_and_failures_of_cancelled_deliveries_are_stale(
    redis_url: str, prefix: str, wait_for
) -> None:
    metrics = InMemoryMetrics()
    service = EventService.from_url(redis_url, prefix=prefix, metrics=metrics)
    gate = asyncio.Event()
    running: set[str] = set()

    async def handle(event: Settled) -> None:
        running.add(event.id)
        await gate.wait()
        if event.fail:
            raise RuntimeError("planned")

    service.add_handler(Settled, handle, concurrency=8)
    async with service:
        await service.enqueue_many(
            [Settled(id=f"ok-{i}") for i in range(3)]
            + [Settled(id=f"bad-{i}", fail=True) for i in range(2)]
        )
        await wait_for(lambda: len(running) == 5, timeout=10)
        # while the handlers run, their events go: every lease held here is gone
        for gone in ("ok-1", "ok-2", "bad-1"):
            assert await service.cancel(Settled, gone)
        gate.set()

        def settled() -> bool:
            t = Settled.event_name
            return (
                metrics.counters["succeeded", t] + metrics.counters["stale_outcomes", t] >= 3
                and metrics.counters["failed", t] >= 2
            )

        await wait_for(settled, timeout=10)
        t = Settled.event_name
        await wait_for(lambda: metrics.counters["retried", t] == 1, timeout=10)
        assert metrics.counters["succeeded", t] == 1  # ok-0: acked; ok-1, ok-2: stale
        assert metrics.counters["stale_outcomes", t] == 3  # ok-1, ok-2 and bad-1
        assert metrics.counters["failed", t] == 2  # both handler runs failed
        assert metrics.counters["retried", t] == 1  # bad-0 only: bad-1 was cancelled
        assert metrics.counters["dead_lettered", t] == 0
        counts = await service.stats_for(Settled)
        assert counts.in_flight == 0 and counts.scheduled + counts.ready == 1  # bad-0's retry
