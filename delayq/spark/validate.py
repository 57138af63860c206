"""The validation pass of :func:`~delayq.spark.enqueue_dataframe`, on the executors:
prepared rows to encoded ``(id, envelope, ms)`` items, or rejects with their reason."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import msgspec

from ..codec import Codec, Serializer
from ..events import Event

__all__ = ["Checked", "EnqueueJob", "Mode", "Row", "Validator", "validate_partition"]

log = logging.getLogger("delayq.spark")


class Row(msgspec.Struct):
    """One prepared input row as the JVM serializes it (``DataFrame.toJSON``)."""

    p: msgspec.Raw = msgspec.Raw(b"{}")  # the event's fields, as a JSON object
    i: str | None = None  # the event id
    # due time (µs since the epoch) or delay (s); a delay may be "NaN", "Infinity" or
    # "-Infinity", as the JVM writes those doubles
    t: int | float | str | None = None
    b: str | None = None  # the time column's value as text, when it does not convert
    c: dict[str, str | None] | None = None  # context
    q: Any = None  # the priority column's value (any JSON: checked by the validation pass)
    r: msgspec.Raw = msgspec.Raw(b"")  # the row's columns that are not in ``p``


Mode = Literal["at", "delay", "now"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)
# the due times a datetime can hold (years 1 to 9999), in µs since the epoch
_MIN_US = (datetime.min.replace(tzinfo=timezone.utc) - _EPOCH) // _US
_MAX_US = (datetime.max.replace(tzinfo=timezone.utc) - _EPOCH) // _US
_SHOWN = 100  # characters of a bad value shown in a reason


@dataclass(frozen=True)
class EnqueueJob:
    """Everything an executor needs to validate and write rows (pickled into tasks)."""

    redis_url: str
    cluster: bool
    prefix: str
    event_type: type[Event]
    mode: Mode
    replace: bool
    batch_size: int
    serializer: Serializer
    max_payload_bytes: int
    id_col: str
    time_col: str | None
    nullable_required: tuple[str, ...]
    # every column of the input, in order, with where a reject's row JSON finds it:
    # its name inside ``p`` when it fills a field, "" for the time column (``t``),
    # None for the others (``r``)
    row_columns: tuple[tuple[str, str | None], ...]
    # a streaming sink's name and micro-batch: rows go through the sink's ledger
    # (sink_enqueue.lua), once per (sink, batch, id)
    sink: str | None = None
    batch_id: int = 0
    # the column of each row's priority level (None: the class's priority= for all)
    priority_col: str | None = None

    @property
    def type_name(self) -> str:
        """The event type's wire name."""
        return self.event_type.event_name

    @property
    def width(self) -> int:
        """Values per valid row in a batch: ``id, envelope, ms``, and the priority level
        when rows may be above level 0 (a priority column, or a class default above 0)."""
        levelled = self.priority_col is not None or self.event_type.event_priority > 0
        return 4 if levelled else 3


