"""Kept results: what a handler's return value becomes, and the stored outcome record.

A type declared with ``results=timedelta(...)`` keeps each finished event's outcome
in its own hash tag (``{p:T}:results``, id -> record; ``{p:T}:rexp``, id -> expiry):

- ``b"o" + mark + value``: the handler succeeded; ``mark`` is ``m`` (MessagePack) or
  ``j`` (JSON), the serializer the value was encoded with, so a fleet can switch
  serializers and still read what is kept;
- ``b"f" + error``: the event became a dead letter; ``error`` is its ``"Type: message"``.

The ack script writes the first in the same step that removes the event, the fail
script the second in the step that makes it a dead letter. A later reader of a parent's
outcome (a dependency, a batch) reads the same record by ``(type, id)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import msgspec

from .context import Parent

__all__ = [
    "Outcome",
    "Result",
    "decode_outcome",
    "decode_parent",
    "encode_value",
    "returned_value",
]

T = TypeVar("T")

_ENCODERS: dict[bytes, msgspec.msgpack.Encoder | msgspec.json.Encoder] = {
    b"m": msgspec.msgpack.Encoder(),
    b"j": msgspec.json.Encoder(),
}
_MARKS = {"msgpack": b"m", "json": b"j"}


@dataclass(frozen=True, slots=True)
class Result(Generic[T]):
    """A handler's return value kept as it is, booleans included.

    A handler's bare ``False`` means "retry later" and a bare ``True`` (or ``None``)
    "done, no value"; ``return delayq.Result(False)`` finishes the event and keeps
    ``False`` as its result (``Result(True)`` keeps ``True``). Any other value may be
    returned bare.
    """

    value: T
    """The value to keep."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """Where one event of a type with ``results=`` stands (``EventService.results``).

    ``status``: ``"ok"`` (done; ``value`` is the kept result), ``"failed"`` (a dead letter;
    ``error`` is its error), ``"pending"`` (enqueued, scheduled, running, or held by a
    delivery group not done yet) or ``"missing"`` (no such event and no kept result: never
    enqueued, cancelled, purged, or its result expired).
    """

    status: Literal["ok", "failed", "pending", "missing"]
    """One of ``"ok"``, ``"failed"``, ``"pending"``, ``"missing"``."""
    value: Any = None
    """The kept result (``"ok"`` only)."""
    error: str | None = None
    """The dead letter's error, ``"Type: message"`` (``"failed"`` only)."""


def returned_value(returned: object) -> object:
    """What is kept for a handler that returned ``returned`` (not a bare ``False``)."""
    if isinstance(returned, Result):
        return returned.value
    return None if returned is True else returned


def encode_value(value: object, serializer: str, max_bytes: int) -> bytes:
    """The success record of ``value``; ``TypeError``/``ValueError`` when it cannot be
    encoded or is over ``max_bytes``."""
    mark = _MARKS[serializer]
    try:
        data: bytes = _ENCODERS[mark].encode(value)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
        raise TypeError(f"the result cannot be encoded as {serializer}: {exc}") from exc
    if len(data) > max_bytes:
        raise ValueError(f"the result encodes to {len(data)} bytes, over {max_bytes}")
    return b"o" + mark + data


_PARENT_STATUS = {b"c": "cancelled", b"s": "skipped", b"m": "missing", b"v": "vanished"}


def decode_parent(event_type: str, event_id: str, record: bytes) -> Parent:
    """A parent as its child sees it, from the edge's record (``"<ms>:<outcome>"``, see
    ``lua/_deps.lua``; empty while the parent is not done)."""
    if not record:
        return Parent(event_type, event_id, "pending")
    ms, _, outcome = record.partition(b":")
    done_ms = int(ms) if ms.isdigit() else None
    kind = outcome[:1]
    if kind in _PARENT_STATUS:
        return Parent(event_type, event_id, _PARENT_STATUS[kind], done_ms=done_ms)
    if kind == b"f":
        error = outcome[1:].decode("utf-8", "replace")
        return Parent(event_type, event_id, "failed", error=error, done_ms=done_ms)
    value = None
    if len(outcome) > 2:  # "o" + the serializer's mark + the kept value
        try:
            value = decode_outcome(outcome).value
        except (msgspec.DecodeError, ValueError):
            value = None
    return Parent(event_type, event_id, "ok", value, done_ms=done_ms)


def decode_outcome(record: bytes) -> Outcome:
    """The outcome a stored record holds (values come back as plain JSON/MessagePack
    types: a returned Struct or dataclass is read back as a dict)."""
    if record[:1] == b"f":
        return Outcome("failed", error=record[1:].decode("utf-8", "replace"))
    mark, data = record[1:2], record[2:]
    if mark == b"j":
        return Outcome("ok", msgspec.json.decode(data))
    return Outcome("ok", msgspec.msgpack.decode(data))
