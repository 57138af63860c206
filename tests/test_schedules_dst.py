"""Cron schedules at daylight-saving changes (issue 37, defects 3 and 4).

Pure computation with the real Europe/Berlin and America/New_York zones (no waiting for a
night): 5- and 6-field expressions follow the same documented rules, the "latest slot at or
before t" lookup agrees with the forward iteration at every instant, and both agree with a
brute-force model built from zoneinfo alone. The end-to-end tests (a real scheduler on a
real Redis) use a private zone file whose offset changes a few seconds into the test.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import ExitStack
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis.asyncio as aioredis
from cronsim import CronSim
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_schedules_spec import ms, spec
from tzif import private_zone

from delayq import Event, EventService, current_delivery
from delayq.schedules import firing
from delayq.schedules.spec import ScheduleSpec, due_slots, next_slot, previous_slot
from delayq.testing import RedisServer

UTC = timezone.utc
BERLIN, NEW_YORK = "Europe/Berlin", "America/New_York"
HOUR, DAY = 3600, 86_400
# The four changes of the issue: (zone, a UTC instant some hours before the change)
CHANGES = {
    "berlin-spring": (BERLIN, datetime(2027, 3, 27, 12, tzinfo=UTC)),
    "berlin-fall": (BERLIN, datetime(2026, 10, 24, 12, tzinfo=UTC)),
    "new-york-spring": (NEW_YORK, datetime(2027, 3, 13, 12, tzinfo=UTC)),
    "new-york-fall": (NEW_YORK, datetime(2026, 10, 31, 12, tzinfo=UTC)),
}


def utc(slot: int) -> str:
    return datetime.fromtimestamp(slot / 1000, UTC).strftime("%m-%dT%H:%M:%SZ")


def slots_between(s: ScheduleSpec, start: int, end: int) -> list[int]:
    """Every slot in ``(start, end]`` by the forward iteration."""
    out, slot = [], next_slot(s, start)
    while slot is not None and slot <= end:
        out.append(slot)
        slot = next_slot(s, slot)
    return out


# -- the documented rules, 5 and 6 fields alike ---------------------------------------


@pytest.mark.parametrize("fields", [5, 6])
@pytest.mark.parametrize(
    ("change", "hm", "expected"),
    [
        # 02:30 does not exist: once, at the first instant after the gap (03:00 CEST/EDT)
        ("berlin-spring", "30 2", ["03-28T01:00:00Z", "03-29T00:30:00Z", "03-30T00:30:00Z"]),
        ("new-york-spring", "30 2", ["03-14T07:00:00Z", "03-15T06:30:00Z", "03-16T06:30:00Z"]),
        # 02:30 (Berlin) and 01:30 (New York) occur twice: once, at the first occurrence
        ("berlin-fall", "30 2", ["10-25T00:30:00Z", "10-26T01:30:00Z", "10-27T01:30:00Z"]),
        ("new-york-fall", "30 1", ["11-01T05:30:00Z", "11-02T06:30:00Z", "11-03T06:30:00Z"]),
    ],
)  # fmt: skip
def test_a_fixed_time_fires_once_at_each_change(
    fields: int, change: str, hm: str, expected: list[str]
) -> None:
    tz, before = CHANGES[change]
    minute, hour = hm.split()
    expr = f"{minute} {hour} * * *" if fields == 5 else f"0 {minute} {hour} * * *"
    s = spec(expr, tz=tz)
    start = ms(before)
    assert [utc(x) for x in slots_between(s, start, start + 3 * 86_400_000)] == expected


def test_seconds_in_a_gap_fire_once_and_seconds_in_a_repeated_hour_once_each() -> None:
    # every 20 s of 02:30 local: the gap folds the three into one fire at 03:00 CEST; on
    # the fall-back night they fire in the first 02:30 only
    s = spec("*/20 30 2 * * *", tz=BERLIN)
    spring, fall = ms(datetime(2027, 3, 28, tzinfo=UTC)), ms(datetime(2026, 10, 25, tzinfo=UTC))
    day = 86_400_000
    assert [utc(x) for x in slots_between(s, spring, spring + day)] == ["03-28T01:00:00Z"]
    fall_slots = [utc(x) for x in slots_between(s, fall, fall + day)]
    assert fall_slots == ["10-25T00:30:00Z", "10-25T00:30:20Z", "10-25T00:30:40Z"]


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_star_hour_follows_real_time(change: str) -> None:
    # hour field "*": every instant whose local time matches, in both passes of a
    # repeated hour and in none of a skipped one; 5 and 6 fields the same
    tz, before = CHANGES[change]
    start, end = ms(before), ms(before + timedelta(days=1))
    five = slots_between(spec("30 * * * *", tz=tz), start, end)
    six = slots_between(spec("0 30 * * * *", tz=tz), start, end)
    assert five == six
    assert all(b - a == 3_600_000 for a, b in itertools.pairwise(five))  # an hour apart, always


# -- an independent model: scan the real zone minute by minute ------------------------


def _matches(expr: str, naive: datetime) -> bool:
    return next(CronSim(expr, naive - timedelta(seconds=1))) == naive


def model(expr: str, tz_name: str, start: datetime, hours: int) -> list[int]:
    """The slots the docs define, from zoneinfo and a per-minute scan (expressions with
    second 0): a wall-clock expression fires at the first occurrence of a matching local
    time, and once at the end of a gap that hides a match; a ``*`` minute or hour fires at
    every instant whose local time matches."""
    tz = ZoneInfo(tz_name)
    fields = expr.split()
    wall = not fields[-5].startswith("*") and not fields[-4].startswith("*")
    out: list[int] = []
    first = int(start.timestamp()) // 60 * 60
    for u in range(first, first + hours * 3600, 60):
        local = datetime.fromtimestamp(u, tz)
        naive = local.replace(tzinfo=None)
        if not wall:
            hit = _matches(expr, naive)
        else:
            hit = local.fold == 0 and _matches(expr, naive)
            before = datetime.fromtimestamp(u - 60, tz).replace(tzinfo=None)
            gap = before + timedelta(minutes=1)
            while not hit and gap < naive:  # local minutes the clock jumped over
                hit = _matches(expr, gap)
                gap += timedelta(minutes=1)
        if hit:
            out.append(u * 1000)
    return out


EXPRESSIONS = [
    "30 2 * * *", "0 30 2 * * *", "30 1 * * *", "0 30 1 * * *", "0,30 2 * * *",
    "0 15,45 1-3 * * *", "0 0-59/20 0-23 * * *", "0 2 * * *", "0 0 3 * * *",
    "*/15 * * * *", "0 */2 * * *", "0 45 * * * *", "0 * 2 * * *", "10 */1 * * *",
]  # fmt: skip


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_forward_iteration_matches_the_model(change: str, expr: str) -> None:
    tz, before = CHANGES[change]
    s = spec(expr, tz=tz)
    expected = model(expr, tz, before, 36)
    start = ms(before) - 1
    assert slots_between(s, start, start + 36 * 3_600_000) == expected


# -- "latest slot at or before t" agrees with the forward walk, at every instant -------

WALK_FROM_MS = 50 * 3_600_000  # every expression above has a slot in any 50 hours


def walked(s: ScheduleSpec, t: int) -> int | None:
    """The latest slot at or before ``t`` by brute force: walk forward from long before."""
    found = None
    for slot in slots_between(s, t - WALK_FROM_MS, t):
        found = slot
    return found


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    change=st.sampled_from(sorted(CHANGES)),
    expr=st.sampled_from([*EXPRESSIONS, "*/20 30 2 * * *", "*/20 30 1 * * *"]),
    offset_ms=st.integers(min_value=0, max_value=24 * 3_600_000),
)
def test_latest_slot_agrees_with_the_forward_walk(change: str, expr: str, offset_ms: int) -> None:
    tz, before = CHANGES[change]
    s = spec(expr, tz=tz)
    t = ms(before) + offset_ms
    latest = previous_slot(s, t)
    assert latest == walked(s, t), (expr, tz, utc(t))
    assert latest is not None and latest <= t
    nxt = next_slot(s, t)
    assert nxt is not None and nxt > t and next_slot(s, latest) == nxt


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("expr", ["30 2 * * *", "0 30 2 * * *", "30 1 * * *", "0 30 1 * * *"])
def test_latest_slot_at_every_minute_of_the_change(change: str, expr: str) -> None:
    # every minute (and the second around each) of the 6 hours around the change
    tz, before = CHANGES[change]
    s = spec(expr, tz=tz)
    start = ms(before) + 10 * 3_600_000
    for t in range(start, start + 6 * 3_600_000, 60_000):
        for probe in (t - 1, t, t + 1):
            assert previous_slot(s, probe) == walked(s, probe), (expr, tz, utc(probe))


def changes_in(tz_name: str, year: int) -> list[int]:
    """The unix seconds (to the hour) at which a zone changes its offset in a year."""
    tz = ZoneInfo(tz_name)
    start = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
    hours = [start + h * 3600 for h in range(366 * 24)]
    offsets = [datetime.fromtimestamp(h, tz).utcoffset() for h in hours]
    return [h for h, a, b in zip(hours[1:], offsets, offsets[1:], strict=False) if a != b]


@pytest.mark.parametrize(
    "tz", ["Australia/Lord_Howe", "Europe/Dublin", "Australia/Sydney", "America/Santiago"]
)
@pytest.mark.parametrize(
    ("expr", "walk_hours"),
    [("30 1 * * *", 50), ("0 30 2 * * *", 50), ("*/15 * * * *", 3), ("0 */2 * * *", 5)],
)
def test_other_zones_half_hour_and_negative_changes(tz: str, expr: str, walk_hours: int) -> None:
    # Lord Howe moves its clocks by 30 minutes, Dublin's "daylight" time is its winter
    # time: the lookups agree there too (every 5 minutes of 6 hours around each change)
    s = spec(expr, tz=tz)
    changes = changes_in(tz, 2026)
    assert len(changes) == 2
    for change in changes:
        for t in range((change - 3 * HOUR) * 1000, (change + 3 * HOUR) * 1000, 300_007):
            found = None
            for slot in slots_between(s, t - walk_hours * 3_600_000, t):
                found = slot
            assert previous_slot(s, t) == found, (expr, tz, utc(t))


def test_a_real_time_slot_after_a_half_hour_fall_back() -> None:
    # Lord Howe, 2026-04-05: 02:00 (+11) goes back to 01:30 (+10:30); 02:00 +10:30 is an
    # ordinary local time and fires ("0 */2": cronsim's own stepping skipped it)
    s = spec("0 */2 * * *", tz="Australia/Lord_Howe")
    start = ms(datetime(2026, 4, 4, 13, tzinfo=UTC))  # 00:00 +11
    assert [utc(x) for x in slots_between(s, start, start + 5 * 3_600_000)] == [
        "04-04T15:30:00Z",
        "04-04T17:30:00Z",
    ]


def test_catch_up_in_the_repeated_hour_fires_the_missed_slot() -> None:
    # the case: mark at the day before, back at 01:10Z (02:10 CET, the second
    # pass): 02:30 CEST (00:30Z) is due, and nothing more until the next day
    s = spec("30 2 * * *", tz=BERLIN)
    mark = ms(datetime(2026, 10, 24, 0, 30, tzinfo=UTC))
    now = ms(datetime(2026, 10, 25, 1, 10, tzinfo=UTC))
    assert due_slots(s, mark, now) == ([ms(datetime(2026, 10, 25, 0, 30, tzinfo=UTC))], 0)
    fired = ms(datetime(2026, 10, 25, 0, 30, tzinfo=UTC))
    assert due_slots(s, fired, now + 30 * 60_000) == ([], 0)  # not again at 02:30 CET
    assert next_slot(s, fired) == ms(datetime(2026, 10, 26, 1, 30, tzinfo=UTC))


# -- a real scheduler on a real Redis, with a zone whose offset changes in the test ----

FAST = {"scheduling_interval": 0.2, "lock_timeout": 1.0, "polling_timeout": 1.0}


class Nightly(Event, event_name="dst-nightly"):
    n: int = 0


class Fired:
    """A handler that records the slot (unix ms) of every fire, by schedule."""

    def __init__(self) -> None:
        self.slots: dict[str, list[int]] = {}

    async def __call__(self, event: Event) -> None:
        delivery = current_delivery()
        assert delivery is not None and delivery.slot is not None
        assert delivery.schedule is not None
        self.slots.setdefault(delivery.schedule, []).append(ms(delivery.slot))


class Lab:
    """A private Redis (its URL, a client, its clock) and private zones, for one test."""

    def __init__(self, url: str, prefix: str, raw: aioredis.Redis, zones: Path) -> None:
        self.url, self.prefix, self.raw, self.zones = url, prefix, raw, zones
        self.cleanup = ExitStack()

    def service(self, fired: Fired | None = None, **options: Any) -> EventService:
        s = EventService.from_url(self.url, prefix=self.prefix, **{**FAST, **options})
        if fired is not None:
            s.add_handler(Nightly, fired)
        return s

    def zone(self, initial: tuple[int, str], changes: list[tuple[int, int, str]]) -> str:
        """A private zone's name, valid until the test ends (see ``tzif.private_zone``)."""
        return self.cleanup.enter_context(private_zone(self.zones, initial, changes))

    async def now(self) -> float:
        seconds, micros = await self.raw.time()
        return seconds + micros / 1e6

    async def past(self, t: float) -> bool:
        return await self.now() >= t

    async def commands(self) -> int:
        """Commands the server has run (scripts' own calls included: a bound, not a
        profile)."""
        return int((await self.raw.info("stats"))["total_commands_processed"])


