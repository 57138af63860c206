"""Tools that look a type up by name see a partitioned type as one (issue 15): the
dashboard's browsing calls (due histogram, in-flight list, run now) and the outbox
relay's ``enqueue_envelopes``. One Redis is enough: partitions are only hash tags there."""

from __future__ import annotations

import asyncio

from core_support import ServicePool

from delayq import Event
from delayq.codec import Codec
from delayq.keys import TypeKeys
from delayq.partitions.shards import partition_of


class Spread(Event, event_name="part-tools", partitions=5):
    """A partitioned type."""

    n: int = 0


async def test_browsing_and_envelopes_route_partitioned_types(
    redis_url: str, prefix: str, redis_client, wait_for
) -> None:
    pool = ServicePool(redis_url, prefix)
    try:
        producer = pool.producer()
        assert all(await producer.enqueue_many([Spread(id=f"s{i}", n=i) for i in range(50)], 3600))
        # by wire name, as the dashboard asks
        hist = await producer.due_histogram("part-tools")
        assert hist.counts["next hour"] + hist.counts["next day"] == 50
        # enqueue_envelopes routes each id to its partition, as enqueue does
        env = Codec().encode(Spread(id="env-1", n=1), None)
        assert await producer.enqueue_envelopes("part-tools", [("env-1", env, 3_600_000)]) == [1]
        keys = TypeKeys(prefix, "part-tools", partition_of("env-1", 5), 5)
        assert await redis_client.zscore(keys.scheduled, "env-1") is not None
        assert (await producer.stats_for("part-tools")).scheduled == 51
        # run now, then a handler holds it: it shows in the in-flight list
        release = asyncio.Event()

        async def hold(event: Spread) -> None:
            await release.wait()

        worker = await pool.start()
        worker.add_handler(Spread, hold)
        assert await producer.run_now("part-tools", "s7")
        assert not await producer.run_now("part-tools", "no-such-id")

        async def held() -> bool:
            return [e.id for e in await producer.in_flight("part-tools")] == ["s7"]

        await wait_for(held, timeout=10)
        release.set()
    finally:
        await pool.aclose()
