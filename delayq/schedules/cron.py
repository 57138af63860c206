"""Cron expressions in an IANA time zone: checking them, and their slots (unix ms).

cronsim parses an expression and matches it against a calendar; this module
decides where its times fall on the timeline at daylight-saving changes, by
Debian cron's rules for 5 and 6 fields alike (cronsim applies them to 5 fields
only). A *wall-clock* expression (neither minute nor hour starts with ``*``)
names local times: they are iterated as naive local times and placed by
:func:`_instant` (a repeated time at its first occurrence, a skipped one at the
first instant after the gap); that placement never goes backwards, so the
first placed time after an instant is the next slot, and the last one up to
:func:`_wall_bound` is the latest slot: forward and reverse lookups agree at
every instant. A *real-time* expression matches each instant's own local time:
between two offset changes local time is the instant plus a fixed offset, so it
is iterated in that fixed offset, piece by piece (cronsim's own stepping through
a zone skips slots when a change is not a whole hour, as Lord Howe's 30 minutes).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as _timezone
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

UTC = _timezone.utc

__all__ = ["ALIASES", "check_cron", "check_timezone", "cron_after", "cron_at_or_before"]

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""The ``@`` aliases accepted for ``cron`` (mapped to their 5-field expression)."""


# -- checking -------------------------------------------------------------------------


@lru_cache(maxsize=256)
def check_timezone(name: object) -> ZoneInfo:
    """The :class:`ZoneInfo` of an IANA name; ``ValueError`` for an unknown one."""
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"timezone must be an IANA time zone name such as 'Europe/Berlin': {name!r}"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(
            f"unknown time zone {name!r} (an IANA name such as 'Europe/Berlin' or 'UTC'; "
            "install the tzdata package where the system has no time zone database)"
        ) from exc


def check_cron(expression: object, timezone: str) -> str:
    """The expression to store (aliases expanded); ``ValueError`` when cronsim refuses it."""
    if not isinstance(expression, str) or not expression.strip():
        raise TypeError(f"cron must be a non-empty string: {expression!r}")
    expr = " ".join(expression.split())
    expr = ALIASES.get(expr.lower(), expr)
    if expr.startswith("@"):
        raise ValueError(f"unknown cron alias {expression!r}; known: {', '.join(ALIASES)}")
    if len(expr.split()) not in (5, 6):
        raise ValueError(
            f"bad cron expression {expression!r}: expected 5 fields (minute hour day month "
            "weekday) or 6 (with seconds first)"
        )
    tz = check_timezone(timezone)
    try:
        it = CronSim(expr, datetime(2000, 1, 1, tzinfo=tz))
        next(it)
    except CronSimError as exc:
        raise ValueError(f"bad cron expression {expression!r}: {exc}") from None
    except StopIteration:
        raise ValueError(f"cron expression {expression!r} never matches") from None
    return expr


# -- slots ----------------------------------------------------------------------------


def _ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def _wall_clock(expr: str) -> bool:
    """Whether an expression names wall-clock times (Debian cron's rule, for 5 and 6
    fields alike): neither its minute nor its hour field starts with ``*``."""
    fields = expr.split()
    return not fields[-5].startswith("*") and not fields[-4].startswith("*")


def _offset(tz: ZoneInfo, second: int) -> timedelta | None:
    return datetime.fromtimestamp(second, tz).utcoffset()


def _change_at(tz: ZoneInfo, before: int, after: int) -> int:
    """The first unix second in ``(before, after]`` with the offset ``after`` has (the zone
    changes its offset once in between: transitions fall on whole seconds)."""
    target = _offset(tz, after)
    while after - before > 1:
        mid = (before + after) // 2
        if _offset(tz, mid) == target:
            after = mid
        else:
            before = mid
    return after


