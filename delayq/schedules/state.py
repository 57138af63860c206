"""A schedule's state as ``schedule_fire.lua`` and ``schedule_write.lua`` keep it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = ["ScheduleState"]


class _Stored(msgspec.Struct, array_like=True):
    """The stored array; the fields a state written by an older version lacks default."""

    version: Any
    mark: Any
    last_id: Any
    last_fire: Any
    last_slot: Any
    paused: Any
    gen: Any
    fires: Any
    skipped: Any
    triggers: Any = 0
    # false, or the held fire {slot, id, due, envelope}: kept raw, the envelope is bytes
    # that Lua's MessagePack writes as a string (not always valid UTF-8)
    buffered: msgspec.Raw = msgspec.Raw()


class _Held(msgspec.Struct, array_like=True):
    slot: int
    id: Any
    due: Any
    envelope: msgspec.Raw


_decode_stored = msgspec.msgpack.Decoder(_Stored).decode
_decode_held = msgspec.msgpack.Decoder(_Held).decode


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """The MessagePack array ``[version, mark, last id, last fire, last slot, paused, gen,
    fires, skipped, triggers, buffered]`` (times in unix ms, gen in Redis µs)."""

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
    buffered_slot_ms: int = 0
    """The slot of the fire ``overlap="buffer_one"`` holds back (0: none)."""
    buffered_id: str = ""

    @classmethod
    def decode(cls, data: bytes) -> ScheduleState:
        """Read the stored array."""
        raw = _decode_stored(data)
        held_slot, held_id = 0, ""
        buffered = bytes(raw.buffered)
        if buffered[:1] and 0x90 <= buffered[0] <= 0x9F:  # a (fixed-size) array: one is held
            held = _decode_held(buffered)
            held_slot, held_id = int(held.slot), _text(held.id)
        return cls(
            version=_text(raw.version),
            mark_ms=int(raw.mark),
            last_id=_text(raw.last_id),
            last_fire_ms=int(raw.last_fire),
            last_slot_ms=int(raw.last_slot),
            paused=int(raw.paused) == 1,
            gen=int(raw.gen),
            fires=int(raw.fires),
            skipped=int(raw.skipped),
            triggers=int(raw.triggers or 0),
            buffered_slot_ms=held_slot,
            buffered_id=held_id,
        )
