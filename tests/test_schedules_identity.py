"""A schedule declared again is the same schedule: identical declarations change nothing
(issue 37, defect 1), and the firer reads a definition and its state together, so a
declaration racing it can never stop a schedule (defect 2)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery
from delayq.schedules import api as schedules_api
from delayq.schedules.spec import decode_spec
from delayq.schedules.state import ScheduleState

UTC = timezone.utc
FAST = {"scheduling_interval": 0.2, "lock_timeout": 1.0, "polling_timeout": 1.0}


class Beat(Event, event_name="sched-beat"):
    n: int = 0
    label: str = ""


class Recorder:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.slots: dict[str, datetime | None] = {}
        self.labels: dict[str, str] = {}

    async def __call__(self, event: Beat) -> None:
        delivery = current_delivery()
        assert delivery is not None
        self.ids.append(event.id)
        self.slots[event.id] = delivery.slot
        self.labels[event.id] = event.label


def make(redis_url: str, prefix: str, **options: object) -> EventService:
    return EventService.from_url(redis_url, prefix=prefix, **{**FAST, **options})


@pytest.fixture
async def raw(redis_url: str):
    client = aioredis.Redis.from_url(redis_url, protocol=2)
    yield client
    await client.aclose()


def _ms(dt: datetime | None) -> int:
    assert dt is not None
    return round(dt.timestamp() * 1000)


async def _stored(raw: aioredis.Redis, prefix: str, name: str) -> tuple[bytes, bytes]:
    """The schedule's stored definition and state, as Redis holds them."""
    tag = f"{{{prefix}:{Beat.event_name}}}"
    definition = await raw.hget(f"{tag}:schedules", name)
    state = await raw.hget(f"{tag}:schedule-state", name)
    assert definition is not None and state is not None
    return definition, state


async def test_identical_declarations_seconds_apart_keep_the_overdue_slot(
    redis_url: str, prefix: str, raw, wait_for
) -> None:
    producer = make(redis_url, prefix, enable_scheduling=False)  # no firer anywhere
    declare: dict[str, Any] = {
        "every": timedelta(seconds=1),
        "payload": {"n": 3, "label": "x"},
        "context": {"team": "ops", "region": "eu"},
    }
    first = await producer.schedule("same", Beat, **declare)
    before = await _stored(raw, prefix, "same")
    overdue = _ms(first.next_fire)

    async def passed() -> bool:  # Redis's clock, as the scripts see it
        return await producer.store.browsing.server_time_ms() > overdue + 300

    await wait_for(passed, timeout=5)
    # the same definition (the context in another order is the same context)
    again = await producer.schedule(
        "same", Beat, **{**declare, "context": {"region": "eu", "team": "ops"}}
    )
    assert _ms(again.next_fire) == overdue  # still owed, not moved past
    assert await _stored(raw, prefix, "same") == before  # no new version, no new mark
    info = await producer.schedule_info("same")
    assert info is not None and _ms(info.next_fire) == overdue
    # a real change still moves the mark to now: the overdue slot is not fired late
    changed = await producer.schedule("same", Beat, **{**declare, "payload": {"n": 4}})
    assert _ms(changed.next_fire) > overdue
    await producer.aclose()


class Money(Event, event_name="sched-money"):
    amount: float = 0.0
    note: str = ""


@pytest.mark.parametrize("serializer", ["msgpack", "json"])
async def test_what_counts_as_the_same_definition(
    redis_url: str, prefix: str, raw, serializer: str
) -> None:
    """docs/SCHEDULES.md's rule, as written: these pairs declare the same schedule."""
    producer = make(redis_url, prefix, enable_scheduling=False, serializer=serializer)
    start = datetime(2030, 1, 1, tzinfo=UTC)
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"cron": "@daily"}, {"cron": "0  0 * * *"}),
        ({"every": timedelta(seconds=90)}, {"every": 90.0}),
        ({"every": 5, "payload": {}}, {"every": 5, "payload": {"note": ""}}),
        ({"every": 5, "payload": {"amount": 1}}, {"every": 5, "payload": {"amount": 1.0}}),
        ({"every": 5, "context": {"a": "1", "b": "2"}}, {"every": 5, "context": {"b": "2", "a": "1"}}),
        ({"every": 5, "context": {}}, {"every": 5}),
        ({"every": 5, "start_at": start},
         {"every": 5, "start_at": start.astimezone(timezone(timedelta(hours=-5)))}),
    ]  # fmt: skip
    tag = f"{{{prefix}:{Money.event_name}}}"
    for i, (one, other) in enumerate(pairs):
        name = f"pair-{i}"
        await producer.schedule(name, Money, **one)
        stored = (
            await raw.hget(f"{tag}:schedules", name),
            await raw.hget(f"{tag}:schedule-state", name),
        )
        await producer.schedule(name, Money, **other)
        again = (
            await raw.hget(f"{tag}:schedules", name),
            await raw.hget(f"{tag}:schedule-state", name),
        )
        assert again == stored, f"{one} and {other} counted as a change"
    # and a difference anywhere is a change
    await producer.schedule("pair-0", Money, cron="@daily", timezone="Europe/Berlin")
    info = await producer.schedule_info("pair-0")
    assert info is not None and info.timezone == "Europe/Berlin"
    await producer.aclose()


