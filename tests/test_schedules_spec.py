"""Slot computation of recurring schedules, with a controllable clock (no Redis)."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from delayq.partitions.shards import partition_of
from delayq.schedules.spec import (
    ScheduleSpec,
    check_cron,
    check_timezone,
    due_slots,
    fire_id,
    jitter_ms,
    next_look,
    next_slot,
    previous_slot,
    upcoming,
)

UTC = timezone.utc


def spec(
    cron: str | None = None, every: int | None = None, tz: str = "UTC", **kw: object
) -> ScheduleSpec:
    opts: dict[str, object] = {
        "name": "s", "event_type": "t", "partitions": 1, "cron": None if cron is None else check_cron(cron, tz),
        "every_ms": every, "timezone": tz, "template": b"", "overlap": "skip",
        "catch_up_ms": None, "jitter_ms": 0, "start_ms": None, "end_ms": None,
    }  # fmt: skip
    opts.update(kw)
    return ScheduleSpec(**opts).with_version()  # type: ignore[arg-type]


def ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def local(slots: list[int], tz: str) -> list[str]:
    return [
        datetime.fromtimestamp(s / 1000, ZoneInfo(tz)).strftime("%m-%d %H:%M %Z") for s in slots
    ]


@pytest.mark.parametrize(
    ("tz", "day", "expected"),
    [
        # spring forward: 02:30 does not exist; it fires once, right after the change
        ("Europe/Berlin", datetime(2026, 3, 28, 12, tzinfo=UTC),
         ["03-29 01:30 CET", "03-29 03:00 CEST", "03-30 01:30 CEST", "03-30 02:30 CEST"]),
        ("America/New_York", datetime(2026, 3, 7, 12, tzinfo=UTC),
         ["03-08 01:30 EST", "03-08 03:00 EDT", "03-09 01:30 EDT", "03-09 02:30 EDT"]),
    ],
)  # fmt: skip
def test_spring_forward_fires_a_missing_time_once(
    tz: str, day: datetime, expected: list[str]
) -> None:
    s = spec("30 1,2 * * *", tz=tz)
    assert local(list(upcoming(s, ms(day), 4)), tz) == expected


@pytest.mark.parametrize(
    ("tz", "day"),
    [("Europe/Berlin", datetime(2026, 10, 24, 12, tzinfo=UTC)),
     ("America/New_York", datetime(2026, 10, 31, 12, tzinfo=UTC))],
)  # fmt: skip
def test_fall_back_fires_a_repeated_time_once(tz: str, day: datetime) -> None:
    s = spec("30 1 * * *", tz=tz)
    slots = list(upcoming(s, ms(day), 3))
    # 01:30 happens twice on the change day (New York) or not at all near it (Berlin
    # repeats 02:00-03:00): either way one fire per day, 24 or 25 hours apart
    days = [datetime.fromtimestamp(x / 1000, ZoneInfo(tz)).date() for x in slots]
    assert len(set(days)) == 3
    s2 = spec("30 2 * * *", tz="Europe/Berlin")
    berlin = list(upcoming(s2, ms(datetime(2026, 10, 24, 12, tzinfo=UTC)), 3))
    assert local(berlin, "Europe/Berlin") == [
        "10-25 02:30 CEST",
        "10-26 02:30 CET",
        "10-27 02:30 CET",
    ]
    assert (berlin[1] - berlin[0]) == 25 * 3600 * 1000


def test_fall_back_new_york_repeated_hour() -> None:
    s = spec("30 1 * * *", tz="America/New_York")
    slots = list(upcoming(s, ms(datetime(2026, 10, 31, 12, tzinfo=UTC)), 2))
    assert local(slots, "America/New_York") == ["11-01 01:30 EDT", "11-02 01:30 EST"]


def test_interval_slots_ignore_dst_and_are_anchored() -> None:
    s = spec(every=3_600_000, tz="Europe/Berlin")
    before = ms(datetime(2026, 3, 29, 0, 10, tzinfo=UTC))
    slots = list(upcoming(s, before, 3))
    assert [x % 3_600_000 for x in slots] == [0, 0, 0]
    assert slots[1] - slots[0] == 3_600_000  # an hour of real time across the change
    start = datetime(2026, 1, 1, 0, 0, 7, tzinfo=UTC)
    s2 = spec(every=60_000, start_ms=ms(start))
    assert next_slot(s2, ms(start) + 1) == ms(start) + 60_000
    assert next_slot(s2, 0) == ms(start)


def test_slots_never_drift_from_completion() -> None:
    s = spec("*/5 * * * *")
    t = ms(datetime(2026, 5, 1, 10, 0, tzinfo=UTC))
    assert next_slot(s, t) == t + 300_000
    assert next_slot(s, t + 123_456) == t + 300_000  # however late the last run ended


def test_seconds_field_aliases_L_and_hash() -> None:
    assert next_slot(spec("*/2 * * * * *"), 1_000) == 2_000
    assert check_cron("@hourly", "UTC") == "0 * * * *"
    last_day = next_slot(spec("0 0 L * *"), ms(datetime(2026, 2, 1, tzinfo=UTC)))
    assert last_day == ms(datetime(2026, 2, 28, tzinfo=UTC))
    second_monday = next_slot(spec("0 9 * * MON#2"), ms(datetime(2026, 6, 1, tzinfo=UTC)))
    assert second_monday == ms(datetime(2026, 6, 8, 9, tzinfo=UTC))


@pytest.mark.parametrize("bad", ["* * *", "61 * * * *", "@often", "* * * * * * *", "a b c d e"])
def test_bad_expressions_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="cron"):
        check_cron(bad, "UTC")


def test_unknown_time_zone() -> None:
    with pytest.raises(ValueError, match="unknown time zone"):
        check_timezone("Mars/Olympus")


def test_due_slots_catch_up_policies() -> None:
    s = spec(every=1000)
    assert due_slots(s, 10_000, 10_500) == ([], 0)
    assert due_slots(s, 10_000, 15_200) == ([15_000], 4)  # the latest only; 4 missed
    window = spec(every=1000, catch_up_ms=2500)
    assert due_slots(window, 10_000, 15_200) == ([13_000, 14_000, 15_000], 2)
    everything = spec(every=1000, catch_up_ms=3_600_000)
    slots, missed = due_slots(everything, 10_000, 15_200)
    assert (slots, missed) == ([11_000, 12_000, 13_000, 14_000, 15_000], 0)


def test_start_and_end_bound_the_slots() -> None:
    s = spec(every=1000, start_ms=5_000, end_ms=8_000)
    assert list(upcoming(s, 0, 10)) == [5_000, 6_000, 7_000, 8_000]
    assert previous_slot(s, 4_000) is None
    assert previous_slot(s, 100_000) == 8_000


def test_jitter_is_deterministic_per_slot() -> None:
    s = spec(every=1000, jitter_ms=500)
    values = [jitter_ms(s, slot) for slot in range(0, 100_000, 1000)]
    assert values == [jitter_ms(s, slot) for slot in range(0, 100_000, 1000)]
    assert 0 <= min(values) and max(values) <= 500 and len(set(values)) > 20


def test_fire_ids() -> None:
    t = ms(datetime(2026, 3, 29, 1, 0, tzinfo=UTC))
    assert fire_id("report", t, 1) == "report@2026-03-29T01:00:00Z"
    assert fire_id("report", t + 250, 1) == "report@2026-03-29T01:00:00.250Z"
    for name in ("a", "b", "report", "nightly"):
        for slot in range(0, 50_000, 1000):
            assert partition_of(fire_id(name, slot, 8), 8) == partition_of(name, 8)


def test_next_look_while_a_fire_is_buffered() -> None:
    s = spec(every=60_000)
    assert next_look(s, 60_000, 0, 61_000) == 120_000  # nothing held: the next slot
    # held for 1 s: look again in 125 ms (an eighth), never sooner than 50 ms
    assert next_look(s, 60_000, 60_000, 61_000) == 61_125
    assert next_look(s, 60_000, 60_000, 60_010) == 60_060
    # held long: once a second at most, and the next slot still comes first
    assert next_look(s, 60_000, 60_000, 100_000) == 101_000
    assert next_look(s, 60_000, 60_000, 119_500) == 120_000
    assert next_look(s, 60_000, 60_000, 61_000, ahead_ms=200) == 61_325
