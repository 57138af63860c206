"""Looking queues up: inspect one event in every state, list scheduled events, counts with
the next due time and the backlog's age, dead-letter operations by wire name, health()."""

from __future__ import annotations

import asyncio
import base64
from datetime import datetime, timedelta, timezone

import msgspec
import pytest
from core_support import ServicePool

from delayq import Event, EventService, fixed
from delayq.codec import Codec
from delayq.keys import TypeKeys
from delayq.views.inspection import decode_payload


class Look(Event, event_name="look-job"):
    """The event of these tests."""

    n: int = 0
    tags: list[str] = []


@pytest.fixture
async def services(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix, retry_backoff=fixed(0.05))
    yield pool
    await pool.aclose()


def close_to(when: datetime | None, expected: datetime, slack: float = 5.0) -> bool:
    return when is not None and abs((when - expected).total_seconds()) < slack


async def test_scheduled_state_listing_and_counts(services) -> None:
    producer = services.producer()
    now = datetime.now(timezone.utc)
    await producer.enqueue_with_delay(
        Look(id="a", n=1, tags=["x"]), timedelta(hours=3), context={"k": "v"}
    )
    await producer.enqueue_with_delay(Look(id="b", n=2), timedelta(hours=1))
    await producer.enqueue_with_delay(Look(id="c", n=3), timedelta(hours=2))

    for ref in (Look, "look-job"):
        info = await producer.inspect(ref, "a")
        assert info.state == "scheduled"
        assert close_to(info.due_at, now + timedelta(hours=3))
        assert info.attempts == 0 and info.last_error is None and info.lease_deadline is None
        assert info.context == {"k": "v"}
        assert info.payload == {"n": 1, "tags": ["x"], "id": "a"}
        assert info.event == Look(id="a", n=1, tags=["x"])
        assert info.serializer == "msgpack" and info.raw
        assert close_to(info.enqueued_at, now)
        d = info.to_dict()
        assert d["state"] == "scheduled" and d["type"] == "look-job"
        assert base64.b64decode(d["raw_base64"]) == info.raw
        msgspec.json.encode(d)  # JSON-able

    page = await producer.scheduled("look-job", limit=2)
    assert [e.id for e in page] == ["b", "c"]
    assert [e.id for e in await producer.scheduled(Look, limit=2, offset=2)] == ["a"]
    assert await producer.scheduled(Look, offset=3) == []
    assert page[0].payload == {"n": 2, "tags": [], "id": "b"}
    with pytest.raises(ValueError):
        await producer.scheduled(Look, limit=0)
    with pytest.raises(ValueError):
        await producer.scheduled(Look, limit=10, offset=-1)

    counts = await producer.stats_for("look-job")
    assert (counts.scheduled, counts.ready, counts.in_flight, counts.dead) == (3, 0, 0, 0)
    assert close_to(counts.next_due_at, now + timedelta(hours=1))
    assert counts.backlog_age == 0 and counts.due == 0
    assert (await producer.stats())["look-job"] == counts


async def test_absent_and_stranded(services, redis_client, prefix) -> None:
    producer = services.producer()
    info = await producer.inspect("look-job", "nope")
    assert info.state == "absent" and info.raw is None and info.payload is None
    keys = TypeKeys(prefix, "look-job")
    await redis_client.hset(keys.events, "ghost", b"garbage")
    info = await producer.inspect(Look, "ghost")
    assert info.state == "stranded"
    assert info.decode_error and "not a delayq envelope" in info.decode_error
    with pytest.raises(ValueError):
        await producer.inspect("bad name", "x")
    with pytest.raises(ValueError):
        await producer.inspect(Look, "")


async def test_ready_state_and_backlog(services, wait_for) -> None:
    # a scheduler but no handler: due events wait in the ready list
    service = await services.start()
    await service.enqueue_with_delay(Look(id="r"), 0)

    async def is_ready() -> bool:
        return (await service.inspect("look-job", "r")).state == "ready"

    await wait_for(is_ready)

    async def aged():
        counts = await service.stats_for("look-job")
        return counts if counts.backlog_age >= 0.2 else None

    counts = await wait_for(aged)
    assert counts.ready == 1 and counts.due == 1 and counts.scheduled == 0
    assert counts.next_due_at is None


async def test_overdue_scheduled_counts_as_backlog(services, wait_for) -> None:
    producer = services.producer()  # no scheduler anywhere: due events stay scheduled
    # (delay 0 would go straight to the ready list)
    await producer.enqueue_with_delay(Look(id="o1"), 0.05)
    await producer.enqueue_with_delay(Look(id="o2"), 0.05)
    await producer.enqueue_with_delay(Look(id="later"), 3600)

    async def aged():
        counts = await producer.stats_for(Look)
        return counts if counts.backlog_age >= 0.2 else None

    counts = await wait_for(aged)
    assert counts.due == 2 and counts.ready == 0 and counts.scheduled == 3


