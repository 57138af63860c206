"""Recurring schedules: cron expressions and intervals in IANA time zones, each slot fired
exactly once by any number of processes (see docs/SCHEDULES.md).

* :mod:`.cron`: cron expressions in a time zone and their slots (cronsim, zoneinfo, DST);
* :mod:`.spec`: the stored definition and its slots, fire ids, jitter;
* :mod:`.state`: the state the Lua scripts keep (the mark of the last slot fired, ...);
* :mod:`.identity`: when two declarations are the same definition (nothing then changes);
* :mod:`.api`: ``Schedules``, the operations ``EventService.schedule`` and friends call,
  and ``ScheduleInfo``;
* :mod:`.firing`: ``ScheduleFirer``, the loop every scheduler process runs.

The Redis side is ``delayq/storage/schedules.py`` and ``lua/schedule_*.lua``.
"""

from __future__ import annotations

from .api import ScheduleInfo, Schedules
from .firing import ScheduleFirer
from .spec import ALIASES, ScheduleSpec, fire_id, next_slot, previous_slot

__all__ = [
    "ALIASES",
    "ScheduleFirer",
    "ScheduleInfo",
    "ScheduleSpec",
    "Schedules",
    "fire_id",
    "next_slot",
    "previous_slot",
]
