"""Enqueueing: validation, dedup and replace, enqueue_many, cancel, context and stats (issue 2)."""

from __future__ import annotations

import asyncio
import math
from datetime import datetime, timedelta, timezone

import msgspec
import pytest
import redis.asyncio as aioredis
from core_support import Recorder, ServicePool, drained, prefix_keys, redis_time_ms

from delayq import (
    Event,
    EventService,
    InMemoryMetrics,
    QueueCounts,
    current_delivery,
    event_context,
    lua,
)
from delayq.codec import Codec
from delayq.keys import TypeKeys


class EnqJob(Event, event_name="core-enq-job"):
    """The main event type of these tests."""

    v: int = 0
    text: str = ""


class EnqOther(Event, event_name="core-enq-other"):
    """A second type."""

    v: int = 0


class EnqMarker(Event, event_name="core-enq-marker"):
    """Handled after the events under test, to show they were skipped."""


class NotAnEvent(msgspec.Struct, kw_only=True):
    id: str


@pytest.fixture
async def services(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix)
    yield pool
    await pool.aclose()


# --------------------------------------------------------------------------- bad input


async def test_bad_input_raises_and_writes_nothing(services, redis_client, prefix) -> None:
    service = services.producer(max_payload_bytes=200)
    ok = EnqJob(id="ok", v=1)
    bad_calls = [
        (TypeError, service.enqueue_with_delay({"id": "x"}, 0)),  # type: ignore[arg-type]
        (TypeError, service.enqueue_with_delay(NotAnEvent(id="x"), 0)),  # type: ignore[arg-type]
        (TypeError, service.enqueue_with_delay(EnqJob, 0)),  # type: ignore[arg-type]
        (TypeError, service.enqueue_with_delay(EnqJob(id=5), 0)),  # type: ignore[arg-type]
        (ValueError, service.enqueue_with_delay(ok, -1)),
        (ValueError, service.enqueue_with_delay(ok, -0.001)),
        (ValueError, service.enqueue_with_delay(ok, timedelta(seconds=-1))),
        (ValueError, service.enqueue_with_delay(ok, math.nan)),
        (ValueError, service.enqueue_with_delay(ok, math.inf)),
        (ValueError, service.enqueue_with_delay(ok, -math.inf)),
        (TypeError, service.enqueue_with_delay(ok, True)),  # type: ignore[arg-type]
        (TypeError, service.enqueue_with_delay(ok, "5")),  # type: ignore[arg-type]
        (TypeError, service.enqueue_with_delay(ok, None)),  # type: ignore[arg-type]
        (ValueError, service.enqueue_with_delay(EnqJob(id="big", text="x" * 300), 0)),
        (TypeError, service.enqueue_with_delay(ok, 0, context={"a": 1})),  # type: ignore[dict-item]
        (TypeError, service.enqueue_with_delay(ok, 0, context={1: "a"})),  # type: ignore[dict-item]
        (TypeError, service.enqueue_with_delay(ok, 0, context="a=b")),  # type: ignore[arg-type]
        (TypeError, service.enqueue_with_delay(ok, 0, context=[("a", "b")])),  # type: ignore[arg-type]
        (ValueError, service.enqueue_at(ok, datetime(2030, 1, 1))),
        (ValueError, service.enqueue_at(ok, datetime.now())),
        (TypeError, service.enqueue_at(ok, 1_900_000_000)),  # type: ignore[arg-type]
        (TypeError, service.enqueue_at(ok, "2030-01-01T00:00:00Z")),  # type: ignore[arg-type]
        # enqueue_many validates every item before writing any
        (ValueError, service.enqueue_many([ok, EnqJob(id="big", text="x" * 300)])),
        (TypeError, service.enqueue_many([ok, EnqOther(id="o"), "nope"])),  # type: ignore[list-item]
        (ValueError, service.enqueue_many([ok, (EnqOther(id="o"), -1)])),
        (ValueError, service.enqueue_many([(ok, math.nan)])),
        (TypeError, service.enqueue_many([(ok, 1, 2)])),  # type: ignore[list-item]
        (TypeError, service.enqueue_many([ok], context={"a": 2})),  # type: ignore[dict-item]
        (ValueError, service.enqueue_many([ok], delay=-5)),
        (TypeError, service.enqueue_many([ok], delay=False)),
    ]
    for expected, call in bad_calls:
        with pytest.raises(expected):
            await call
    assert await prefix_keys(redis_client, prefix) == []
    assert await redis_client.keys(f"*{prefix}*") == []
    # a payload at the limit is fine
    assert await service.enqueue_with_delay(EnqJob(id="fits", text="x" * 100), 0)
    assert (await service.stats_for(EnqJob)).ready == 1


