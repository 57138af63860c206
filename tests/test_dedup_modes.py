"""Dedup modes at enqueue (issue 22): ``debounce=max_wait`` and ``unique_for=ttl``.

Times are compared on Redis's clock (each delivery's due time against Redis's TIME taken
around the enqueues), never the test's wall clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery
from delayq.keys import TypeKeys
from delayq.testing import wait_for

FAST = {"visibility_timeout": 5.0, "scheduling_interval": 0.2, "lock_timeout": 1.0,
        "polling_timeout": 1.0, "shutdown_grace": 2.0}  # fmt: skip


class Ping(Event, event_name="dd-ping"):
    n: int = 0


class Audit(Event, event_name="dd-audit"):
    n: int = 0


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, protocol=2)
    yield client
    await client.aclose()


@pytest.fixture
async def service(redis_url: str, prefix: str) -> AsyncIterator[EventService]:
    svc = EventService.from_url(redis_url, prefix=prefix, **FAST)
    yield svc
    await svc.aclose()


async def redis_ms(raw: aioredis.Redis) -> int:
    sec, usec = await raw.time()
    return int(sec) * 1000 + int(usec) // 1000


class Runs:
    """What the handler saw: (id, n, due_ms) per run."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int, int]] = []

    async def __call__(self, event: Ping) -> None:
        d = current_delivery()
        assert d is not None and d.due_ms is not None
        self.runs.append((event.id, event.n, d.due_ms))


async def test_modes_are_checked(service: EventService) -> None:
    with pytest.raises(ValueError, match="exclusive"):
        await service.enqueue_with_delay(Ping(id="a"), 0, replace=True, debounce=1)
    with pytest.raises(ValueError, match="exclusive"):
        await service.enqueue_with_delay(Ping(id="a"), 0, debounce=1, unique_for=5)
    with pytest.raises(ValueError, match="must not exceed"):
        await service.enqueue_with_delay(Ping(id="a"), 5, debounce=1)
    for bad in (0, -1, 10**9):
        with pytest.raises(ValueError):
            await service.enqueue_with_delay(Ping(id="a"), 0, unique_for=bad)
    with pytest.raises(TypeError):
        await service.enqueue_with_delay(Ping(id="a"), 0, unique_for="1h")  # type: ignore[arg-type]


async def test_debounce_burst_runs_once_after_the_last(
    service: EventService, raw: aioredis.Redis
) -> None:
    """100 enqueues of one id within max_wait: one run, with the last payload, due
    `delay` after the last enqueue."""
    runs = Runs()
    service.add_handler(Ping, runs, concurrency=4)
    await service.start()
    for i in range(99):
        assert await service.enqueue_with_delay(Ping(id="x", n=i), 0.5, debounce=30)
    # the last enqueue's script ran between these two readings of Redis's clock
    before_last_ms = await redis_ms(raw)
    assert await service.enqueue_with_delay(Ping(id="x", n=99), 0.5, debounce=30)
    last_ms = await redis_ms(raw)
    await wait_for(lambda: runs.runs, timeout=30)
    await asyncio.sleep(0.7)  # a second run would come within this (none is due)
    assert len(runs.runs) == 1
    event_id, n, due_ms = runs.runs[0]
    assert (event_id, n) == ("x", 99)
    assert before_last_ms + 500 <= due_ms <= last_ms + 500  # the last enqueue's due time


async def test_debounce_is_capped_by_max_wait(service: EventService, raw: aioredis.Redis) -> None:
    """Enqueues that keep coming never push the event past first enqueue + max_wait."""
    runs = Runs()
    service.add_handler(Ping, runs, concurrency=4)
    await service.start()
    first_ms = await redis_ms(raw)
    await service.enqueue_with_delay(Ping(id="y", n=0), 0.4, debounce=1.0)
    # the first enqueue's script ran between these two readings of Redis's clock (a loaded
    # machine can put a long time between them: bound by the second, not by a margin)
    first_done_ms = await redis_ms(raw)
    i = 1
    while not runs.runs:
        assert i < 500, "never ran"
        await asyncio.sleep(0.05)
        await service.enqueue_with_delay(Ping(id="y", n=i), 0.4, debounce=1.0)
        i += 1
    _, n, due_ms = runs.runs[0]
    assert first_ms <= due_ms <= first_done_ms + 1000  # capped at the first enqueue + max_wait
    assert n > 0  # later payloads replaced the first


