"""A schedule's state as ``schedule_fire.lua`` and ``schedule_write.lua`` keep it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = ["ScheduleState"]


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """The MessagePack array ``[version, mark, last id, last fire, last slot, paused, gen,
    fires, skipped, triggers]`` (times in unix ms, gen in Redis µs)."""

    version: str
    mark_ms: int
    last_id: str
    last_fire_ms: int
    last_slot_ms: int
    paused: bool
    gen: int
    fires: int
    skipped: int
    triggers: int

    @classmethod
    def decode(cls, data: bytes) -> ScheduleState:
        """Read the stored array."""
        raw: list[Any] = msgspec.msgpack.decode(data)
        raw = [*raw, *[0] * (10 - len(raw))]
        last_id = raw[2]
        return cls(
            version=str(raw[0]),
            mark_ms=int(raw[1]),
            last_id=last_id.decode() if isinstance(last_id, bytes) else str(last_id or ""),
            last_fire_ms=int(raw[3]),
            last_slot_ms=int(raw[4]),
            paused=int(raw[5]) == 1,
            gen=int(raw[6]),
            fires=int(raw[7]),
            skipped=int(raw[8]),
            triggers=int(raw[9] or 0),
        )
