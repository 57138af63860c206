"""Redis Sentinel (issues 15, 26): connecting through sentinels, failovers under load, min_replicas.

Every test starts its own Sentinel set (a master, two replicas, three sentinels on loopback;
``delayq.testing.sentinel.RedisSentinelSet``). The failover tests run the harness of
``python -m benchmarks.sentinel_failover`` with short timings and check what must hold on any
machine: with ``min_replicas=1`` nothing acknowledged is lost, and the workers resume by
themselves (every event is handled in the end); back-to-back planned failovers (issue 26)
lose and duplicate nothing at any ``min_replicas``. How long deliveries stop is measured by
the benchmark, not asserted here.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from delayq import Event, EventService, NotReplicatedError
from delayq.storage.connect import parse_sentinel_url
from delayq.storage.sentinel import CheckedSentinelPool, Failover
from delayq.testing import RedisServer
from delayq.testing.sentinel import RedisSentinelSet

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sentinel_failover import STARTUP_TIMEOUT, run_fault

# the Sentinel guide (its example was the README's)
README = Path(__file__).resolve().parent.parent / "docs" / "guides" / "scaling.md"


class Ping(Event, event_name="sentinel-ping"):
    """A test event."""

    n: int = 0


@pytest.fixture
def sentinels():
    with RedisSentinelSet(startup_timeout=STARTUP_TIMEOUT) as s:
        yield s


def test_sentinel_urls() -> None:
    assert parse_sentinel_url("redis+sentinel://h1:26379,h2:26380/mymaster") == (
        [("h1", 26379), ("h2", 26380)],
        "mymaster",
        {},
    )
    addresses, name, kwargs = parse_sentinel_url(
        "rediss+sentinel://app:s%40cret@[::1]:5000/m/2?sentinel_password=pw"
    )
    assert (addresses, name) == ([("::1", 5000)], "m")
    assert kwargs == {
        "username": "app",
        "password": "s@cret",
        "db": 2,
        "ssl": True,
        "sentinel_kwargs": {"password": "pw"},
    }
    for bad in (
        "redis://h:1/m",
        "redis+sentinel://h/m",
        "redis+sentinel://h:1",
        "redis+sentinel://h:1/m/x",
        "redis+sentinel://h:1/m/1/2",
    ):
        with pytest.raises(ValueError):
            parse_sentinel_url(bad)
    with pytest.raises(ValueError, match="cluster"):
        EventService.from_url("redis+sentinel://h:1/m", cluster=True)
    with pytest.raises(ValueError, match="at least one"):
        EventService.from_sentinel([], "m")
    with pytest.raises(TypeError, match="host, port"):
        EventService.from_sentinel(["h:1"], "m")  # type: ignore[list-item]


async def test_from_sentinel_enqueues_and_handles(sentinels, prefix, wait_for) -> None:
    seen: list[str] = []

    async def handle(event: Ping) -> None:
        seen.append(event.id)

    service = EventService.from_sentinel(
        sentinels.sentinel_addresses, sentinels.service_name, prefix=prefix, min_replicas=2
    )
    service.add_handler(Ping, handle)
    async with service:
        assert await service.enqueue_with_delay(Ping(id="a"), 0.1)
        await wait_for(lambda: seen == ["a"], timeout=10)
    # the URL form reaches the same master
    producer = EventService.from_url(sentinels.url, prefix=prefix, enable_scheduling=False)
    try:
        assert (await producer.stats_for(Ping)).scheduled == 0
    finally:
        await producer.aclose()


async def test_min_replicas_refuses_an_unreplicated_enqueue(
    private_server: RedisServer, prefix: str
) -> None:
    # a Redis without replicas cannot confirm anything: the enqueue is written, and says so
    service = EventService.from_url(
        private_server.url, prefix=prefix, min_replicas=1, replica_timeout=0.05
    )
    try:
        with pytest.raises(NotReplicatedError, match="Enqueueing again is safe"):
            await service.enqueue_with_delay(Ping(id="x"), 60)
        assert (await service.stats_for(Ping)).scheduled == 1
        with pytest.raises(NotReplicatedError):  # the pipelined path too
            await service.enqueue_many([Ping(id=f"m{i}") for i in range(500)], 60)
    finally:
        await service.aclose()
    with pytest.raises(ValueError, match="min_replicas"):
        EventService.from_url(private_server.url, min_replicas=-1)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["planned", "kill", "freeze"])
async def test_failover_under_load_loses_nothing_with_min_replicas(fault: str) -> None:
    result = await run_fault(fault, 1, rate=100, before=2.0, after=10.0, thaw_after=2.0)
    print(result)
    assert result["promoted_after_s"] > 0
    # the producer goes on by itself after the failover (enqueues in flight to a frozen
    # master wait for it, then fail with NotReplicatedError: nothing unconfirmed is lost)
    assert result["enqueued_after_fault"] > 100, result
    assert result["lost"] == 0, result
    assert result["handled"] >= result["enqueued"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "min_replicas"),
    [
        ("planned2", 1),
        ("planned3", 1),
        ("planned-kill", 0),
        ("planned-kill", 1),
        ("planned-kill-new", 1),
    ],
)
async def test_back_to_back_failovers_lose_and_duplicate_nothing(
    fault: str, min_replicas: int
) -> None:
    # issue 26: a sentinel announcing the first switch late (after the second failover had
    # begun) let clients write to the master being replaced: ~120 lost and ~120 run twice.
    # (Failovers in a row, or a killed new master, at min_replicas=0 can also lose what
    # the replica Sentinel promotes had not received yet, when replication lags behind
    # the ~100 ms between the fence and the promotion (3 of 701 once in a full suite run
    # on a loaded machine): measured by the benchmark, see docs/RELIABILITY.md, not
    # asserted here. At min_replicas=1 the old code ran 10-74 events twice: asserted.)
    result = await run_fault(fault, min_replicas, rate=100, before=1.0, after=6.0, thaw_after=1.0)
    print(result)
    assert result["failovers"] == {"planned2": 2, "planned3": 3, "planned-kill-new": 2}.get(
        fault, 1
    )
    assert result["enqueued_after_fault"] > 100, result
    assert result["lost"] == 0, result
    assert result["handled"] >= result["enqueued"]
    # planned3 at min_replicas=1 ran 20-100 of ~700 events twice in most isolated runs until
    # claims waited for the replicas too: the next failover promoted a replica that had just
    # resynced and received nothing since (docs/RELIABILITY.md, found 2026-11-26)
    if not fault.startswith("planned-kill"):
        assert result["duplicates"] == 0, result


async def watched_pool(service: EventService) -> CheckedSentinelPool:
    """The master pool of ``service`` once its first command started the watch."""
    assert await service.enqueue_with_delay(Ping(id="a"), 60)
    pool = service._runtime._watch._pool  # type: ignore[union-attr]
    assert isinstance(pool, CheckedSentinelPool)
    return pool


def fenced_for(pool: CheckedSentinelPool) -> Failover | None:
    """The failover ``pool`` is fenced for (read anew each time)."""
    return pool.failover


async def test_the_fence_follows_its_failover(sentinels: RedisSentinelSet, prefix: str) -> None:
    # the sequence of issue 26's trace, on a real set: fenced for B -> C, a late switch
    # A -> B must not unfence (B is being replaced), and the switch to C only once C says
    # it is a master
    service = EventService.from_sentinel(
        sentinels.sentinel_addresses, sentinels.service_name, prefix=prefix
    )
    try:
        pool = await watched_pool(service)
        b, c = (("127.0.0.1", s.port) for s in sentinels.servers[:2])
        a = ("127.0.0.1", sentinels.servers[2].port)
        assert pool.fence(b, None)  # +try-failover: the replica is not known yet
        assert not pool.fence(b, c)  # +selected-slave names it
        assert not pool.fence(b, c)  # +failover-state-send-slaveof-noone
        held = asyncio.create_task(service.enqueue_with_delay(Ping(id="held"), 60))
        assert not await pool.switched(a, b)  # stale: b is being replaced
        assert pool.failover is not None and pool.failover.new == c
        assert not await pool.switched(b, c)  # c is still a replica: not verified
        assert fenced_for(pool) is not None
        assert not held.done()  # (the ROLE round trips above gave it time to run)
        assert not pool.aborted(a)
        assert pool.aborted(b)
        assert fenced_for(pool) is None
        assert await held
        assert await service.enqueue_with_delay(Ping(id="b"), 60)
        assert pool.master_address == b
        assert not await pool.switched(b, a)  # unfenced too, a replica is not followed
        assert pool.master_address == b
        assert (await service.stats_for(Ping)).scheduled == 3
    finally:
        await service.aclose()


async def test_a_connection_closed_while_sending_raises_connection_error(
    sentinels: RedisSentinelSet, prefix: str
) -> None:
    # the fence closes connections in use; redis-py writes a loop turn after it checked the
    # connection (socket timeout: wait_for's task) and raised AttributeError, not retried
    service = EventService.from_sentinel(
        sentinels.sentinel_addresses, sentinels.service_name, prefix=prefix
    )
    try:
        pool = await watched_pool(service)
        connection = await pool.get_connection()
        try:
            sending = asyncio.create_task(connection.send_command("PING"))
            await asyncio.sleep(0)  # the write's own task is scheduled, not run yet
            await connection.disconnect(nowait=True)
            with pytest.raises(RedisConnectionError, match="closed while sending"):
                await sending
        finally:
            await pool.release(connection)
        assert (await service.stats_for(Ping)).scheduled == 1  # the pool goes on
    finally:
        await service.aclose()


async def test_workers_follow_a_planned_failover(sentinels, prefix, wait_for) -> None:
    seen: list[str] = []

    async def handle(event: Ping) -> None:
        seen.append(event.id)

    service = EventService.from_url(sentinels.url, prefix=prefix, polling_timeout=1.0)
    service.add_handler(Ping, handle)
    async with service:
        assert await service.enqueue_with_delay(Ping(id="before"), 0)
        await wait_for(lambda: "before" in seen, timeout=10)
        old = sentinels.master()
        sentinels.failover()
        await wait_for(lambda: sentinels.master() is not old, timeout=15)
        # enqueue retries across the switch; the consumer comes back by itself
        for _ in range(50):
            try:
                assert await service.enqueue_with_delay(Ping(id="after"), 0)
                break
            except Exception:
                await asyncio.sleep(0.2)
        await wait_for(lambda: "after" in seen, timeout=20)


async def test_readme_sentinel_example_runs(sentinels, prefix) -> None:
    (block,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
        if "from_sentinel(" in b
    ]
    real = ", ".join(repr(a) for a in sentinels.sentinel_addresses)
    source = (
        block.replace('("10.0.0.7", 26379), ("10.0.0.8", 26379), ("10.0.0.9", 26379)', real)
        .replace('"mymaster"', repr(sentinels.service_name))
        .replace('"shop"', repr(prefix))
    )
    namespace: dict[str, object] = {}
    exec(compile(source, str(README), "exec"), namespace)  # our own README, not a payload
    service = namespace["service"]
    assert isinstance(service, EventService)
    try:
        assert await service.enqueue_with_delay(Ping(id="readme"), 60)
    finally:
        await service.aclose()