async def test_bad_options_raise_clear_errors(redis_url: str, redis_client) -> None:
    cases = [
        (TypeError, {"retry_attempts": "3"}),
        (TypeError, {"retry_attempts": True}),
        (TypeError, {"retry_attempts": 1.5}),
        (ValueError, {"retry_attempts": -1}),
        (TypeError, {"retry_backoff": 3}),
        (ValueError, {"visibility_timeout": 0}),
        (ValueError, {"visibility_timeout": -1}),
        (ValueError, {"visibility_timeout": math.nan}),
        (TypeError, {"visibility_timeout": "15"}),
        (ValueError, {"handler_timeout": 0}),
        (ValueError, {"handler_timeout": -1}),
        (ValueError, {"scheduling_interval": 0}),
        (ValueError, {"scheduling_interval": math.inf}),
        (ValueError, {"scheduling_batch_size": 0}),
        (TypeError, {"scheduling_batch_size": 10.0}),
        (TypeError, {"enable_scheduling": "yes"}),
        (ValueError, {"polling_timeout": 0}),
        (ValueError, {"polling_timeout": -1}),
        (ValueError, {"lock_timeout": 0}),
        (ValueError, {"lock_timeout": 1.0, "scheduling_interval": 2.0}),
        (ValueError, {"serializer": "pickle"}),
        (ValueError, {"max_payload_bytes": 0}),
        (TypeError, {"max_payload_bytes": "1k"}),
        (TypeError, {"metrics": object()}),
        (ValueError, {"shutdown_grace": -1}),
        (TypeError, {"prefix": 5}),
        (TypeError, {"no_such_option": 1}),
    ]
    for expected, options in cases:
        with pytest.raises(expected) as info:
            EventService.from_url(redis_url, **options)
        # the message names the option
        name = next(iter(options)) if len(options) == 1 else "lock_timeout"
        assert name in str(info.value), (options, info.value)
        with pytest.raises(expected):
            EventService(redis_client, **options)
    with pytest.raises(TypeError):
        EventService("redis://localhost")  # type: ignore[arg-type]
    decoding = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ValueError, match="decode_responses"):
            EventService(decoding)
    finally:
        await decoding.aclose()


async def test_bad_handlers_are_refused(services) -> None:
    service = services.make()

    def sync_handler(event: EnqJob) -> None:
        pass

    with pytest.raises(TypeError):
        service.add_handler(EnqJob, sync_handler)
    with pytest.raises(TypeError):
        service.add_handler(NotAnEvent, Recorder())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        service.add_handler(Event, Recorder())
    for bad in (0, -1, True, 1.5, 10_001):
        with pytest.raises(ValueError, match="concurrency"):
            service.add_handler(EnqJob, Recorder(), concurrency=bad)  # type: ignore[arg-type]
    service.add_handler(EnqJob, Recorder())
    with pytest.raises(ValueError, match="already"):
        service.add_handler(EnqJob, Recorder())


# --------------------------------------------------------------------------- dedup and replace