def _instant(naive: datetime, tz: ZoneInfo) -> int:
    """The unix ms of a wall-clock slot: its first occurrence when the wall clock repeats
    it (fall back), the first instant after the gap when it skips it (spring forward)."""
    first = naive.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == naive:
        return _ms(first)
    # in a gap: fold=0 and fold=1 give the instants on either side of the change
    other = _ms(naive.replace(tzinfo=tz, fold=1).astimezone(UTC)) // 1000
    lo, hi = sorted((_ms(first) // 1000, other))
    return _change_at(tz, lo, hi) * 1000


def _wall_bound(tz: ZoneInfo, at_ms: int) -> datetime:
    """The latest wall-clock time whose slot is at or before ``at_ms`` (naive, to the ms).

    The wall clock of ``at_ms`` itself, except in the second pass of a repeated period:
    there every repeated time has already occurred (its slot is its first occurrence), so
    the bound is the end of the repeated period (just before it).
    """
    second, millis = divmod(at_ms, 1000)
    local = datetime.fromtimestamp(second, tz)
    if not local.fold:
        return local.replace(tzinfo=None) + timedelta(milliseconds=millis)
    repeated = (local.replace(fold=0).utcoffset() or timedelta()) - (
        local.utcoffset() or timedelta()
    )
    change = _change_at(tz, second - int(repeated.total_seconds()), second)
    end = datetime.fromtimestamp(change - 1, tz).replace(tzinfo=None)
    return end + timedelta(milliseconds=999)


# Zones never change their offset twice within this many seconds: probing an interval at
# this step finds each change in it.
_PROBE_S = 6 * 3600


def _first_change(tz: ZoneInfo, after: int, until: int) -> int | None:
    """The first unix second in ``(after, until]`` whose offset differs from the second
    before it, or None."""
    while after < until:
        step = min(after + _PROBE_S, until)
        if _offset(tz, step) != _offset(tz, after):
            return _change_at(tz, after, step)
        after = step
    return None


def _last_change(tz: ZoneInfo, after: int, until: int) -> int | None:
    """The last unix second in ``(after, until]`` whose offset differs from the second
    before it, or None."""
    while until > after:
        step = max(until - _PROBE_S, after)
        if _offset(tz, step) != _offset(tz, until):
            return _change_at(tz, step, until)
        until = step
    return None


def _fixed(tz: ZoneInfo, second: int) -> _timezone:
    return _timezone(_offset(tz, second) or timedelta())


def _real_after(expr: str, tz: ZoneInfo, after_s: int) -> int | None:
    # between two changes the local time is the instant plus a fixed offset: iterate in
    # that offset, and start again at a change that comes first
    while True:
        try:
            start = datetime.fromtimestamp(after_s, _fixed(tz, after_s + 1))
            found = next(CronSim(expr, start)).timestamp()
        except StopIteration:
            return None
        change = _first_change(tz, after_s + 1, int(found))
        if change is None:
            return int(found) * 1000
        after_s = change - 1


def _real_at_or_before(expr: str, tz: ZoneInfo, at_s: int) -> int | None:
    while True:
        # cronsim's reverse iteration starts at the whole second (included) below a fraction
        start = datetime.fromtimestamp(at_s, _fixed(tz, at_s)).replace(microsecond=1)
        try:
            found = next(CronSim(expr, start, reverse=True)).timestamp()
        except StopIteration:
            return None
        change = _last_change(tz, int(found), at_s)
        if change is None:
            return int(found) * 1000
        at_s = change - 1


@lru_cache(maxsize=4096)
def cron_after(expr: str, timezone: str, after_ms: int) -> int | None:
    """The first slot of ``expr`` in ``timezone`` strictly after ``after_ms`` (None: none
    within cronsim's 50 years)."""
    # many schedules share an expression and a slot: the cache makes a shared slot cheap
    tz = check_timezone(timezone)
    if not _wall_clock(expr):
        return _real_after(expr, tz, after_ms // 1000)
    # placed times never go backwards: the first placed after ``after_ms`` is the next slot
    for naive in CronSim(expr, _wall_bound(tz, after_ms)):
        found = _instant(naive, tz)
        if found > after_ms:
            return found
    return None


@lru_cache(maxsize=4096)
def cron_at_or_before(expr: str, timezone: str, at_ms: int) -> int | None:
    """The latest slot of ``expr`` in ``timezone`` at or before ``at_ms`` (None: none
    within cronsim's 50 years): always the one :func:`cron_after` walks to."""
    tz = check_timezone(timezone)
    if not _wall_clock(expr):
        return _real_at_or_before(expr, tz, at_ms // 1000)
    start = _wall_bound(tz, at_ms)
    # cronsim's reverse iteration starts at the whole second (included) below a fraction
    if start.microsecond == 0:
        start = start.replace(microsecond=1)
    for naive in CronSim(expr, start, reverse=True):
        found = _instant(naive, tz)
        if found <= at_ms:
            return found
    return None