async def test_unique_for(service: EventService, raw: aioredis.Redis, prefix: str) -> None:
    runs = Runs()
    service.add_handler(Ping, runs, concurrency=4)
    await service.start()
    # while it exists: keep-first
    assert await service.enqueue_with_delay(Ping(id="u", n=1), 60, unique_for=2)
    assert not await service.enqueue_with_delay(Ping(id="u", n=2), 0, unique_for=2)
    await service.cancel(Ping, "u")  # a cancelled event was not handled: no ttl
    assert await service.enqueue_with_delay(Ping(id="u", n=3), 0, unique_for=2)
    await wait_for(lambda: len(runs.runs) == 1, timeout=30)
    # handled: refused for 2 s from the ack, then accepted again

    async def refused_mark() -> float | None:
        return await raw.zscore(TypeKeys(prefix, "dd-ping").dedup, "u:u")

    mark = await wait_for(lambda: _positive(refused_mark()), timeout=10)
    assert not await service.enqueue_with_delay(Ping(id="u", n=4), 0, unique_for=2)
    now = await redis_ms(raw)
    assert now < mark <= now + 2000

    async def accepted() -> bool:
        return await service.enqueue_with_delay(Ping(id="u", n=5), 0, unique_for=2)

    await wait_for(accepted, timeout=15, interval=0.1)
    assert await redis_ms(raw) >= mark
    await wait_for(lambda: len(runs.runs) == 2, timeout=30)
    assert [r[1] for r in runs.runs] == [3, 5]
    # a plain enqueue is not affected by the modes
    assert await service.enqueue_with_delay(Ping(id="plain"), 0)
    assert not await raw.zscore(TypeKeys(prefix, "dd-ping").dedup, "u:plain")


async def _positive(value: object) -> float | None:
    assert asyncio.iscoroutine(value)
    got = await value
    return got if got is not None and got > 0 else None


async def test_unique_for_with_groups(service: EventService, raw: aioredis.Redis) -> None:
    """With delivery groups the ttl starts when the last group has handled the event."""
    a, b = Runs(), Runs()
    service.add_handler(Audit, a, concurrency=2)
    service.add_handler(Audit, b, concurrency=2, group="audit")
    await service.start()
    await wait_for(lambda: _equals(service.groups(Audit), ["audit", "default"]), timeout=10)
    assert await service.enqueue_with_delay(Audit(id="g"), 0, unique_for=30)
    await wait_for(lambda: len(a.runs) == 1 and len(b.runs) == 1, timeout=30)

    async def refused() -> bool:
        return not await service.enqueue_with_delay(Audit(id="g"), 0, unique_for=30)

    await wait_for(refused, timeout=10)
    await asyncio.sleep(0.5)
    assert len(a.runs) == 1 and len(b.runs) == 1


async def _equals(value: object, expected: object) -> bool:
    assert asyncio.iscoroutine(value)
    return await value == expected


async def test_debounce_on_enqueue_at_and_enqueue_many(
    service: EventService, raw: aioredis.Redis
) -> None:
    """``enqueue_at`` and ``enqueue_many`` take ``debounce`` too: a burst runs once, with
    the last payload, at the last due time; a due time beyond max_wait is refused."""
    from datetime import datetime, timedelta, timezone

    runs = Runs()
    service.add_handler(Ping, runs, concurrency=4)
    with pytest.raises(ValueError, match="must not exceed"):
        await service.enqueue_at(Ping(id="a"), datetime.now(timezone.utc) + timedelta(hours=1),
                                 debounce=60)  # fmt: skip
    with pytest.raises(ValueError, match="must not exceed"):
        await service.enqueue_many([(Ping(id="ok"), 1), (Ping(id="b"), 120)], debounce=60)
    assert await service.stats_for(Ping) == await service.stats_for(Ping)  # nothing written
    assert (await service.stats_for(Ping)).scheduled == 0
    await service.start()
    for i in range(20):
        when = datetime.now(timezone.utc) + timedelta(seconds=0.5)
        assert await service.enqueue_at(Ping(id="at", n=i), when, debounce=30)
    # one call, the same id three times, then once more: the last payload wins
    assert await service.enqueue_many([(Ping(id="m", n=i), 0.4) for i in range(3)], debounce=30)
    assert await service.enqueue_many([(Ping(id="m", n=3), 0.4)], debounce=30) == [True]
    last_ms = await redis_ms(raw)
    await wait_for(lambda: len(runs.runs) == 2, timeout=30)
    await asyncio.sleep(0.7)  # a second run of either would come within this
    got = {event_id: (n, due_ms) for event_id, n, due_ms in runs.runs}
    assert len(runs.runs) == 2
    assert got["at"][0] == 19 and got["m"][0] == 3
    assert got["m"][1] <= last_ms + 400  # due 0.4 s after the last enqueue, not later


async def test_debounce_of_a_ready_event_after_its_window(
    service: EventService, raw: aioredis.Redis
) -> None:
    """An event already in the ready list when its window ended stays due now: a later
    debounced enqueue replaces its payload but does not open a new window (a busy
    consumer that has not claimed it yet must not push it back)."""
    await service.start()  # the scheduler only: nobody claims
    first_ms = await redis_ms(raw)
    assert await service.enqueue_with_delay(Ping(id="r", n=1), 0.1, debounce=0.2)

    async def ready_and_window_over() -> bool:
        info = await service.inspect(Ping, "r")
        return info.state == "ready" and await redis_ms(raw) > first_ms + 300

    await wait_for(ready_and_window_over, timeout=15)
    assert await service.enqueue_with_delay(Ping(id="r", n=2), 0.2, debounce=0.2)
    info = await service.inspect(Ping, "r")
    assert info.state == "ready" and info.payload is not None
    assert info.event is not None and info.event.n == 2  # type: ignore[attr-defined]