async def test_same_id_is_kept_unless_replaced(services, redis_client, wait_for) -> None:
    metrics = InMemoryMetrics()
    service = await services.start(metrics=metrics)
    assert await service.enqueue_with_delay(EnqJob(id="a", v=1), 60, context={"k": "1"})
    # same id again: kept, whatever the payload, context or delay
    assert not await service.enqueue_with_delay(EnqJob(id="a", v=2), 0, context={"k": "2"})
    assert not await service.enqueue_with_delay(EnqJob(id="a", v=1), 60, context={"k": "1"})
    assert not await service.enqueue_at(EnqJob(id="a", v=3), datetime.now(timezone.utc))
    counts = await service.stats_for(EnqJob)
    assert (counts.scheduled, counts.ready) == (1, 0)

    # replace: payload, context and due time change together
    before = await redis_time_ms(redis_client)
    assert await service.enqueue_with_delay(
        EnqJob(id="a", v=4), 0.3, context={"k": "4"}, replace=True
    )
    after = await redis_time_ms(redis_client)
    recorder = Recorder()
    service.add_handler(EnqJob, recorder)
    await wait_for(recorder.handled(1), timeout=10)
    await wait_for(lambda: drained(service, EnqJob), timeout=5)
    assert recorder.events == [EnqJob(id="a", v=4)]
    assert recorder.contexts == [{"k": "4"}]
    delivery = recorder.deliveries[0]
    assert before + 300 <= delivery.due_ms <= after + 300
    assert delivery.claimed_us / 1000 >= delivery.due_ms
    assert metrics.total("enqueued") == 1
    assert metrics.total("kept") == 3
    assert metrics.total("replaced") == 1


async def test_replace_of_a_ready_event(services, wait_for) -> None:
    service = await services.start()
    assert await service.enqueue_with_delay(EnqJob(id="r", v=1), 0, context={"k": "1"})
    assert await service.enqueue_with_delay(EnqJob(id="s", v=1), 0)
    assert (await service.stats_for(EnqJob)).ready == 2
    # r: ready -> replaced with a new ready payload; s: ready -> replaced by a later due time
    assert await service.enqueue_with_delay(
        EnqJob(id="r", v=2), 0, context={"k": "2"}, replace=True
    )
    assert await service.enqueue_with_delay(EnqJob(id="s", v=2), 60, replace=True)
    counts = await service.stats_for(EnqJob)
    assert (counts.scheduled, counts.ready) == (1, 1)
    assert await service.enqueue_with_delay(EnqJob(id="marker", v=9), 0)

    recorder = Recorder()
    service.add_handler(EnqJob, recorder)  # concurrency 1: in ready-list order
    await wait_for(lambda: "marker" in recorder.ids, timeout=10)
    assert recorder.events == [EnqJob(id="r", v=2), EnqJob(id="marker", v=9)]
    assert recorder.contexts[0] == {"k": "2"}
    counts = await service.stats_for(EnqJob)
    assert (counts.scheduled, counts.ready) == (1, 0)
    assert await service.cancel(EnqJob, "s")


async def test_replace_of_an_in_flight_event(services, wait_for) -> None:
    gate = asyncio.Event()

    async def slow_first(event: EnqJob) -> None:
        if event.v == 1:
            await gate.wait()

    service = await services.start()
    recorder = Recorder(slow_first)
    service.add_handler(EnqJob, recorder, concurrency=2)
    assert await service.enqueue_with_delay(EnqJob(id="f", v=1), 0, context={"k": "1"})
    await wait_for(lambda: recorder.started == 1, timeout=10)
    assert (await service.stats_for(EnqJob)).in_flight == 1
    assert await service.enqueue_with_delay(
        EnqJob(id="f", v=2), 0, context={"k": "2"}, replace=True
    )
    await wait_for(lambda: recorder.finished == 1, timeout=10)  # v=2 runs while v=1 still waits
    gate.set()
    await wait_for(recorder.handled(2), timeout=10)
    await wait_for(lambda: drained(service, EnqJob), timeout=5)
    assert [e.v for e in recorder.events] == [1, 2]
    assert recorder.contexts == [{"k": "1"}, {"k": "2"}]
    # the old delivery's late ack did not remove the new one, which was acked itself
    assert await service.stats_for(EnqJob) == QueueCounts(0, 0, 0, 0)
    assert sorted(recorder.counts.values()) == [2]


