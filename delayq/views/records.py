"""The public records of the lookups, and opening a stored envelope for them.

:class:`EventInfo` (with a :class:`GroupState` per delivery group),
:class:`ScheduledEvent` and :class:`DeadLetter` are what :class:`~delayq.views.inspection.Inspector`
and :mod:`~delayq.views.searching` fill; :func:`decode_payload` opens an envelope
into them without ever raising on bad bytes. Their ``to_dict()`` is the stable
JSON form the CLI and the dashboard print.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, TypeVar, overload

import msgspec

from ..codec import Codec, open_envelope
from ..context import Parent
from ..errors import DecodeError
from ..events import Event
from ..storage.records import DeadRecord

__all__ = [
    "MAX_PAGE",
    "DeadLetter",
    "EventInfo",
    "EventState",
    "EventTypeRef",
    "GroupState",
    "RunProgress",
    "ScheduledEvent",
    "check_page",
    "decode_payload",
    "utc",
]

_R = TypeVar("_R")

EventTypeRef = type[Event] | str
"""An event type given as its class or as its wire name."""

EventState = Literal["waiting", "scheduled", "ready", "in_flight", "dead", "absent", "stranded"]
"""Where an event is: waiting for its parents (``after=[...]``), waiting for its due time,
queued for a consumer, held by a handler, a dead letter, not in Redis at all, or
``stranded`` (an envelope in no state: only something other than delayq can leave one
behind)."""

MAX_PAGE = 1000
"""The largest ``limit`` of one page read."""


@overload
def utc(ms: int) -> datetime: ...
@overload
def utc(ms: int | None) -> datetime | None: ...
def utc(ms: int | None) -> datetime | None:
    """A time in ms on Redis's clock as a UTC datetime (None stays None)."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, timezone.utc)


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat().replace("+00:00", "Z")


def _jsonable(value: Any) -> Any:
    """Plain JSON-able data (bytes as base64, datetimes as ISO 8601, map keys as str)."""
    try:
        return msgspec.to_builtins(value, str_keys=True)
    except (TypeError, ValueError):  # say, a MessagePack extension type no one registered
        return repr(value)


@dataclass(frozen=True, slots=True)
class _Decoded:
    event: Event | None = None
    payload: Any = None
    context: dict[str, str] = field(default_factory=dict)
    enqueued_at: datetime | None = None
    serializer: str | None = None
    error: str | None = None


def decode_payload(
    envelope: bytes | None, event_id: str | bytes, event_type: type[Event] | None, codec: Codec
) -> _Decoded:
    """Open a stored envelope: the event (when its class is known), JSON-able payload, context.

    Never raises on bad bytes: the reason is returned in ``error``.
    """
    if envelope is None:
        return _Decoded(error="the stored event is missing")
    try:
        opened = open_envelope(envelope, event_id)
    except DecodeError as exc:
        return _Decoded(error=str(exc))
    context = opened.context
    enqueued_at = utc(opened.enqueued_at_ms) if opened.enqueued_at_ms else None
    serializer = opened.serializer
    problem: str | None = None
    if event_type is not None:
        try:
            event, _ = codec.decode(envelope, event_type, event_id)
            return _Decoded(event, _jsonable(event), context, enqueued_at, serializer)
        except DecodeError as exc:
            problem = str(exc)  # still show what is there: the untyped decode below
    try:
        if serializer == "json":
            plain = msgspec.json.decode(opened.payload)
        else:
            plain = msgspec.msgpack.decode(opened.payload)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        problem = problem or f"cannot decode the payload: {exc}"
        return _Decoded(None, None, context, enqueued_at, serializer, problem)
    return _Decoded(None, _jsonable(plain), context, enqueued_at, serializer, problem)