@pytest.fixture
async def lab(private_server: RedisServer, prefix: str, tmp_path: Path) -> AsyncIterator[Lab]:
    raw = aioredis.Redis.from_url(private_server.url, protocol=2)
    lab = Lab(private_server.url, prefix, raw, tmp_path)
    with lab.cleanup:
        yield lab
    await raw.aclose()


def cron_at(naive_s: int, fields: int) -> str:
    """The expression of one wall-clock time (seconds since the epoch, in local time)."""
    t = datetime.fromtimestamp(naive_s, UTC)
    assert fields == 6 or t.second == 0
    head = f"{t.second} " if fields == 6 else ""
    return f"{head}{t.minute} {t.hour} * * *"


# The commands in the measurement windows below stay under this with no spin (60 to 160
# here); a spinning firer sends thousands a second (11,000 to 14,000 in 3 s here).
COMMAND_BOUND = 600


@pytest.mark.parametrize("fields", [5, 6])
async def test_back_in_the_repeated_hour_fires_the_missed_slot_once(
    lab: Lab, wait_for: Any, fields: int
) -> None:
    # The catch-up case on a private zone: the clock goes back an hour at X; the
    # slot's first occurrence (S0) comes and goes while no scheduler runs; a scheduler
    # starts after X (the second pass of the repeated hour), before its second occurrence.
    fired = Fired()
    async with lab.service(enable_scheduling=False) as declarer:
        s0 = int(await lab.now()) + 2
        change = s0 + 2
        before = HOUR + (-s0) % 60  # the slot is on a whole local minute (5 fields)
        zone = lab.zone((before, "AAA"), [(change, before - HOUR, "BBB")])
        cron = cron_at(s0 + before, fields)
        await declarer.schedule("nightly", Nightly, cron=cron, timezone=zone)
        assert await lab.now() < s0  # declared before the slot (the mark is "now")
    await wait_for(lambda: lab.past(change + 0.2), timeout=10)
    first = await lab.commands()
    async with lab.service(fired) as running:
        await wait_for(lambda: fired.slots.get("nightly"), timeout=10)
        # the measurement window: a second of the scheduler's life after the fire
        await asyncio.sleep(1.0)
        spent = await lab.commands() - first
        info = await running.schedule_info("nightly")
    assert fired.slots == {"nightly": [s0 * 1000]}
    assert info is not None and info.fires == 1
    # not again at the second occurrence (S0 + 1 h), next on the next day
    assert info.next_fire == datetime.fromtimestamp(s0 + HOUR + DAY, UTC)
    assert spent < COMMAND_BOUND, spent


