"""What a schedule is, and the slots it yields: expressions, time zones, ids, jitter.

Pure computation, no Redis: :class:`ScheduleSpec` is the stored definition
(MessagePack in the type's ``schedules`` hash) and the functions below turn it
into nominal slot times (unix ms). Cron expressions are evaluated in the
schedule's IANA time zone by :mod:`.cron` (cronsim and :mod:`zoneinfo`, with
Debian cron's rules at daylight-saving changes for 5 and 6 fields alike: a
wall-clock time that does not exist fires once, at the first instant after the
gap; one that occurs twice fires once, at its first occurrence). ``every``
schedules count elapsed time from their anchor (``start_at``, else the unix
epoch), so their slots never depend on the time zone or on when the last run
finished.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Literal

import msgspec

from ..partitions.shards import partition_of
from .cron import ALIASES, UTC, check_cron, check_timezone, cron_after, cron_at_or_before

__all__ = [
    "ALIASES",
    "Overlap",
    "ScheduleSpec",
    "check_cron",
    "check_timezone",
    "due_slots",
    "fire_id",
    "jitter_ms",
    "next_look",
    "next_slot",
    "previous_slot",
    "restamp",
    "slot_text",
]

Overlap = Literal["allow", "skip", "buffer_one"]
OVERLAPS: tuple[str, ...] = ("allow", "skip", "buffer_one")

# Context keys every fire carries (hidden from event_context(); see Delivery.slot)
SCHEDULE_KEY = "delayq-schedule"
SLOT_KEY = "delayq-slot"
# A catch-up pass fires at most this many missed slots of one schedule; the rest next pass.
MAX_CATCH_UP_PER_PASS = 100


class ScheduleSpec(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A schedule's stored definition (everything but its state)."""

    name: str
    event_type: str
    """The event type's wire name."""
    partitions: int
    cron: str | None
    """The 5- or 6-field expression (aliases already expanded), or None for ``every``."""
    every_ms: int | None
    timezone: str
    template: bytes
    """The envelope of the payload (no id); each fire re-stamps it (:func:`restamp`)."""
    overlap: str
    catch_up_ms: int | None
    """Missed slots younger than this are all fired; None: only the latest missed slot."""
    jitter_ms: int
    start_ms: int | None
    end_ms: int | None
    version: str = ""
    """A digest of everything else: a changed definition has a new version."""
    priority: int = 0
    """The priority level of every fire (0 the most urgent; docs/guides/priorities.md)."""

    def with_version(self) -> ScheduleSpec:
        """This spec with its ``version`` set (a digest of the other fields).

        The digest covers ``priority`` only when it is not 0, so a definition stored
        before schedules had a priority keeps its version (and its mark)."""
        fields = msgspec.structs.astuple(msgspec.structs.replace(self, version=""))
        if not self.priority:
            fields = fields[:-1]
        body = msgspec.msgpack.encode(fields)
        return msgspec.structs.replace(
            self, version=hashlib.blake2b(body, digest_size=8).hexdigest()
        )

    @property
    def expression(self) -> str:
        """The cron expression, or ``every <duration>``."""
        if self.cron is not None:
            return self.cron
        return f"every {timedelta(milliseconds=self.every_ms or 0)}"


_encode_spec = msgspec.msgpack.Encoder().encode
_decode_spec = msgspec.msgpack.Decoder(ScheduleSpec).decode


def encode_spec(spec: ScheduleSpec) -> bytes:
    """The stored form of a spec: without ``priority`` when it is 0, so a definition reads
    as it did before schedules had a priority (a release without it can still read it
    during a rolling deploy)."""
    if spec.priority:
        return _encode_spec(spec)
    return _encode_spec(msgspec.structs.astuple(spec)[:-1])


def decode_spec(data: bytes) -> ScheduleSpec:
    """A spec from its stored form."""
    return _decode_spec(data)


def _in_window(spec: ScheduleSpec, slot: int | None) -> int | None:
    if slot is None or (spec.end_ms is not None and slot > spec.end_ms):
        return None
    return slot