async def test_enqueue_many_mixes_new_and_existing_ids(services, redis_client, wait_for) -> None:
    service = services.producer()
    assert await service.enqueue_with_delay(EnqJob(id="a", v=0), 60)
    assert await service.enqueue_with_delay(EnqJob(id="b", v=0), 60)
    before = await redis_time_ms(redis_client)
    results = await service.enqueue_many(
        [
            EnqJob(id="a", v=1),
            EnqJob(id="c", v=1),
            (EnqJob(id="d", v=1), 0.5),
            (EnqJob(id="e", v=1), timedelta(0)),
            EnqOther(id="a", v=1),  # another type: its own ids
            EnqJob(id="b", v=1),
        ],
        delay=60,
    )
    assert results == [False, True, True, True, True, False]
    counts = await service.stats_for(EnqJob)
    assert (counts.scheduled, counts.ready) == (4, 1)  # a, b, c, d scheduled; e ready
    assert (await service.stats_for(EnqOther)).scheduled == 1

    # a duplicate id inside one call: the first wins
    assert await service.enqueue_many([EnqJob(id="x", v=1), EnqJob(id="x", v=2)]) == [True, False]
    assert await service.enqueue_many([EnqJob(id="y", v=1), EnqJob(id="y", v=1)]) == [True, False]
    assert await service.enqueue_many([]) == []

    # replace=True replaces existing ones and adds new ones
    results = await service.enqueue_many(
        [EnqJob(id="a", v=2), (EnqJob(id="b", v=2), 0), EnqJob(id="z", v=2)], replace=True
    )
    assert results == [True, True, True]

    consumer = await services.start()
    recorder = Recorder()
    consumer.add_handler(EnqJob, recorder, concurrency=10)
    # ready now: a (v2), b (v2), z, e, x (v1), y; d after 0.5 s; c stays scheduled for 60 s
    await wait_for(recorder.handled(7), timeout=10)
    got = {e.id: e.v for e in recorder.events}
    assert got == {"a": 2, "b": 2, "z": 2, "e": 1, "x": 1, "y": 1, "d": 1}
    d = recorder.deliveries[recorder.ids.index("d")]
    assert d.due_ms >= before + 500
    assert d.claimed_us / 1000 >= d.due_ms
    counts = await consumer.stats_for(EnqJob)
    assert (counts.scheduled, counts.ready) == (1, 0)


async def test_enqueue_many_in_several_chunks(services) -> None:
    service = services.producer()
    events = [EnqJob(id=f"m{i}", v=i) for i in range(450)]
    assert await service.enqueue_many(events, delay=30) == [True] * 450
    again = events[:10] + [EnqJob(id=f"n{i}") for i in range(440)]
    assert await service.enqueue_many(again, delay=30) == [False] * 10 + [True] * 440
    assert (await service.stats_for(EnqJob)).scheduled == 890


async def test_repeated_identical_enqueue_reports_kept(services) -> None:
    """Enqueueing the very same event twice in a row returns True then False."""
    service = services.producer()
    for i in range(200):
        event = EnqJob(id=f"same-{i}", v=1)
        assert await service.enqueue_with_delay(event, 30)
        assert not await service.enqueue_with_delay(event, 30), i


# --------------------------------------------------------------------------- cancel