async def test_a_definition_stored_with_its_encode_time_is_the_same_definition(
    redis_url: str, prefix: str, raw, wait_for, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Releases before the fix stored the template with its encode time: the first
    declaration after an upgrade recognises it and keeps the overdue slot."""
    producer = make(redis_url, prefix, enable_scheduling=False)
    declare: dict[str, Any] = {"every": timedelta(seconds=1), "payload": {"label": "up"}}
    with monkeypatch.context() as m:  # as an older release built the definition
        m.setattr(schedules_api, "canonical_template", lambda template: template)
        old = await producer.schedule("upgrade", Beat, **declare)
    old_definition, old_state = await _stored(raw, prefix, "upgrade")
    overdue = _ms(old.next_fire)

    async def passed() -> bool:
        return await producer.store.browsing.server_time_ms() > overdue + 300

    await wait_for(passed, timeout=5)
    new = await producer.schedule("upgrade", Beat, **declare)
    assert _ms(new.next_fire) == overdue  # the mark did not move
    new_definition, new_state = await _stored(raw, prefix, "upgrade")
    assert new_definition != old_definition  # stored again, without its encode time
    assert ScheduleState.decode(new_state).mark_ms == ScheduleState.decode(old_state).mark_ms
    assert await producer.schedule("upgrade", Beat, **declare) == new  # and now stable
    assert (await _stored(raw, prefix, "upgrade")) == (new_definition, new_state)
    await producer.aclose()


async def test_a_restart_that_declares_at_start_fires_the_overdue_slot(
    redis_url: str, prefix: str, wait_for
) -> None:
    declare: dict[str, Any] = {
        "every": timedelta(seconds=1),
        "payload": {"label": "r"},
        "catch_up": timedelta(minutes=1),  # every missed slot is owed
        "overlap": "allow",
    }
    rec = Recorder()
    first = make(redis_url, prefix)
    first.add_handler(Beat, rec)
    await first.schedule("restart", Beat, **declare)
    async with first:
        await wait_for(lambda: rec.ids, timeout=10)
    # every process is down now: the next slot passes with nobody to fire it
    info = await first.schedule_info("restart")
    assert info is not None
    overdue = _ms(info.next_fire)

    async def passed() -> bool:
        return await first.store.browsing.server_time_ms() > overdue + 300

    await wait_for(passed, timeout=5)
    await first.aclose()
    rec2 = Recorder()
    second = make(redis_url, prefix)
    second.add_handler(Beat, rec2)
    await second.schedule("restart", Beat, **declare)  # the restarted process declares
    async with second:
        await wait_for(
            lambda: overdue in {_ms(s) for s in rec2.slots.values()},
            timeout=5,
            message=f"slot {overdue} never fired after the restart: {rec2.ids}",
        )
    assert len(set(rec.ids + rec2.ids)) == len(rec.ids + rec2.ids)


async def test_a_declaration_between_the_firers_reads_never_stops_the_schedule(
    redis_url: str, prefix: str, wait_for
) -> None:
    """A changed declaration lands right after the first Redis command the firer sends to
    load the schedule. With the definition and the state read by two commands, the firer
    cached the old definition under the new version and retried every 5 s for ever."""
    rec = Recorder()
    service = make(redis_url, prefix)
    service.add_handler(Beat, rec)
    producer = make(redis_url, prefix, enable_scheduling=False)
    every = timedelta(seconds=1)
    store = service.store
    real_load = store.schedules.schedule_load
    real_execute = store.redis.execute_command
    armed = False
    hooked: list[str] = []
    pairs: list[tuple[str, str]] = []  # (definition's version, state's version) per load

    async def execute_command(*args: Any, **options: Any) -> Any:
        nonlocal armed
        reply = await real_execute(*args, **options)
        if armed:  # the first command of an armed load: now the declaration lands
            armed = False
            await producer.schedule("raced", Beat, every=every, payload={"label": "new"})
            hooked.append(str(args[0]))
        return reply

    async def schedule_load(shard: str, names: Any) -> Any:
        nonlocal armed
        armed = bool(rec.ids) and not hooked  # once, after the first fire
        try:
            loaded = await real_load(shard, names)
        finally:
            armed = False
        for data, state in loaded:  # what was read together agrees on the version
            pairs.append((decode_spec(data).version, ScheduleState.decode(state).version))
        return loaded

    store.schedules.schedule_load = schedule_load  # type: ignore[method-assign]
    store.redis.execute_command = execute_command  # type: ignore[method-assign]
    async with service:
        await producer.schedule("raced", Beat, every=every, payload={"label": "old"})
        await wait_for(lambda: hooked, timeout=10, message="the firer never loaded it")
        # the new definition fires within a couple of slots (before: never)
        await wait_for(
            lambda: "new" in rec.labels.values(),
            timeout=4,
            message=f"the schedule stopped firing after a racing declaration: {rec.labels}",
        )
    await producer.aclose()
    assert len(set(rec.ids)) == len(rec.ids)
    assert all(spec == state for spec, state in pairs), pairs
