"""Recurring schedules' Redis side (see delayq/schedules/): definitions, state, the index.

Where the keys live (Redis Cluster: two slots per schedule, never one script across both):

* ``{p:T}:schedules`` HASH name -> definition and ``{p:T}:schedule-state`` HASH
  name -> state, under the hash tag of the event type's shard the schedule
  fires into (for a partitioned type: the partition of the schedule's name),
  next to that shard's queue keys: ``schedule_fire.lua`` checks and moves the
  schedule's mark and writes the fire's event in one script.
* ``{p}:schedules`` ZSET name -> next fire (ms) and ``{p}:schedule-homes`` HASH
  name -> ``"<gen>|<shard>"``, under the prefix's tag: the index the firers
  read (one ZRANGEBYSCORE for everything due). It is updated after the
  schedule's own script, and refuses news older than it has (``gen``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgspec

from .base import StoreCore
from .layouts import Layouts

__all__ = ["ScheduleStore", "ScheduleWrite"]


@dataclass(frozen=True, slots=True)
class ScheduleWrite:
    """What ``schedule_write.lua`` answered."""

    found: bool
    gen: int
    state: bytes | None
    definition: bytes | None
    now_ms: int
    differs: bool = False
    """An upsert with ``other="?"`` found another version stored and wrote nothing."""


_pack = msgspec.msgpack.Encoder().encode


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class ScheduleStore:
    """Schedules' definitions and state (per type shard) and their index (per prefix);
    ``types`` records a schedule's shard as the scheduler sweeps the types it knows."""

    def __init__(self, core: StoreCore, types: Layouts):
        self._core = core
        self._types = types

    @property
    def schedule_index_keys(self) -> tuple[str, str]:
        """The prefix's index ZSET and homes HASH."""
        return self._core.keys.schedule_index, self._core.keys.schedule_homes

    def schedule_keys(self, shard: str) -> tuple[str, str]:
        """The definitions HASH and state HASH of the schedules that fire into ``shard``."""
        keys = self._core.keys.for_shard(shard)
        return keys.schedules, keys.schedule_state

    async def schedule_write(
        self,
        shard: str,
        op: str,
        name: str,
        definition: bytes = b"",
        version: str = "",
        other: str = "",
    ) -> ScheduleWrite:
        """Upsert, pause, resume, remove or read one schedule (``schedule_write.lua``).

        ``other``: what an upsert does when another version is stored: ``""`` change it
        (the mark moves to now), ``"?"`` write nothing and answer ``differs`` with what is
        stored, or a version: replace exactly that one keeping the mark (the same
        definition as an older release encoded it)."""
        if op == "upsert":
            await self._types.register_type(shard)  # the scheduler sweeps the types it knows
        r = await self._core.scripts["schedule_write"](
            keys=list(self.schedule_keys(shard)), args=[op, name, definition, version, other]
        )
        return ScheduleWrite(
            found=int(r[0]) != 0,
            differs=int(r[0]) == 2,
            gen=int(r[1]),
            state=r[2] or None,
            definition=r[3] or None,
            now_ms=int(r[4]),
        )

    async def schedule_fire(
        self, shard: str, fires: Sequence[tuple[str, str, str, str, int, bytes, str, int]]
    ) -> list[tuple[int, int, int, int, int]]:
        """Fire ``(name, version, slot or 'T'/'P', id, due ms, envelope, overlap, priority
        level)`` items in one shard (``schedule_fire.lua``); ``(code, gen, mark, released
        slot, buffered slot)`` per item (slots in ms, 0 for none)."""
        # a fire above level 0 needs `prio` and the levels' lists (the last keys); so may a
        # buffered fire's release ('P'), which writes the level it was held with
        levelled = any(fire[7] for fire in fires)
        last = None if levelled else "schedule_state"
        keys = self._core.script_keys("schedule_fire", shard, None, last=last)
        packed: list[Any] = []
        for name, version, slot, event_id, due, envelope, overlap, level in fires:
            packed.extend((name, version, slot, event_id, due, len(envelope), overlap, level))
        blob = b"".join(item[5] for item in fires)
        args: list[str | bytes] = [self._core.keys.wakeup_channel, shard, _pack(packed), blob]
        reply = await self._core.scripts["schedule_fire"](keys=keys, args=args)
        return [(int(c), int(g), int(m), int(r), int(b)) for c, g, m, r, b in reply]

    async def schedule_load(
        self, shard: str, names: Sequence[str]
    ) -> list[tuple[bytes | None, bytes | None]]:
        """``(definition, state)`` of each name in ``shard`` (at most 1000), read together
        (``schedule_load.lua``): the state's version is always the definition's."""
        if not names:
            return []
        r = await self._core.scripts["schedule_load"](
            keys=list(self.schedule_keys(shard)), args=list(names)
        )
        return [(r[i] or None, r[i + 1] or None) for i in range(0, len(r), 2)]

    async def schedule_index(
        self, entries: Sequence[tuple[str, int, str, int | None]], *, publish: bool = False
    ) -> int:
        """Record ``(name, gen, shard or '', next ms or None)`` news in the prefix's index;
        with ``publish``, wake the firers of every process (``:schedules``)."""
        if not entries:
            return 0
        packed: list[Any] = []
        for name, gen, shard, next_ms in entries:
            packed.extend((name, gen, shard, "" if next_ms is None else next_ms))
        args = [self._core.keys.wakeup_channel, "1" if publish else "0", _pack(packed)]
        return int(
            await self._core.scripts["schedule_index"](
                keys=list(self.schedule_index_keys), args=args
            )
        )

    async def schedules_due(
        self, limit: int, ahead_ms: int = 0
    ) -> tuple[int, int | None, list[tuple[str, int, str]]]:
        """``(Redis now ms, next fire after the horizon or None, [(name, gen, shard)] due
        by now + ahead_ms)``."""
        r = await self._core.scripts["schedule_due"](
            keys=list(self.schedule_index_keys), args=[limit, ahead_ms]
        )
        due = []
        for i in range(2, len(r), 2):
            gen, shard = _text(r[i + 1]).split("|", 1)
            due.append((_text(r[i]), int(gen), shard))
        nxt = int(r[1])
        return int(r[0]), None if nxt < 0 else nxt, due

    async def schedule_home(self, name: str) -> str | None:
        """The shard schedule ``name`` lives in (None: no such schedule)."""
        home = await self._core.redis.hget(self._core.keys.schedule_homes, name)
        if home is None:
            return None
        shard = _text(home).split("|", 1)[1]
        return shard or None

    async def schedule_homes(self) -> dict[str, str]:
        """Every schedule's name -> shard (HSCAN, a page at a time)."""
        out: dict[str, str] = {}
        key = self._core.keys.schedule_homes
        cursor = 0
        while True:
            cursor, page = cast(
                tuple[int, dict[bytes, bytes]],
                await self._core.redis.hscan(key, cursor, count=1000),
            )
            for name, home in page.items():
                shard = _text(home).split("|", 1)[1]
                if shard:
                    out[_text(name)] = shard
            if not cursor:
                return out

    async def schedule_next_times(self, names: Sequence[str]) -> list[int | None]:
        """The index's next fire (ms) of each name (None: not in the index)."""
        if not names:
            return []
        scores = await self._core.redis.zmscore(self._core.keys.schedule_index, list(names))
        return [None if s is None else int(s) for s in scores]
