"""An ack or failure record whose lease has gone changes nothing, and is counted apart.

``succeeded`` counts the events the ack script removed, not the batch it was given: a
handler whose event was cancelled (or replaced, or redelivered after its lease expired)
while it ran succeeds into ``stale_outcomes``, and so does a failure record that found the
lease gone (it stays in ``failed``, as a handler run that failed, but is not ``retried``).
tests/faults/test_fault_frozen_worker.py runs the redelivery case with real processes.
"""

from __future__ import annotations

import asyncio

import anyio

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
        # shielded: a cancel of a running event would stop the handler (docs/guides/
        # running-handlers.md); here each must come back and record its stale outcome
        with anyio.CancelScope(shield=True):
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


class Spread(Event, event_name="stale-spread", partitions=4):
    pass


async def test_a_partition_whose_ack_fails_holds_back_no_other_partition(
    redis_url: str, prefix: str, wait_for
) -> None:
    """One partition's failed ack call is sent again alone: the other partitions' acks of
    the same batch settle at once, and are not sent twice (which would count them stale)."""
    metrics = InMemoryMetrics()
    service = EventService.from_url(redis_url, prefix=prefix, metrics=metrics)
    gate = asyncio.Event()
    running: set[str] = set()
    calls: list[str] = []
    store = service._store
    real_ack = store.deliveries.ack

    async def ack(shard: str, done, *, group=None) -> int:  # a node down for 2 calls
        calls.append(shard)
        if "#0/" in shard and calls.count(shard) <= 2:
            raise ConnectionError("the node of partition 0 is down")
        return await real_ack(shard, done, group=group)

    store.deliveries.ack = ack  # type: ignore[method-assign]

    async def handle(event: Spread) -> None:
        running.add(event.id)
        await gate.wait()

    n = 24
    service.add_handler(Spread, handle, concurrency=n)
    async with service:
        await service.enqueue_many([Spread(id=f"s-{i}") for i in range(n)])
        await wait_for(lambda: len(running) == n, timeout=10)
        gate.set()  # every handler ends at once: their acks go in one batch
        t = Spread.event_name
        await wait_for(lambda: metrics.counters["succeeded", t] == n, timeout=10)
        assert metrics.counters["stale_outcomes", t] == 0
        assert len({s for s in calls if "#0/" not in s}) == len(set(calls)) - 1
        for healthy in {s for s in calls if "#0/" not in s}:
            assert calls.count(healthy) == 1  # sent once, though partition 0's failed twice
        assert sum(1 for s in calls if "#0/" in s) == 3
        counts = await service.stats_for(Spread)
        assert counts.in_flight == 0