def next_slot(spec: ScheduleSpec, after_ms: int) -> int | None:
    """The first slot strictly after ``after_ms`` (None: the schedule has ended)."""
    if spec.start_ms is not None and after_ms < spec.start_ms - 1:
        after_ms = spec.start_ms - 1
    if spec.every_ms is not None:
        anchor = spec.start_ms if spec.start_ms is not None else 0
        k = (after_ms - anchor) // spec.every_ms + 1
        return _in_window(spec, anchor + k * spec.every_ms)
    assert spec.cron is not None
    return _in_window(spec, cron_after(spec.cron, spec.timezone, after_ms))


def previous_slot(spec: ScheduleSpec, at_ms: int) -> int | None:
    """The last slot at or before ``at_ms`` (None if none, or before ``start_at``)."""
    if spec.end_ms is not None and at_ms > spec.end_ms:
        at_ms = spec.end_ms
    if spec.every_ms is not None:
        anchor = spec.start_ms if spec.start_ms is not None else 0
        if at_ms < anchor:
            return None
        slot = anchor + (at_ms - anchor) // spec.every_ms * spec.every_ms
    else:
        assert spec.cron is not None
        found = cron_at_or_before(spec.cron, spec.timezone, at_ms)
        if found is None:
            return None
        slot = found
    if spec.start_ms is not None and slot < spec.start_ms:
        return None
    return slot


# While overlap="buffer_one" holds a fire back, the firer looks whether the fire before
# it has left this often: an eighth of how long it has been held, 50 ms to 1 s (a fire
# released at most ~12% or 1 s after the running one ended; a long run costs ~1 look/s).
HOLD_LOOK_MIN_MS = 50
HOLD_LOOK_MAX_MS = 1000