async def test_cancel_scheduled_ready_in_flight_and_dead(services, wait_for) -> None:
    gate = asyncio.Event()

    async def behaviour(event: EnqJob) -> bool:
        if event.id == "inflight":
            await gate.wait()
        return event.id != "dead"

    service = await services.start(retry_attempts=0)
    # scheduled
    assert await service.enqueue_with_delay(EnqJob(id="sched"), 60)
    assert await service.cancel(EnqJob, "sched")
    assert not await service.cancel(EnqJob, "sched")
    assert not await service.cancel(EnqJob, "never-enqueued")
    # ready, with no handler registered yet
    assert await service.enqueue_with_delay(EnqJob(id="ready"), 0)
    assert (await service.stats_for(EnqJob)).ready == 1
    assert await service.cancel(EnqJob, "ready")
    assert not await service.cancel(EnqJob, "ready")

    recorder = Recorder(behaviour)
    service.add_handler(EnqJob, recorder, concurrency=2)
    # in flight
    assert await service.enqueue_with_delay(EnqJob(id="inflight"), 0)
    await wait_for(lambda: recorder.started == 1, timeout=10)
    assert await service.cancel(EnqJob, "inflight")
    assert (await service.stats_for(EnqJob)).in_flight == 0
    gate.set()
    await wait_for(lambda: recorder.finished == 1, timeout=10)
    # a dead letter is not cancelled
    assert await service.enqueue_with_delay(EnqJob(id="dead"), 0)
    await wait_for(async_dead_count(service, 1), timeout=10)
    assert not await service.cancel(EnqJob, "dead")
    assert [d.id for d in await service.dead_letters(EnqJob)] == ["dead"]

    assert await service.enqueue_with_delay(EnqJob(id="marker"), 0)
    await wait_for(lambda: "marker" in recorder.ids, timeout=10)
    await wait_for(lambda: drained(service, EnqJob), timeout=5)
    # cancelled events were never delivered; the cancelled in-flight one not again
    assert recorder.ids == ["inflight", "dead", "marker"]


def async_dead_count(service: EventService, n: int):
    async def check() -> bool:
        return (await service.stats_for(EnqJob)).dead == n

    return check


# --------------------------------------------------------------------------- context


async def test_event_context_inside_and_outside_handlers(services, wait_for) -> None:
    seen: dict[str, object] = {}

    async def behaviour(event: EnqJob) -> None:
        await asyncio.sleep(0)  # still the same delivery after a switch
        seen[event.id] = (dict(event_context()), current_delivery().context)

    service = await services.start()
    recorder = Recorder(behaviour)
    service.add_handler(EnqJob, recorder, concurrency=3)
    ctx = {"request_id": "r-1", "user": "ünïcode", "empty": ""}
    assert await service.enqueue_with_delay(EnqJob(id="with"), 0, context=ctx)
    assert await service.enqueue_with_delay(EnqJob(id="without"), 0)
    assert await service.enqueue_with_delay(EnqJob(id="empty"), 0, context={})
    await wait_for(recorder.handled(3), timeout=10)
    assert seen["with"] == (ctx, ctx)
    assert seen["without"] == ({}, {})
    assert seen["empty"] == ({}, {})
    assert dict(event_context()) == {}
    assert current_delivery() is None


# --------------------------------------------------------------------------- stats


async def test_stats_lists_every_type_under_the_prefix(services, wait_for) -> None:
    producer = services.producer()
    await producer.enqueue_with_delay(EnqJob(id="s1"), 60)
    await producer.enqueue_with_delay(EnqJob(id="r1"), 0)
    await producer.enqueue_with_delay(EnqOther(id="r1"), 0)
    await producer.enqueue_with_delay(EnqOther(id="r2"), 0)
    # a fresh process that handles neither type still sees both
    other = await services.start()
    stats = await other.stats()
    assert set(stats) == {"core-enq-job", "core-enq-other"}
    assert (stats["core-enq-job"].scheduled, stats["core-enq-job"].ready) == (1, 1)
    assert (stats["core-enq-other"].scheduled, stats["core-enq-other"].ready) == (0, 2)
    assert all(c.in_flight == 0 and c.dead == 0 for c in stats.values())


async def test_enqueue_with_timedelta_and_at(services, redis_client, wait_for) -> None:
    service = await services.start()
    recorder = Recorder()
    service.add_handler(EnqJob, recorder, concurrency=2)
    now = await redis_time_ms(redis_client)
    assert await service.enqueue_with_delay(EnqJob(id="td"), timedelta(milliseconds=300))
    at = datetime.fromtimestamp((now + 400) / 1000, timezone(timedelta(hours=5)))
    assert await service.enqueue_at(EnqJob(id="at"), at)
    past = datetime(2000, 1, 1, tzinfo=timezone.utc)
    assert await service.enqueue_at(EnqJob(id="past"), past)
    await wait_for(recorder.handled(3), timeout=10)
    by_id = {d.id: d for d in recorder.deliveries}
    assert by_id["td"].due_ms >= now + 300
    assert by_id["at"].due_ms == math.ceil(at.timestamp() * 1000)
    for d in recorder.deliveries:
        assert d.claimed_us / 1000 >= d.due_ms
    assert recorder.ids[0] == "past"


