"""Priority levels (issue 34): strict order among a type's ready events, aging, retries,
replace, the API's checks, counts per level and the cost of an insert at any backlog.

Real Redis throughout; the several-process and cluster tests are in
``tests/test_priorities_fleet.py``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from delayq import Event, EventService, QueueCounts, fixed
from delayq.keys import PrefixKeys, TypeKeys
from delayq.partitions.shards import shards


class Job(Event, event_name="prio-job"):
    n: int = 0


class Report(Event, event_name="prio-report", priority=5):
    pass


FAST = {"visibility_timeout": 5.0, "scheduling_interval": 0.2, "polling_timeout": 0.5}


async def _service(url: str, prefix: str, **kw: object) -> EventService:
    return EventService.from_url(url, prefix=prefix, **{**FAST, **kw})  # type: ignore[arg-type]


async def _handled_order(
    service: EventService, count: int, concurrency: int = 1
) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []
    done = asyncio.Event()

    async def handle(event: Job) -> None:
        seen.append((event.id, event.n))
        if len(seen) >= count:
            done.set()

    service.add_handler(Job, handle, concurrency=concurrency)
    async with service:
        await asyncio.wait_for(done.wait(), 20)
    return seen


async def test_lower_levels_first_then_due_order(redis_url: str, prefix: str) -> None:
    producer = await _service(redis_url, prefix, enable_scheduling=False)
    async with producer:
        # enqueued least urgent first: level 9 .. 0, three each, in due order
        for level in range(9, -1, -1):
            for k in range(3):
                await producer.enqueue_with_delay(Job(id=f"{level}-{k}", n=level), priority=level)
        counts = await producer.stats_for(Job)
        assert counts.ready == 30
        assert counts.ready_by_priority == {n: 3 for n in range(10)}
        info = await producer.inspect(Job, "7-1")
        assert info.priority == 7 and info.state == "ready"
    seen = await _handled_order(await _service(redis_url, prefix), 30)
    assert seen == [(f"{level}-{k}", level) for level in range(10) for k in range(3)]


async def test_claim_batches_take_the_most_urgent_level(
    redis_url: str, prefix: str, redis_client: aioredis.Redis
) -> None:
    service = await _service(redis_url, prefix, enable_scheduling=False)
    store = service.store
    async with service:
        await service.enqueue_many([Job(id=f"low-{i}", n=9) for i in range(100)], priority=9)
        got = await store.deliveries.pop_ready("prio-job", 1.0)
        assert got is not None and got[1] == 9  # BRPOP: the only non-empty level
        # an urgent one arrives between the BRPOP and its claim
        await service.enqueue_with_delay(Job(id="urgent"), priority=0)
        # one free slot: the claim takes the urgent event, the popped one goes back
        _, claimed, _ = await store.deliveries.claim_limited("prio-job", [got[0]], 0, 5000, level=9)
        assert [c.raw_id for c in claimed] == [b"urgent"]
        # a batch of 64: level 0 first (empty now), then level 9 in order, the popped
        # entry (low-0) first again
        _, claimed, _ = await store.deliveries.claim_limited("prio-job", [], 64, 5000)
        assert [c.raw_id.decode() for c in claimed] == [f"low-{i}" for i in range(64)]
        keys = TypeKeys(prefix, "prio-job")
        assert await redis_client.llen(keys.level_lists()[8]) == 36
        assert not await redis_client.exists(*keys.level_lists()[:8])


async def test_unused_levels_create_no_keys(
    redis_url: str, prefix: str, redis_client: aioredis.Redis
) -> None:
    service = await _service(redis_url, prefix)
    async with service:
        await service.enqueue_many([Job(id=str(i)) for i in range(10)])
        await service.enqueue_with_delay(Job(id="later"), timedelta(milliseconds=50))
    keys = TypeKeys(prefix, "prio-job")
    assert not await redis_client.exists(keys.prio, *keys.level_lists())
    fields = await redis_client.hkeys(keys.meta)
    assert not [f for f in fields if f.startswith(b"pushed:")]


@pytest.mark.parametrize("bad", [-1, 10, 1.0, "1", True, None])
async def test_bad_priorities_raise_and_write_nothing(
    redis_url: str, prefix: str, redis_client: aioredis.Redis, bad: object
) -> None:
    service = await _service(redis_url, prefix, enable_scheduling=False)
    keys = TypeKeys(prefix, "prio-job")
    async with service:
        calls = [
            service.enqueue_with_delay(Job(id="a"), priority=bad),  # type: ignore[arg-type]
            service.enqueue_many([Job(id="b")], priority=bad),  # type: ignore[arg-type]
            service.enqueue_envelopes("prio-job", [("c", b"x", 0)], priority=bad),  # type: ignore[arg-type]
        ]
        for call in calls:
            if bad is None:  # None: the class's default, a valid call
                await call
                continue
            with pytest.raises(ValueError):
                await call
        if bad is not None:
            assert not await redis_client.exists(keys.events)
    with pytest.raises(ValueError):

        class Bad(Event, event_name="prio-bad", priority=10):
            pass


async def test_class_default_and_replace_changes_the_level(
    redis_url: str, prefix: str, redis_client: aioredis.Redis
) -> None:
    service = await _service(redis_url, prefix, enable_scheduling=False)
    keys = TypeKeys(prefix, "prio-report")
    async with service:
        await service.enqueue_with_delay(Report(id="r"), timedelta(hours=1))
        assert (await service.inspect(Report, "r")).priority == 5
        await service.enqueue_with_delay(Report(id="r"), timedelta(hours=1), priority=2)
        assert (await service.inspect(Report, "r")).priority == 5  # kept: not replaced
        await service.enqueue_with_delay(Report(id="r"), priority=1, replace=True)
        assert (await service.inspect(Report, "r")).priority == 1
        assert (await service.stats_for(Report)).ready_by_priority == {1: 1}
        await service.enqueue_with_delay(Report(id="r"), replace=True, priority=0)
        assert (await service.inspect(Report, "r")).priority == 0
        assert not await redis_client.exists(keys.prio)
        await service.enqueue_with_delay(Report(id="gone"), timedelta(hours=1))
        assert await service.cancel(Report, "gone")
        assert not await redis_client.exists(keys.prio)


async def test_coalesced_single_enqueues_keep_each_callers_level(
    redis_url: str, prefix: str
) -> None:
    """Concurrent single enqueues go out in shared script calls: each event keeps its own
    level (explicit, the class's, or 0 among others), and a caller cancelled while waiting
    leaves the others' levels as they were."""
    service = await _service(redis_url, prefix, enable_scheduling=False)
    levels = {f"c{i}": i % 4 * 3 for i in range(40)}  # 0, 3, 6, 9 mixed in one burst
    async with service:
        tasks = {
            event_id: asyncio.create_task(
                service.enqueue_with_delay(Job(id=event_id), priority=level or None)
            )
            for event_id, level in levels.items()
        }
        reports = [asyncio.create_task(service.enqueue_with_delay(Report(id="r")))]
        await asyncio.sleep(0)  # every caller waits in its batch now
        tasks.pop("c1").cancel()  # level 3, waiting to be sent
        assert await asyncio.gather(*tasks.values(), *reports) == [True] * 40
        for event_id in tasks:
            assert (await service.inspect(Job, event_id)).priority == levels[event_id]
        assert (await service.inspect(Report, "r")).priority == 5
        cancelled = await service.inspect(Job, "c1")  # not sent, or sent whole at its level
        assert cancelled.state == "absent" or cancelled.priority == 3
        expected = {level: 10 for level in (0, 3, 6, 9)}
        expected[3] -= cancelled.state == "absent"
        assert (await service.stats_for(Job)).ready_by_priority == expected


async def test_a_retry_keeps_its_priority(
    redis_url: str, prefix: str, redis_client: aioredis.Redis
) -> None:
    tries: list[str] = []
    done = asyncio.Event()
    service = await _service(redis_url, prefix, retry_attempts=2)

    async def handle(event: Job) -> None:
        tries.append(event.id)
        if len(tries) == 1:
            raise RuntimeError("once")
        done.set()

    service.add_handler(Job, handle)
    keys = TypeKeys(prefix, "prio-job")
    async with service:
        await service.enqueue_with_delay(Job(id="x"), timedelta(milliseconds=20), priority=4)
        await asyncio.wait_for(done.wait(), 20)
        assert tries == ["x", "x"]
    # delivered twice from level 4's list, then acked: its level went with it
    assert int(await redis_client.hget(keys.meta, "pushed:4") or 0) == 2
    assert not await redis_client.exists(keys.prio, keys.events)


async def test_aging_serves_a_waiting_low_level(redis_url: str, prefix: str) -> None:
    service = await _service(redis_url, prefix, enable_scheduling=False)
    store = service.store
    async with service:
        await service.set_limits(Job, priority_aging=timedelta(milliseconds=500))
        assert (await service.limits(Job)).priority_aging == timedelta(milliseconds=500)
        await service.enqueue_with_delay(Job(id="old", n=9), priority=9)
        await asyncio.sleep(1.1)  # waits 2 periods (until 1.5 s): competes as level 7
        for level in (8, 7, 6):
            await service.enqueue_with_delay(Job(id=f"new-{level}", n=level), priority=level)
        got = await store.deliveries.pop_ready("prio-job", 1.0)  # BRPOP: strict order, level 6
        assert got is not None and got[1] == 6
        _, claimed, _ = await store.deliveries.claim_limited("prio-job", [got[0]], 3, 5000, level=6)
    # 6 first; then "old" (level 7 by age, due earlier) before the fresh 7; then 8
    assert [c.raw_id.decode() for c in claimed] == ["new-6", "old", "new-7", "new-8"]


async def test_strict_priority_without_aging(redis_url: str, prefix: str) -> None:
    service = await _service(redis_url, prefix, enable_scheduling=False)
    async with service:
        await service.enqueue_with_delay(Job(id="old", n=9), priority=9)
        await asyncio.sleep(0.05)
        await service.enqueue_with_delay(Job(id="new", n=8), priority=8)
        _, claimed, _ = await service.store.deliveries.claim_limited("prio-job", [], 2, 5000)
        # this process has not seen a level above 0 (no BRPOP yet): its claims read level 0
        assert claimed == []
        got = await service.store.deliveries.pop_ready("prio-job", 1.0)
        assert got is not None and got[1] == 8
        _, claimed, _ = await service.store.deliveries.claim_limited(
            "prio-job", [got[0]], 1, 5000, level=8
        )
    assert [c.raw_id for c in claimed] == [b"new", b"old"]


async def test_an_insert_costs_the_same_behind_a_million_ready_events(
    redis_url: str, prefix: str, redis_client: aioredis.Redis
) -> None:
    """Redis's own time per enqueue script (SLOWLOG), at 0 and at 1,000,000 ready events of
    level 9: an insert is an LPUSH and a ZADD whatever the backlog (bull's grew 27-fold)."""
    from benchmarks.priorities import fill_backlog
    from delayq import lua
    from delayq.codec import Codec

    sha = redis_client.register_script(lua.source("enqueue")).sha.encode()
    envelope = Codec().encode(Job(id="x"), None)

    async def median_us(service: EventService, tag: str) -> float:
        await service.enqueue_with_delay(Job(id=f"warm-{tag}"), priority=3)
        await redis_client.config_set("slowlog-log-slower-than", 0)
        await redis_client.config_set("slowlog-max-len", 10000)
        await redis_client.slowlog_reset()
        for i in range(100):
            await service.enqueue_with_delay(Job(id=f"{tag}-{i}"), priority=i % 10)
        log = await redis_client.slowlog_get(10000)
        await redis_client.config_set("slowlog-log-slower-than", 10000)
        times = sorted(
            int(e["duration"]) for e in log if e["command"].lower().startswith(b"evalsha " + sha)
        )
        assert len(times) == 100, [e["command"][:60] for e in log][:20]
        return float(times[50])

    empty = await _service(redis_url, prefix + "e", enable_scheduling=False)
    full = await _service(redis_url, prefix, enable_scheduling=False)
    async with empty, full:
        at_zero = await median_us(empty, "a")
        await fill_backlog(redis_client, prefix, "prio-job", 1_000_000, 9, envelope)
        assert (await full.stats_for(Job)).ready_by_priority == {9: 1_000_000}
        at_million = await median_us(full, "b")
    await redis_client.delete(*TypeKeys(prefix, "prio-job").named().values())
    # the same work: within noise (a shared machine), never a growth with the backlog
    assert at_million < 2 * at_zero + 30, (at_zero, at_million)


async def test_delivery_groups_keep_levels_through_fan_out_retries_and_requeue(
    redis_url: str, prefix: str, redis_client: aioredis.Redis, wait_for: Any
) -> None:
    """Two groups (the default one and "audit"): the fan-out, run_now for one group, a
    replace of a fanned-out event, a group's retry and its dead letter requeued all keep
    (or set) the event's level in each group's own level lists."""
    keys = TypeKeys(prefix, "prio-job")
    producer = await _service(redis_url, prefix, retry_backoff=fixed(0.05))
    async with producer:
        await producer.register_group(Job, "audit", retry_attempts=2)
        for level in range(9, -1, -1):
            for k in range(2):
                await producer.enqueue_with_delay(Job(id=f"{level}-{k}", n=level), priority=level)

        async def fanned_out() -> dict[str, QueueCounts] | None:
            stats = await producer.group_stats(Job)
            return stats if all(c.ready == 20 for c in stats.values()) else None

        stats = await wait_for(fanned_out, timeout=10)
        assert set(stats) == {"default", "audit"}
        for counts in stats.values():
            assert counts.ready_by_priority == {n: 2 for n in range(10)}
        # run_now for one group: ready at its level there, the other's copy waits
        await producer.enqueue_with_delay(Job(id="later", n=6), timedelta(hours=1), priority=6)
        assert await producer.run_now(Job, "later", group="audit")
        stats = await producer.group_stats(Job)
        assert stats["audit"].ready_by_priority[6] == 3
        assert stats["default"].ready_by_priority[6] == 2
        # a replace of a fanned-out event sets its level for every group
        await producer.enqueue_with_delay(Job(id="3-0", n=8), priority=8, replace=True)
        assert (await producer.inspect(Job, "3-0")).priority == 8

        async def replaced() -> bool:
            stats = await producer.group_stats(Job)
            return all(c.ready_by_priority.get(8) == 3 for c in stats.values())

        await wait_for(replaced, timeout=10)

    seen: dict[str, list[str]] = {"default": [], "audit": []}

    async def default(event: Job) -> None:
        seen["default"].append(event.id)

    async def audit(event: Job) -> None:
        seen["audit"].append(event.id)
        # 7-0 fails its three deliveries (retry_attempts=2): a dead letter; 4-0 once
        if event.id == "7-0" or (event.id == "4-0" and seen["audit"].count("4-0") == 1):
            raise RuntimeError("audit refuses")

    consumer = await _service(redis_url, prefix, retry_backoff=fixed(0.05))
    consumer.add_handler(Job, default, concurrency=1)
    consumer.add_handler(Job, audit, concurrency=1, group="audit", retry_attempts=2)
    async with consumer:
        await wait_for(lambda: len(seen["default"]) == 20 and len(seen["audit"]) == 24, timeout=20)

        async def audit_dead() -> bool:
            return (await consumer.group_stats(Job))["audit"].dead == 1

        await wait_for(audit_dead, timeout=10)
    # (3-0, replaced while ready, may still be claimed from its old place: left out)
    order = [f"{level}-{k}" for level in range(10) for k in range(2) if (level, k) != (3, 0)]
    assert [i for i in seen["default"] if i != "3-0"] == order
    audit_order = [i for n, i in enumerate(seen["audit"]) if i not in seen["audit"][:n]]
    order.insert(order.index("6-1") + 1, "later")
    assert [i for i in audit_order if i != "3-0"] == order
    # the audit group's retry of 4-0 went back to its level-4 list (two fan-outs, one retry)
    assert int(await redis_client.hget(keys.group_key("audit", "meta"), "pushed:4") or 0) == 3
    assert int(await redis_client.hget(keys.meta, "pushed:4") or 0) == 2
    # the audit group's dead letter, requeued, is ready at its level there alone
    admin = await _service(redis_url, prefix, enable_scheduling=False)
    async with admin:
        assert await admin.requeue_dead_letters(Job, ["7-0"], group="audit") == 1
        stats = await admin.group_stats(Job)
        assert stats["audit"].ready_by_priority == {7: 1}
        assert stats["default"].ready == 0
        # removing the group removes its level lists too
        assert await redis_client.exists(*keys.level_lists("audit")) == 1
        assert await admin.remove_group(Job, "audit")
        assert await redis_client.exists(*keys.level_lists("audit")) == 0


def _resized(partitions: int) -> type[Event]:
    # the same class redefined with another partition count: what a deploy does
    class Resized(Event, event_name="prio-resized", partitions=partitions):
        n: int = 0

    return Resized


async def test_repartition_keeps_each_events_level(
    redis_url: str, prefix: str, redis_client: aioredis.Redis
) -> None:
    old = _resized(2)
    producer = await _service(redis_url, prefix, enable_scheduling=False)
    async with producer:
        for i in range(40):
            await producer.enqueue_with_delay(
                old(id=f"r-{i}", n=i % 10), timedelta(hours=1), priority=i % 10
            )
    new = _resized(3)
    service = await _service(redis_url, prefix, enable_scheduling=False)
    async with service:
        result = await service.repartition(new, wait=5)
        assert result.moved == 40 and result.retired == (2,)
        for i in range(40):
            assert (await service.inspect(new, f"r-{i}")).priority == i % 10
        for shard in shards("prio-resized", 2):  # the old layout keeps no level
            assert not await redis_client.exists(PrefixKeys(prefix).for_shard(shard).prio)
        # run now, every partition's ready lists hold each event at its level
        for i in range(40):
            assert await service.run_now(new, f"r-{i}")
        counts = await service.stats_for(new)
        assert counts.ready_by_priority == {n: 4 for n in range(10)}


async def test_schedule_fires_take_its_priority(redis_url: str, prefix: str, wait_for: Any) -> None:
    from delayq.cli.schedules import schedule_json

    service = await _service(redis_url, prefix)
    async with service:
        info = await service.schedule("urgent-beat", Job, every=timedelta(seconds=0.2), priority=7)
        assert info.priority == 7
        assert schedule_json(info)["priority"] == 7  # delayq schedules show, --json
        assert (await service.schedule_info("urgent-beat")).priority == 7  # type: ignore[union-attr]

        # a regular fire, moved to the ready list by the scheduler: level 7
        async def fired() -> bool:
            return (await service.stats_for(Job)).ready_by_priority.get(7, 0) >= 1

        await wait_for(fired, timeout=5)
        assert (await service.stats_for(Job)).ready_by_priority.keys() == {7}
        await service.unschedule("urgent-beat")
        # a manual fire of a class with a default level, declared without priority=
        await service.schedule("report", Report, every=timedelta(hours=1))
        event_id = await service.trigger_schedule("report")
        assert event_id is not None
        assert (await service.inspect(Report, event_id)).priority == 5
        with pytest.raises(ValueError):
            await service.schedule("bad", Job, every=timedelta(hours=1), priority=10)
        assert await service.schedule_info("bad") is None


def test_a_schedule_without_priority_keeps_its_digest() -> None:
    from delayq.schedules.spec import ScheduleSpec, decode_spec, encode_spec

    fields: dict[str, Any] = {
        "name": "nightly",
        "event_type": "report",
        "partitions": 1,
        "cron": "0 3 * * *",
        "every_ms": None,
        "timezone": "Europe/Paris",
        "template": b"\x93\x80\x01\xc0",
        "overlap": "skip",
        "catch_up_ms": None,
        "jitter_ms": 0,
        "start_ms": None,
        "end_ms": None,
    }
    plain = ScheduleSpec(**fields).with_version()
    # the version and the stored bytes of main before schedules had a priority (682403c)
    assert plain.version == "8a2d611664f99606"
    assert encode_spec(plain) == (
        b"\x9d\xa7nightly\xa6report\x01\xa90 3 * * *\xc0\xacEurope/Paris\xc4\x04\x93\x80\x01"
        b"\xc0\xa4skip\xc0\x00\xc0\xc0\xb08a2d611664f99606"
    )
    urgent = ScheduleSpec(**fields, priority=5).with_version()
    assert urgent.version != plain.version  # a new level is a changed definition
    assert decode_spec(encode_spec(urgent)) == urgent
    assert decode_spec(encode_spec(plain)) == plain


class Plain(Event, event_name="prio-plain"):
    """A type that never uses levels."""


def test_stats_and_the_dashboard_show_the_ready_backlog_per_level(
    redis_url: str, prefix: str, capsys: Any, monkeypatch: Any
) -> None:
    import json

    import httpx

    from delayq.cli.app import main
    from delayq.dashboard import create_app

    async def prepare() -> None:
        service = await _service(redis_url, prefix, enable_scheduling=False)
        async with service:
            await service.enqueue_many([Job(id=f"a{i}") for i in range(2)])
            await service.enqueue_many([Job(id=f"b{i}") for i in range(3)], priority=7)
            await service.enqueue_many([Plain(id=f"p{i}") for i in range(4)])

    asyncio.run(prepare())
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DELAYQ_PREFIX", prefix)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["stats", "--json"]) == 0
    types = json.loads(capsys.readouterr().out)["types"]
    assert types["prio-job"]["ready_by_priority"] == {"0": 2, "7": 3}
    assert "ready_by_priority" not in types["prio-plain"]  # nothing extra without levels
    assert main(["stats"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if "priority" in line]
    assert rows == [["priority", "0", "2"], ["priority", "7", "3"]]

    async def pages() -> None:
        service = await _service(redis_url, prefix, enable_scheduling=False)
        async with service:
            transport = httpx.ASGITransport(app=create_app(service))
            async with httpx.AsyncClient(transport=transport, base_url="http://d.test") as http:
                overview = (await http.get("/")).text
                job = (await http.get("/type", params={"name": "prio-job"})).text
                plain = (await http.get("/type", params={"name": "prio-plain"})).text
        for page in (overview, job):
            assert '<span class="level" data-level="7">p7 3</span>' in page
            assert '<span class="level" data-level="0">p0 2</span>' in page
        assert overview.count('class="levels"') == 1  # the plain type's row has none
        assert 'class="levels"' not in plain

    asyncio.run(pages())


async def test_aging_reaches_a_consumer_that_only_ever_saw_level_0(
    redis_url: str, prefix: str, wait_for: Any
) -> None:
    """A process whose BRPOPs only returned level-0 entries sends no level keys; with aging
    set its claim is told to (and claims again with them), so an aged level-9 event is not
    hidden behind a saturated level 0."""
    setup = await _service(redis_url, prefix, enable_scheduling=False)
    async with setup:
        await setup.set_limits(Job, priority_aging=timedelta(milliseconds=50))
        await setup.enqueue_with_delay(Job(id="old", n=9), priority=9)
        start = await setup.store.browsing.server_time_ms()

        async def aged() -> bool:  # 9 periods on Redis's clock: it competes as level 0
            return await setup.store.browsing.server_time_ms() > start + 500

        await wait_for(aged, timeout=5)
        await setup.enqueue_many([Job(id=f"now-{i}") for i in range(3)])
    fresh = await _service(redis_url, prefix, enable_scheduling=False)
    deliveries = fresh.store.deliveries
    async with fresh:
        got = await deliveries.pop_ready("prio-job", 1.0)
        assert got is not None and got[1] == 0  # level 0 is not empty: BRPOP takes it
        assert not deliveries.levels.levelled("prio-job")
        _, claimed, throttle = await deliveries.claim_limited("prio-job", [got[0]], 1, 5000)
        assert throttle is None and deliveries.levels.levelled("prio-job")
    # the aged level-9 event (due first) before the level-0 ones, the popped one next
    assert [c.raw_id.decode() for c in claimed] == ["old", "now-0"]


async def test_flow_keys_take_fair_turns_and_each_turn_its_most_urgent_event(
    redis_url: str, prefix: str
) -> None:
    """Fairness between keys first, priority within a key: key "a" marks all its work
    urgent and still gets one turn per round; each key's turn takes its most urgent event."""
    producer = await _service(redis_url, prefix, enable_scheduling=False)
    async with producer:
        await producer.pause(Job)
        for i in range(3):
            await producer.enqueue_with_delay(Job(id=f"a-bg-{i}", n=9), key="a", priority=9)
        for i in range(3):
            await producer.enqueue_with_delay(Job(id=f"a-urgent-{i}"), key="a", priority=0)
        for i in range(3):
            await producer.enqueue_with_delay(Job(id=f"b-{i}", n=5), key="b", priority=5)
        await producer.resume(Job)
    seen = await _handled_order(await _service(redis_url, prefix), 9)
    ids = [i for i, _ in seen]
    # turns alternate between the keys; a's turns take its level-0 events before level 9
    assert [i.split("-")[0] for i in ids[:6]] == ["a", "b"] * 3
    assert [i for i in ids if i.startswith("a")] == [f"a-urgent-{k}" for k in range(3)] + [
        f"a-bg-{k}" for k in range(3)
    ]
    assert [i for i in ids if i.startswith("b")] == [f"b-{k}" for k in range(3)]