def next_look(
    spec: ScheduleSpec, mark_ms: int, buffered_slot_ms: int, now_ms: int, ahead_ms: int = 0
) -> int | None:
    """When the firer next needs to look at a schedule (unix ms, for its index): its next
    slot, or sooner while a buffered fire waits for the running one to end (see
    ``HOLD_LOOK_*``; ``ahead_ms``: how early the firer acts on what the index says)."""
    nxt = next_slot(spec, mark_ms)
    if not buffered_slot_ms:
        return nxt
    held_for = max(0, now_ms - buffered_slot_ms)
    look = now_ms + ahead_ms + min(HOLD_LOOK_MAX_MS, max(HOLD_LOOK_MIN_MS, held_for // 8))
    return look if nxt is None else min(nxt, look)


def due_slots(spec: ScheduleSpec, mark_ms: int, now_ms: int) -> tuple[list[int], int]:
    """The slots to fire now: after ``mark_ms`` (the last slot fired), at or before ``now_ms``.

    Returns ``(slots, missed)``: with ``catch_up_ms`` None only the latest due
    slot is fired and the earlier ones are missed; otherwise every slot younger
    than ``catch_up_ms`` (at most ``MAX_CATCH_UP_PER_PASS`` per call, oldest
    first; the rest come on the next pass) and the latest in any case.
    ``missed`` counts the slots passed over (exactly for ``every``, up to 1000
    for cron).
    """
    latest = previous_slot(spec, now_ms)
    if latest is None or latest <= mark_ms:
        return [], 0
    floor = mark_ms
    if spec.catch_up_ms is not None:
        floor = max(mark_ms, now_ms - spec.catch_up_ms - 1)
    slots: list[int] = []
    if spec.catch_up_ms is not None:
        slot = next_slot(spec, floor)
        while slot is not None and slot <= now_ms and len(slots) < MAX_CATCH_UP_PER_PASS:
            slots.append(slot)
            slot = next_slot(spec, slot)
    if not slots:
        slots = [latest]
    return slots, _count_between(spec, mark_ms, slots[0])


def _count_between(spec: ScheduleSpec, after_ms: int, before_ms: int) -> int:
    """How many slots lie strictly between two times (cron: counted up to 1000)."""
    if spec.every_ms is not None:
        first = next_slot(spec, after_ms)
        if first is None or first >= before_ms:
            return 0
        return (before_ms - first - 1) // spec.every_ms + 1
    n, slot = 0, next_slot(spec, after_ms)
    while slot is not None and slot < before_ms and n < 1000:
        n += 1
        slot = next_slot(spec, slot)
    return n


def upcoming(spec: ScheduleSpec, after_ms: int, n: int) -> Iterator[int]:
    """The next ``n`` slots after ``after_ms``."""
    slot = after_ms
    for _ in range(n):
        found = next_slot(spec, slot)
        if found is None:
            return
        yield found
        slot = found


# -- fires ----------------------------------------------------------------------------


@lru_cache(maxsize=1024)  # many schedules share a slot; strftime is slow
def slot_text(slot_ms: int) -> str:
    """A slot as it appears in event ids: UTC, ``2026-03-29T01:00:00Z`` (ms only when not 0)."""
    dt = datetime.fromtimestamp(slot_ms / 1000, UTC)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if slot_ms % 1000:
        text += f".{slot_ms % 1000:03d}"
    return text + "Z"


def fire_id(name: str, slot_ms: int, partitions: int) -> str:
    """The event id of a schedule's fire for one slot: ``<name>@<slot in UTC>``.

    For a partitioned type a ``~k`` suffix (the smallest k that works) puts
    every fire in the partition the schedule lives in, so the fire script
    touches one slot of a cluster. The id is a pure function of its inputs:
    every process derives the same one.
    """
    base = f"{name}@{slot_text(slot_ms)}"
    return _routed(base, name, partitions)


def trigger_id(name: str, now_ms: int, partitions: int) -> str:
    """The event id of a manual trigger: ``<name>@trigger-<unix ms>``."""
    return _routed(f"{name}@trigger-{now_ms}", name, partitions)


def _routed(base: str, name: str, partitions: int) -> str:
    if partitions == 1:
        return base
    home = partition_of(name, partitions)
    candidate, k = base, 0
    while partition_of(candidate, partitions) != home:
        k += 1
        candidate = f"{base}~{k}"
    return candidate


def jitter_ms(spec: ScheduleSpec, slot_ms: int) -> int:
    """The delay added to one slot's fire: deterministic per (schedule, slot), 0..jitter."""
    if spec.jitter_ms <= 0:
        return 0
    digest = hashlib.blake2b(f"{spec.name}|{slot_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (spec.jitter_ms + 1)


class _Envelope(msgspec.Struct, array_like=True):
    """The codec's envelope layout ``[body without the id, enqueued_at_ms, context?]``."""

    body: msgspec.Raw
    enqueued_at: int
    context: dict[str, str] | None = None


_msgpack_env = msgspec.msgpack.Decoder(_Envelope)
_json_env = msgspec.json.Decoder(_Envelope)


def check_template(envelope: bytes) -> None:
    """Refuse an envelope whose body still holds the id (array-like or id-not-last types)."""
    try:
        env = (_json_env if envelope[:1] == b"[" else _msgpack_env).decode(envelope)
    except msgspec.DecodeError:
        env = None
    if env is None or not isinstance(env.enqueued_at, int) or env.enqueued_at <= 0:
        raise TypeError(
            "schedules need an event type encoded without its id in the body (a plain, "
            "not array_like, Event subclass whose id field comes last)"
        )


@lru_cache(maxsize=4096)
def _opened(template: bytes) -> _Envelope:
    return (_json_env if template[:1] == b"[" else _msgpack_env).decode(template)


def restamp(
    template: bytes,
    now_ms: int,
    name: str,
    slot_ms: int | None,
    extra: Mapping[str, str] | None = None,
) -> bytes:
    """The envelope of one fire: the template's body, enqueued now, with the schedule's context
    (and ``extra``: the trace context of the fire's send span)."""
    is_json = template[:1] == b"["
    env = _opened(template)
    context = dict(env.context or {})
    if extra:
        context.update(extra)
    context[SCHEDULE_KEY] = name
    if slot_ms is not None:
        context[SLOT_KEY] = str(slot_ms)
    out = _Envelope(env.body, now_ms, context)
    return msgspec.json.encode(out) if is_json else msgspec.msgpack.encode(out)