async def test_a_retried_enqueue_call_reports_its_own_write(redis_client, prefix) -> None:
    """The enqueue script run twice with the same arguments (a retry after a lost reply)."""
    script = redis_client.register_script(lua.source("enqueue"))
    keys = list(TypeKeys(prefix, "core-enq-job").all())
    channel = f"{{{prefix}}}:wakeup"
    envelope = Codec().encode(EnqJob(id="r", v=1))

    async def run(flags: str, *items: tuple[str, bytes, int]) -> list[int]:
        args = ["delay", flags, channel, "core-enq-job", *(x for item in items for x in item)]
        return [int(c) for c in await script(keys=keys, args=args)]

    assert await run("0:aa:1", ("r", envelope, 60_000)) == [1]
    assert await run("0:aa:1", ("r", envelope, 60_000)) == [1]  # the same call again
    assert await run("0:bb:1", ("r", envelope, 60_000)) == [0]  # a new call: kept
    # a pipelined call of two chunks, sent twice
    other = Codec().encode(EnqJob(id="s", v=1))
    for _ in range(2):
        assert await run("0:cc:1", ("t", envelope, 60_000)) == [1]
        assert await run("0:cc:2", ("s", other, 60_000), ("s", other, 60_000)) == [1, 0]
    # without a call id (older callers) identical bytes count as a retry
    assert await run("0", ("r", envelope, 60_000)) == [1]
    assert await redis_client.zcard(keys[1]) == 3


async def test_concurrent_enqueues_of_one_event_add_it_once(services) -> None:
    """Many tasks enqueue the same event at once: one True, the rest False (kept)."""
    service = services.producer()
    event = EnqJob(id="concurrent", v=1)
    results = await asyncio.gather(*(service.enqueue_with_delay(event, 30) for _ in range(50)))
    assert results.count(True) == 1
    counts = await service.stats_for(EnqJob)
    assert (counts.scheduled, counts.ready) == (1, 0)
    results = await asyncio.gather(
        *(service.enqueue_with_delay(event, 30, replace=True) for _ in range(10))
    )
    assert results == [True] * 10


class EnqEu(Event, event_name="eu"):
    """A type whose name is the last part of a colon prefix (see the test below)."""


async def test_prefixes_may_hold_colons_and_stay_apart(redis_url: str, prefix: str) -> None:
    """README: prefixes may contain ':' (type and group names may not), and a prefix
    ``p:eu`` never shares a key with the type ``eu`` under the prefix ``p``."""
    outer = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    inner = EventService.from_url(redis_url, prefix=f"{prefix}:eu", enable_scheduling=False)
    try:
        assert await outer.enqueue_with_delay(EnqEu(id="x"), 60)
        assert await inner.enqueue_with_delay(EnqJob(id="x"), 60)
        assert await inner.enqueue_with_delay(EnqEu(id="x"), 60)
        assert set(await outer.stats()) == {"eu"}
        assert set(await inner.stats()) == {"eu", "core-enq-job"}
        assert (await outer.stats_for(EnqEu)).scheduled == 1
        assert (await inner.stats_for(EnqEu)).scheduled == 1
        assert await outer.cancel(EnqEu, "x")
        assert (await inner.stats_for(EnqEu)).scheduled == 1
    finally:
        await outer.aclose()
        await inner.aclose()
    for bad, message in (("a{b", "braces"), ("a b", "whitespace"), ("", "1 to")):
        with pytest.raises(ValueError, match=message):
            EventService.from_url(redis_url, prefix=bad)
    with pytest.raises(ValueError, match="may not contain ':'"):

        class Colon(Event, event_name="a:b"):
            pass