@dataclass(frozen=True, slots=True)
class GroupState:
    """Where an event is in one delivery group (see :attr:`EventInfo.groups`)."""

    group: str
    """The group's name."""
    state: EventState
    """``scheduled`` (waiting for its due time, or for this group's retry), ``ready``,
    ``in_flight``, ``dead`` (this group's dead letter), or ``absent``: the group holds
    nothing of it (it handled it already, or was registered after it was fanned out)."""
    due_at: datetime | None
    """``scheduled``: when this group gets it (the event's due time while it has not been
    fanned out to the groups yet, else this group's retry time); else None."""
    lease_deadline: datetime | None
    """``in_flight``: when this group's lease runs out unless its handler renews it."""
    failed_at: datetime | None
    """``dead``: when it became this group's dead letter."""
    attempts: int
    """This group's deliveries so far."""
    last_error: str | None
    """This group's last failure, if any."""

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON-able fields (times as ISO 8601 UTC)."""
        return {
            "state": self.state,
            "due_at": _iso(self.due_at),
            "lease_deadline": _iso(self.lease_deadline),
            "failed_at": _iso(self.failed_at),
            "attempts": self.attempts,
            "last_error": self.last_error,
        }


@dataclass(frozen=True, slots=True)
class EventInfo:
    """All that Redis knows about one event, read in one atomic step."""

    type_name: str
    """The event type's wire name."""
    id: str
    """The event id."""
    state: EventState
    """Where the event is (see :data:`EventState`)."""
    due_at: datetime | None
    """When it is due (``scheduled``: its due time, or retry time after a failure); else None."""
    lease_deadline: datetime | None
    """``in_flight``: when its lease runs out unless the handler renews it; else None."""
    failed_at: datetime | None
    """``dead``: when it became a dead letter; else None."""
    attempts: int
    """Deliveries so far (0 before the first)."""
    last_error: str | None
    """The last failure as ``"ExceptionType: message"``, if any."""
    context: Mapping[str, str]
    """The context given at enqueue time."""
    enqueued_at: datetime | None
    """When it was enqueued (the producer's clock)."""
    event: Event | None
    """The decoded event when its class is known and the payload validates; else None."""
    payload: Any
    """The payload as JSON-able data (from ``event`` or, without a class, the envelope)."""
    serializer: str | None
    """``"msgpack"`` or ``"json"``: how the envelope is encoded."""
    raw: bytes | None
    """The stored envelope bytes."""
    decode_error: str | None
    """Why the envelope or payload did not decode, if it did not."""
    checked_at: datetime
    """Redis's time of the read."""
    groups: Mapping[str, GroupState] = field(default_factory=dict)
    """For a type with named delivery groups: the event's state in each registered group,
    by name (empty otherwise). ``state`` and the fields from ``due_at`` to ``last_error``
    are then those of the most active group (in flight, else ready, scheduled, dead)."""
    progress: RunProgress | None = None
    """``in_flight``: what its handler last reported (``Delivery.progress``), if anything."""
    outcome: Literal["ok", "failed"] | None = None
    """For an ``absent`` event of a type with ``results=``: ``"ok"`` when its result is
    kept, ``"failed"`` when its dead letter's error is (read it with
    ``EventService.result``); else None."""
    priority: int = 0
    """The event's priority level: 0 (the most urgent, the default) to 9
    (docs/guides/priorities.md)."""

    parents: tuple[Parent, ...] = ()
    """For an event enqueued with ``after=[...]``: each parent and its outcome so far
    (``"pending"`` for those it still waits on; docs/WORKFLOWS.md, "Dependencies")."""

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON-able fields (times as ISO 8601 UTC, ``raw`` as base64)."""
        return {
            "type": self.type_name,
            "id": self.id,
            "state": self.state,
            "priority": self.priority,
            "due_at": _iso(self.due_at),
            "lease_deadline": _iso(self.lease_deadline),
            "failed_at": _iso(self.failed_at),
            "attempts": self.attempts,
            "last_error": self.last_error,
            "context": dict(self.context),
            "enqueued_at": _iso(self.enqueued_at),
            "payload": self.payload,
            "serializer": self.serializer,
            "raw_base64": None if self.raw is None else base64.b64encode(self.raw).decode(),
            "decode_error": self.decode_error,
            "checked_at": _iso(self.checked_at),
            "groups": {name: g.to_dict() for name, g in self.groups.items()},
            "progress": None if self.progress is None else self.progress.to_dict(),
            "outcome": self.outcome,
            "parents": [
                {"type": p.event_type, "id": p.id, "status": p.status, "error": p.error}
                for p in self.parents
            ],
        }


@dataclass(frozen=True, slots=True)
class RunProgress:
    """What a running handler last reported with ``current_delivery().progress(...)``."""

    value: Any
    """The value reported (a number, say 0 to 100, or small JSON-able data)."""
    note: str | None
    """The note given with it, if any."""
    reported_at: datetime | None
    """When the handler reported it (the worker's clock)."""

    @classmethod
    def decode(cls, data: bytes) -> RunProgress | None:
        """From its stored JSON; None for anything else (never raises)."""
        try:
            raw = msgspec.json.decode(data)
        except msgspec.DecodeError:
            return None
        if not isinstance(raw, dict):
            return None
        note, at = raw.get("note"), raw.get("at")
        return cls(
            value=raw.get("value"),
            note=note if isinstance(note, str) else None,
            reported_at=(
                datetime.fromtimestamp(at / 1000, timezone.utc)
                if isinstance(at, int) and not isinstance(at, bool) and 0 <= at < 2**45
                else None
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields."""
        return {"value": self.value, "note": self.note, "reported_at": _iso(self.reported_at)}


@dataclass(frozen=True, slots=True)
class ScheduledEvent:
    """A scheduled event, as listed by :meth:`EventService.scheduled`."""

    id: str
    """The event id."""
    due_at: datetime
    """When it is due (UTC, Redis's clock)."""
    attempts: int
    """Deliveries so far (more than 0: it is waiting for a retry)."""
    last_error: str | None
    """The last failure, if it is waiting for a retry."""
    context: Mapping[str, str]
    """The context given at enqueue time."""
    event: Event | None
    """The decoded event when its class is known; else None."""
    payload: Any
    """The payload as JSON-able data."""
    raw: bytes | None
    """The stored envelope bytes."""
    decode_error: str | None = None
    """Why the payload did not decode, if it did not."""

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON-able fields."""
        return {
            "id": self.id,
            "due_at": _iso(self.due_at),
            "attempts": self.attempts,
            "last_error": self.last_error,
            "context": dict(self.context),
            "payload": self.payload,
            "decode_error": self.decode_error,
        }


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An event that failed on every allowed delivery."""

    id: str
    """The event id."""
    event: Event | None
    """The decoded event, or None when it no longer decodes (see ``decode_error``) or its
    class is not known (looked up by name: see ``payload``)."""
    context: Mapping[str, str]
    """The context given at enqueue time."""
    attempts: int
    """How many deliveries were made."""
    error: str
    """The last failure, as ``"ExceptionType: message"``."""
    failed_at: datetime
    """When it became a dead letter (UTC, Redis's clock)."""
    raw: bytes | None
    """The stored envelope."""
    decode_error: str | None = None
    """Why ``event`` is None, if it is."""
    payload: Any = None
    """The payload as JSON-able data (also when the class is not known)."""

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON-able fields."""
        return {
            "id": self.id,
            "failed_at": _iso(self.failed_at),
            "attempts": self.attempts,
            "error": self.error,
            "context": dict(self.context),
            "payload": self.payload,
            "decode_error": self.decode_error,
        }


def dead_letter(record: DeadRecord, cls: type[Event] | None, codec: Codec) -> DeadLetter:
    """A stored dead letter opened into its public record."""
    decoded = decode_payload(record.envelope, record.raw_id, cls, codec)
    return DeadLetter(
        id=record.raw_id.decode("utf-8", "replace"),
        event=decoded.event,
        context=decoded.context,
        attempts=record.attempts,
        error=record.error,
        failed_at=utc(record.failed_at_ms),
        raw=record.envelope,
        decode_error=decoded.error,
        payload=decoded.payload,
    )


async def merged_page(
    shards: Sequence[str],
    read: Callable[[str, int, int], Awaitable[tuple[int, list[_R]]]],
    offset: int,
    limit: int,
    key: Callable[[_R], Any],
) -> tuple[int, list[_R]]:
    """Redis's time (ms) and the page ``offset .. offset+limit-1`` of a type's shards, by
    ``key``: ``read(shard, offset, limit)`` pages one shard; several shards each give their
    first ``offset+limit`` entries, merged."""
    if len(shards) == 1:
        return await read(shards[0], offset, limit)
    now_ms, page = 0, []
    for shard in shards:
        shard_now, part = await read(shard, 0, offset + limit)
        now_ms = max(now_ms, shard_now)
        page.extend(part)
    return now_ms, sorted(page, key=key)[offset : offset + limit]


def check_page(limit: object, offset: object) -> None:
    """Raise unless ``limit`` (1 to :data:`MAX_PAGE`) and ``offset`` (>= 0) are a page."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be an int from 1 to {MAX_PAGE}, not {limit!r}")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, not {offset!r}")