async def test_in_flight_and_dead(services, wait_for) -> None:
    release = asyncio.Event()

    async def handler(event: Look) -> None:
        if event.n == 1:
            await release.wait()
            return
        raise RuntimeError(f"no {event.id}")

    service = await services.start(retry_attempts=0)
    service.add_handler(Look, handler, concurrency=4)
    await service.enqueue_with_delay(Look(id="slow", n=1), 0)
    await service.enqueue_with_delay(Look(id="bad", n=2), 0, context={"why": "test"})

    async def state(i: str, want: str):
        info = await service.inspect("look-job", i)
        return info if info.state == want else None

    slow = await wait_for(lambda: state("slow", "in_flight"))
    assert slow.attempts == 1 and slow.lease_deadline is not None
    assert slow.lease_deadline > slow.checked_at
    bad = await wait_for(lambda: state("bad", "dead"))
    assert bad.attempts == 1 and bad.last_error == "RuntimeError: no bad"
    assert bad.failed_at is not None and bad.context == {"why": "test"}
    counts = await service.stats_for(Look)
    assert (counts.in_flight, counts.dead) == (1, 1)

    dead = await service.dead_letters("look-job")
    assert [d.id for d in dead] == ["bad"]
    assert dead[0].payload == {"n": 2, "tags": [], "id": "bad"}
    assert dead[0].to_dict()["error"] == "RuntimeError: no bad"

    release.set()
    await wait_for(lambda: state("slow", "absent"))

    # by wire name: requeue (it fails again), purge, cancel
    assert await service.requeue_dead_letters("look-job", ids=["bad"], delay=3600) == 1
    again = await service.inspect("look-job", "bad")
    assert again.state == "scheduled" and again.attempts == 0
    assert await service.cancel("look-job", "bad")
    assert (await service.inspect("look-job", "bad")).state == "absent"


async def test_purge_by_name(services, wait_for) -> None:
    async def fail(event: Look) -> None:
        raise ValueError("x")

    service = await services.start(retry_attempts=0)
    service.add_handler(Look, fail, concurrency=4)
    await service.enqueue_many([Look(id=f"d{i}") for i in range(5)])

    async def dead5() -> bool:
        return (await service.stats_for("look-job")).dead == 5

    await wait_for(dead5)
    assert await service.purge_dead_letters("look-job", ids=["d0", "d1"]) == 2
    assert await service.purge_dead_letters("look-job") == 3
    assert (await service.stats_for("look-job")).dead == 0


@pytest.mark.parametrize("serializer", ["msgpack", "json"])
def test_untyped_decode(serializer) -> None:
    class Rich(Event, event_name=f"look-rich-{serializer}"):
        when: datetime
        blob: bytes
        nested: dict[str, list[int]]

    event = Rich(
        id="z", when=datetime(2026, 1, 2, tzinfo=timezone.utc), blob=b"\x00\x01", nested={"a": [1]}
    )
    codec = Codec(serializer)
    envelope = codec.encode(event, {"c": "d"})
    typed = decode_payload(envelope, "z", Rich, codec)
    plain = decode_payload(envelope, "z", None, codec)
    assert typed.event == event and plain.event is None
    assert plain.context == typed.context == {"c": "d"}
    assert plain.payload["id"] == "z" and plain.payload["nested"] == {"a": [1]}
    assert plain.payload["blob"] == typed.payload["blob"] == "AAE="
    assert typed.payload["when"].startswith("2026-01-02")
    msgspec.json.encode(plain.payload)
    bad = decode_payload(b"\x93\xc4\x01x", "z", Rich, codec)
    assert bad.error and bad.payload is None


async def test_health(services, redis_server_factory) -> None:
    server = redis_server_factory()
    service = EventService.from_url(server.url, prefix="h", polling_timeout=0.5)
    service.add_handler(Look, _noop)
    before = await service.health()
    assert not before.alive and not before.ready
    await service.start()
    try:
        ok = await service.health()
        assert ok.alive and ok.ready and ok.redis_ok
        assert ok.loops == {"scheduler": True, "consumer:look-job": True}
        server.stop()
        down = await service.health(timeout=1.0)
        assert down.alive and not down.ready and not down.redis_ok and down.redis_error
        server.start()
    finally:
        await service.aclose()
    after = await service.health()
    assert not after.alive and not after.ready


async def _noop(event: Look) -> None:
    return None