class Validator:
    """Turns prepared rows into ``(id, envelope, ms)`` items (with the priority level
    after them when :attr:`EnqueueJob.width` says so), or a reject reason."""

    def __init__(self, job: EnqueueJob):
        self.job = job
        self.rows = msgspec.json.Decoder(Row)
        self.payload = msgspec.json.Decoder(job.event_type)
        self.codec = Codec(job.serializer, job.max_payload_bytes)

    def _decode_payload(self, raw: msgspec.Raw) -> Event:
        if not self.job.nullable_required:
            event: Event = self.payload.decode(raw)
            return event
        # Spark leaves null fields out of its JSON; a required field that may be
        # None must still arrive as an explicit null.
        obj = msgspec.json.decode(raw)
        if isinstance(obj, dict):
            for name in self.job.nullable_required:
                obj.setdefault(name, None)
        event = self.payload.decode(msgspec.json.encode(obj))
        return event

    def item(self, row: Row) -> tuple[tuple[Any, ...] | None, str | None]:
        """``(item, None)`` for a valid row, ``(None, reason)`` for a reject."""
        job = self.job
        level = job.event_type.event_priority
        if job.priority_col is not None and row.q is not None:
            q = row.q
            if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q <= 9:
                shown = repr(q)
                shown = shown if len(shown) <= _SHOWN else shown[:_SHOWN] + "..."
                return None, (
                    f"priority column {job.priority_col!r}: {shown} is not a priority level "
                    "(an int from 0, the most urgent, to 9)"
                )
            level = q
        if row.i is None:
            return None, f"id column {job.id_col!r} is null"
        if not row.i:
            return None, f"id column {job.id_col!r} is empty (event ids must not be empty)"
        if job.mode == "now":
            ms = 0
        elif row.t is None:
            return None, self._unreadable_time(row.b)
        elif job.mode == "at":
            us = int(row.t)
            if not _MIN_US <= us <= _MAX_US:
                return None, f"due column {job.time_col!r} is outside the years 1 to 9999"
            ms = -(-us // 1000)  # µs -> ms, rounded up like enqueue_at
        else:
            delay = float(row.t)
            if not math.isfinite(delay) or delay < 0:
                return None, (
                    f"delay column {job.time_col!r} must be a finite number of seconds >= 0, "
                    f"not {delay!r}"
                )
            ms = math.ceil(delay * 1000)
        try:
            event = self._decode_payload(row.p)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return None, f"invalid {job.type_name}: {exc}"
        context = None
        if row.c:
            context = {k: v for k, v in row.c.items() if v is not None} or None
        try:
            envelope = self.codec.encode(event, context)
        except (TypeError, ValueError) as exc:
            return None, str(exc)
        if job.width == 4:
            return (event.id, envelope, ms, level), None
        return (event.id, envelope, ms), None

    def _unreadable_time(self, text: str | None) -> str:
        """The reason for a null ``t``: the column is null, or ``text`` does not convert."""
        what = "due" if self.job.mode == "at" else "delay"
        column = f"{what} column {self.job.time_col!r}"
        if text is None:
            return f"{column} is null"
        shown = text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
        wanted = "a timestamp" if what == "due" else "a number of seconds"
        return f"{column}: {shown!r} is not {wanted}"

    def row_json(self, row: Row) -> str | None:
        """The input row of a reject as a JSON object (columns in their order)."""
        try:
            fields = msgspec.json.decode(row.p) if len(row.p) else {}
            rest = msgspec.json.decode(row.r) if len(row.r) else {}
            out = {}
            for column, inner in self.job.row_columns:
                if inner == "":
                    out[column] = row.b if row.b is not None else self._time_value(row.t)
                elif inner is None:
                    out[column] = rest.get(column)
                else:
                    out[column] = fields.get(inner)
            return msgspec.json.encode(out).decode("utf-8")
        except (msgspec.DecodeError, AttributeError, TypeError):
            return None

    def _time_value(self, t: float | str | None) -> Any:
        if t is None or self.job.mode != "at":
            return t  # a delay in seconds (or nothing)
        if not _MIN_US <= int(t) <= _MAX_US:
            return t  # no datetime holds it: the µs as they are
        return _EPOCH + int(t) * _US

    def parse(self, line: str) -> Row | None:
        """Decode one prepared row (None if the JVM's JSON is unreadable, which it never is)."""
        try:
            return self.rows.decode(line)
        except (msgspec.ValidationError, msgspec.DecodeError):
            log.exception("unreadable prepared row %.200r", line)
            return None


# What the validation pass keeps: (True, None, [id, envelope, ms, id, ...], n) for a
# batch of n valid rows (one round trip of the write pass; with EnqueueJob.width 4 each
# row's priority level after its ms), or (False, id, reason, row_json) for a reject.
Checked = tuple[bool, "str | None", Any, Any]


def validate_partition(
    job: EnqueueJob, seen: Any, bad: Any, lines: Iterable[str]
) -> Iterator[Checked]:
    """Validation pass over one partition: every row becomes an item or a reject.

    ``seen`` and ``bad`` are accumulators of the rows and the rejects.
    """
    validator = Validator(job)
    n = rejected = 0
    width = job.width
    limit = width * job.batch_size
    batch: list[Any] = []
    for line in lines:
        n += 1
        row = validator.parse(line)
        if row is None:
            rejected += 1
            yield False, None, "unreadable row", line
            continue
        item, reason = validator.item(row)
        if item is not None:
            batch += item
            if len(batch) >= limit:
                yield True, None, batch, len(batch) // width
                batch = []
        else:
            rejected += 1
            yield False, row.i, reason, validator.row_json(row)
    if batch:
        yield True, None, batch, len(batch) // width
    seen.add(n)
    bad.add(rejected)