@pytest.mark.parametrize("fields", [5, 6])
async def test_a_time_the_clock_skips_fires_once_at_the_change(
    lab: Lab, wait_for: Any, fields: int
) -> None:
    # The clock goes forward an hour at X, over the schedule's time: it fires once, at X;
    # an every-second wall-clock schedule fires each second once around X (the hour the
    # clock skips is one slot, at X).
    fired = Fired()
    async with lab.service(fired) as running:
        change = int(await lab.now()) + 3
        before = (-(change + HOUR // 2)) % 60  # half an hour into the gap is a whole minute
        zone = lab.zone((before, "AAA"), [(change, before + HOUR, "BBB")])
        skipped = cron_at(change + before + HOUR // 2, fields)
        await running.schedule("skipped", Nightly, cron=skipped, timezone=zone)
        await running.schedule("seconds", Nightly, cron="* 0-59 0-23 * * *", timezone=zone)
        assert await lab.now() < change - 1
        await wait_for(lambda: fired.slots.get("skipped"), timeout=10)
        await wait_for(lambda: max(fired.slots.get("seconds", [0])) >= (change + 2) * 1000)
        info = await running.schedule_info("skipped")
    assert fired.slots["skipped"] == [change * 1000]
    assert info is not None and info.fires == 1
    assert info.next_fire == datetime.fromtimestamp(change - HOUR // 2 + DAY, UTC)
    seconds = sorted(fired.slots["seconds"])
    assert seconds == list(range(seconds[0], seconds[-1] + 1000, 1000))  # once each, no gap
    assert change * 1000 in seconds


async def test_the_repeated_hour_fires_once_while_the_scheduler_runs(
    lab: Lab, wait_for: Any
) -> None:
    # The clock goes back an hour at X: an every-second wall-clock schedule fires each
    # second up to X and then waits for the hour to come round; a real-time one
    # ("*" minute) goes on every second.
    fired = Fired()
    async with lab.service(fired) as running:
        change = int(await lab.now()) + 3
        zone = lab.zone((HOUR, "AAA"), [(change, 0, "BBB")])
        await running.schedule("wall", Nightly, cron="* 0-59 0-23 * * *", timezone=zone)
        await running.schedule("real", Nightly, cron="* * * * * *", timezone=zone)
        assert await lab.now() < change - 1
        await wait_for(lambda: max(fired.slots.get("real", [0])) >= (change + 2) * 1000)
        info = await running.schedule_info("wall")
    wall = sorted(fired.slots["wall"])
    assert wall == list(range(wall[0], change * 1000, 1000))  # each second once, up to X
    assert info is not None and info.next_fire == datetime.fromtimestamp(change + HOUR, UTC)
    real = sorted(fired.slots["real"])
    assert real == list(range(real[0], real[-1] + 1000, 1000)) and change * 1000 in real


async def test_a_due_slot_that_yields_no_fire_does_not_spin_the_firer(
    lab: Lab,
    wait_for: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Defence in depth: should the slot lookups ever disagree again (the next slot due,
    # yet nothing to fire), the firer looks at the schedule once a second and says so.
    monkeypatch.setattr(firing, "due_slots", lambda spec, mark, now: ([], 0))
    async with lab.service() as running:
        info = await running.schedule("stuck", Nightly, cron="* * * * * *")
        assert info.next_fire is not None
        due = info.next_fire.timestamp()
        await wait_for(lambda: lab.past(due + 0.5), timeout=10)
        first = await lab.commands()
        await asyncio.sleep(1.5)  # the measurement window
        spent = await lab.commands() - first
    assert spent < COMMAND_BOUND, spent
    assert "schedule stuck: slot" in caplog.text and "nothing fires" in caplog.text
