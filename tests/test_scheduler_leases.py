"""What a scheduler may do while the lock's or the membership's node is away (issue 37).

A real Redis and the real store; the lock and membership calls are made to fail (as they
do while the ``{prefix}`` node of a cluster fails over). A leader keeps leading, and a
partition owner keeps moving the partitions it owned, until its lease ends (the lock's
or the membership entry's time to live, from the last good call); then it stands by.
Before the fix, one failed call failed the whole pass of every partition.
"""

from __future__ import annotations

import time

import anyio
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from delayq import InMemoryMetrics
from delayq.metrics import ServiceMetrics
from delayq.partitions.spread import Spread
from delayq.runtime.leadership import Leadership
from delayq.storage.store import Store
from delayq.testing import RedisServer, wait_for

TTL_MS = 1500


async def _away(*args: object, **kwargs: object) -> object:
    raise RedisConnectionError("the {prefix} node is away (test)")


async def test_an_owner_keeps_moving_its_partitions_until_its_lease_ends(
    private_server: RedisServer, prefix: str
) -> None:
    redis = Redis.from_url(private_server.url)
    store = Store(redis, prefix)
    moved: list[tuple[str, float]] = []

    async def drain(unit: str, nexts: dict[str, float], active: set[str]) -> int:
        moved.append((unit, time.monotonic()))
        nexts[unit] = time.monotonic() + 0.05  # due again soon: an owner looks at once
        return 0

    spread = Spread(store, token="a", interval=0.1, takeover_delay=5.0, member_ttl_ms=TTL_MS,
                    drain=drain, on_error=lambda: None)  # fmt: skip
    # another member, so that ownership is shared: "a" owns some units, "b" the others
    await store.scheduling.scheduler_membership("b", 60_000)
    units = {f"job#{k}/8" for k in range(8)}
    spread.set_units(units)
    spread.listening()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(spread.run)
            await wait_for(lambda: spread.members == ["a", "b"], timeout=10)
            mine = spread.owned()
            assert mine and mine != units
            store.scheduling.scheduler_membership = _away  # type: ignore[method-assign]
            failed_at = time.monotonic()
            # within the lease: its own partitions keep moving at their times
            await wait_for(lambda: sum(1 for u, t in moved if t > failed_at + 0.5 and u in mine)
                           >= 3 * len(mine), timeout=5)  # fmt: skip
            assert spread.owned() == mine
            # past the lease: nothing is its own (a standby looks takeover_delay late)
            await wait_for(lambda: not spread.owned(), timeout=TTL_MS / 1000 + 5)
            assert time.monotonic() - failed_at >= TTL_MS / 1000 - 0.5
            spread.stop()
    finally:
        await redis.aclose()


async def test_a_leader_keeps_leading_until_its_lease_ends(
    private_server: RedisServer, prefix: str
) -> None:
    redis = Redis.from_url(private_server.url)
    store = Store(redis, prefix)
    became: list[bool] = []
    lead = Leadership(store, ServiceMetrics(InMemoryMetrics()), lock_ms=TTL_MS, interval=0.1,
                      token=lambda: "a", on_leading=lambda: became.append(True))  # fmt: skip
    try:
        assert await lead.hold()
        store.scheduling.take_lock = _away  # type: ignore[method-assign]
        failed_at = time.monotonic()
        while time.monotonic() - failed_at < TTL_MS / 1000 - 0.3:
            assert await lead.hold()  # renewals fail: still the leader, within the lease
            await anyio.sleep(0.05)
        await wait_for(lambda: _stood_by(lead), timeout=5)
        assert became == [True]
    finally:
        await redis.aclose()


async def _stood_by(lead: Leadership) -> bool:
    return not await lead.hold()
