"""Batches (docs/WORKFLOWS.md, "Batches"): many events, then one callback when all are done.

The public values: :class:`Batch` (the handle ``async with service.batch(...)`` gives,
and ``current_delivery().batch`` inside a member's or a callback's handler),
:class:`BatchInfo` (``service.batch_info(id)``, ``service.batches()``) and
:class:`BatchMember` (one member's outcome), :class:`BatchCounts`
(``service.batch_counts()``). The engine lives below the facade: the store's part
``storage/batches.py``, the scripts ``lua/batch_*.lua``, the producer's steps
``operations/batches.py``, the reads ``operations/batch_reads.py``, and the relay
(``runtime/relay.py``) with its sweep of the batch shards (``runtime/batch_sweep.py``).

(Over 400 lines: one job, the public face of batches: the values a batch is read as,
each field documented for the API reference and written out by its ``to_dict``, and the
handle whose ``enqueue_*`` mirror the service's.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from .durations import delay_ms, due_unix_ms
from .events import Event, Item, item_due
from .keyspace.shards import BATCH_TYPE as _BATCH_TYPE

__all__ = [
    "BATCH_TYPE",
    "FAILED_LISTED",
    "FAILED_SHOWN",
    "Batch",
    "BatchCounts",
    "BatchInfo",
    "BatchMember",
    "BatchState",
    "MemberStatus",
]

BATCH_TYPE = _BATCH_TYPE
"""The type name a batch goes by where an event type's would be: a callback's parent
(``current_delivery().parents``) and a nested batch among its parent's members. No event
type can have it (type names hold no ``:``)."""

BatchState = Literal["open", "waiting", "done", "stuck"]
"""Where a batch is: ``open`` (its ``async with`` block is adding members), ``waiting``
(closed, members still pending), ``done`` (every member finished; its callbacks were
enqueued), ``stuck`` (open past its lease, or waiting with nothing finished for a long
time, or holding an add not confirmed past its grace: see docs/WORKFLOWS.md)."""

FAILED_SHOWN = 1000
"""The most failed ids a :class:`BatchInfo` read by ``service.batch_info()`` lists (and
``current_delivery().batch.info`` in a callback)."""

FAILED_LISTED = 10
"""The most failed ids each :class:`BatchInfo` of a ``service.batches()`` listing carries:
a listing stays light (``batch_info()`` reads the first :data:`FAILED_SHOWN`)."""

MemberStatus = Literal["pending", "ok", "failed", "cancelled", "skipped", "missing", "vanished"]
"""One member's outcome (as a dependency's parent's, see :class:`delayq.Parent`)."""


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class BatchMember:
    """One member of a batch and its outcome (:meth:`Batch.members`)."""

    event_type: str
    """The member's type (wire name; :data:`BATCH_TYPE` for a nested batch)."""
    id: str
    """The member's id (a nested batch's id)."""
    status: MemberStatus
    """``"pending"`` until it finishes; then ``"ok"`` (handled; for a nested batch: all of
    its members succeeded), ``"failed"`` (a dead letter; a nested batch with a failed
    member), ``"cancelled"``, ``"skipped"``, ``"missing"`` (done before the batch learnt
    of it, with no kept result) or ``"vanished"``."""
    value: Any = None
    """The member's result when its type keeps results (``results=``) and it is ``"ok"``."""
    error: str | None = None
    """Why it failed (``"failed"``: the dead letter's error)."""
    done_ms: int | None = None
    """When it finished, ms on Redis's clock (None while pending)."""

    @property
    def failed(self) -> bool:
        """True for ``"failed"``, ``"cancelled"``, ``"skipped"`` and ``"vanished"``: the
        outcomes that count as failed (``on_success`` then never runs)."""
        return self.status in ("failed", "cancelled", "skipped", "vanished")

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON-able fields (``value`` as the serializer decoded it)."""
        return {
            "type": self.event_type,
            "id": self.id,
            "status": self.status,
            "value": self.value,
            "error": self.error,
            "done_ms": self.done_ms,
        }


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """All that Redis holds about one batch, read in one step (``service.batch_info``)."""

    id: str
    """The batch's id."""
    name: str | None
    """The name given to ``service.batch(name=...)``, if any."""
    state: BatchState
    """Where the batch is (see :data:`BatchState`)."""
    total: int
    """Members added so far."""
    pending: int
    """Members not finished yet."""
    succeeded: int
    """Members that finished ``"ok"`` or ``"missing"``."""
    failed: int
    """Members that failed, were cancelled, skipped or vanished."""
    failed_ids: tuple[tuple[str, str], ...]
    """``(type name, id)`` of the first failed members, in the order they failed: up to
    :data:`~delayq.batches.FAILED_SHOWN` (1,000) from ``service.batch_info()`` and in a
    callback's ``current_delivery().batch.info``, up to
    :data:`~delayq.batches.FAILED_LISTED` (10) in a ``service.batches()`` listing;
    ``failed`` counts all."""
    created_at: datetime
    """When the batch was opened (Redis's clock)."""
    closed_at: datetime | None
    """When its block ended (or its lease ran out and the sweep closed it); None while open."""
    done_at: datetime | None
    """When its last member finished and its callbacks were enqueued; None before."""
    last_done_at: datetime | None
    """When a member last finished (None: none yet)."""
    lease_until: datetime | None
    """While open: when the open lease runs out unless the block renews it."""
    expires_at: datetime | None
    """Once done: when its record is removed (the retention)."""
    on_complete: tuple[str, str] | None
    """``(type name, id)`` of the ``on_complete`` callback, if any."""
    on_success: tuple[str, str] | None
    """``(type name, id)`` of the ``on_success`` callback, if any."""
    parent: str | None
    """The id of the batch this one is a member of (nesting), if any."""
    unconfirmed: int
    """Adds not confirmed yet (their producer is between its steps, or died there: the
    sweep settles them after their grace)."""
    waiting_on: tuple[tuple[str, str], ...] = ()
    """Some of the members it waits for, ``(type name, id)`` (``batch_info(members=...)``
    says how many at most; empty when none are pending or none were asked for)."""
    stuck_reason: str | None = None
    """Why the batch counts as ``stuck`` (None unless it does)."""

    @property
    def ok(self) -> bool:
        """Done with every member succeeded (``on_success`` was enqueued)."""
        return self.state == "done" and self.failed == 0

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON-able fields (times as ISO 8601 UTC)."""
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "total": self.total,
            "pending": self.pending,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "failed_ids": [list(x) for x in self.failed_ids],
            "created_at": _iso(self.created_at),
            "closed_at": _iso(self.closed_at),
            "done_at": _iso(self.done_at),
            "last_done_at": _iso(self.last_done_at),
            "lease_until": _iso(self.lease_until),
            "expires_at": _iso(self.expires_at),
            "on_complete": None if self.on_complete is None else list(self.on_complete),
            "on_success": None if self.on_success is None else list(self.on_success),
            "parent": self.parent,
            "unconfirmed": self.unconfirmed,
            "waiting_on": [list(x) for x in self.waiting_on],
            "stuck_reason": self.stuck_reason,
        }


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """How many batches of the prefix are in each state, counted in Redis
    (``service.batch_counts()``; no batch is read one by one). ``open``, ``waiting`` and
    ``stuck`` do not overlap: together they are the batches not done yet."""

    open: int
    """Open (their ``async with`` block adds members) and not stuck."""
    waiting: int
    """Closed with members pending, and not stuck."""
    stuck: int
    """Open past their lease, waiting with no member finished for ``stuck_after``, or
    holding an add no sweep has settled for twice its grace and a minute (see
    ``service.batch_counts``)."""
    done: int
    """Done and kept (a day after done)."""
    relay_backlog: int
    """The relay's work due in the batch shards and not done: done batches' completions
    not handed to their callbacks (or parent batch) yet, open batches past their lease,
    adds past their grace and audits past their time (the batch sweep's)."""
    relay_lag: float
    """Seconds the oldest of :attr:`relay_backlog` has been due (0 when none)."""
    shards: int
    """Batch shards in use under the prefix (0: it never opened a batch; then nothing
    else was read)."""

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON-able fields."""
        return {
            "open": self.open,
            "waiting": self.waiting,
            "stuck": self.stuck,
            "done": self.done,
            "relay_backlog": self.relay_backlog,
            "relay_lag": self.relay_lag,
            "shards": self.shards,
        }


class BatchOps(Protocol):
    """What a :class:`Batch` handle delegates to (the service's batch engine; internal)."""

    async def add(
        self,
        batch: Batch,
        events: Sequence[tuple[Event, int]],
        absolute: bool,
        context: Mapping[str, str] | None,
        key: str | None,
        timeout: float | timedelta | None,
        priority: int | None,
    ) -> list[bool]:
        """Add ``(event, ms)`` members (``Batch.enqueue_with_delay`` and the others)."""
        ...

    async def add_envelopes(
        self,
        batch: Batch,
        event_type: str,
        items: Sequence[tuple[str, bytes, int]],
        absolute: bool,
        keys: Sequence[str | None] | None,
        timeout: float | timedelta | None,
        priority: int | Sequence[int] | None,
    ) -> list[int]:
        """Add encoded members (``Batch.enqueue_envelopes``)."""
        ...

    async def info(self, batch_id: str, members: int) -> BatchInfo:
        """Read a batch (``Batch.refresh``)."""
        ...

    async def members(self, batch_id: str, status: str | None, limit: int) -> list[BatchMember]:
        """A batch's members (``Batch.members``)."""
        ...


class Batch:
    """A batch as code sees it: what ``async with service.batch(...) as batch`` gives, and
    ``current_delivery().batch`` in a member's handler (to add members to its own batch)
    and in a callback's (with :attr:`info` loaded: the final counts).

    ``enqueue_*`` add members: each takes the options of the service's method of the same
    name that go with a batch (``context``, ``key``, ``timeout``, ``priority``); a member
    already in the batch is not added again, and one already finished is not enqueued
    again (the call returns False for it). See docs/WORKFLOWS.md, "Batches".
    """

    __slots__ = ("_id", "_info", "_member", "_name", "_ops", "_parent")

    def __init__(
        self,
        ops: BatchOps,
        batch_id: str,
        name: str | None = None,
        *,
        parent: str | None = None,
        info: BatchInfo | None = None,
        member: str | None = None,
    ):
        self._ops = ops
        self._id = batch_id
        self._name = name
        self._parent = parent
        self._info = info
        # in a member's handler: its ref "<type> NUL <id>" (it may add to a closed batch)
        self._member = member

    @property
    def id(self) -> str:
        """The batch's id."""
        return self._id

    @property
    def name(self) -> str | None:
        """The batch's name (``service.batch(name=...)``), if any."""
        return self._name

    @property
    def parent(self) -> str | None:
        """The id of the batch this one is nested in, when known here (the producer's
        handle; else read :attr:`BatchInfo.parent`)."""
        return self._parent

    @property
    def member(self) -> tuple[str, str] | None:
        """In a member's handler, ``(type name, id)`` of the member running (a member's
        members and a batch it opens belong to this batch); None elsewhere."""
        if self._member is None:
            return None
        kind, _, member_id = self._member.partition("\0")
        return kind, member_id

    @property
    def info(self) -> BatchInfo | None:
        """In a callback's handler, the batch as it was when done (its counts, failed ids);
        None elsewhere (read it with :meth:`refresh`)."""
        return self._info

    async def refresh(self) -> BatchInfo:
        """Read the batch now (one read; see ``service.batch_info``)."""
        return await self._ops.info(self._id, 20)

    async def members(
        self, *, status: MemberStatus | None = None, limit: int = 1000
    ) -> list[BatchMember]:
        """The batch's members and their outcomes (results included, for member types that
        keep results), at most ``limit``; with ``status`` only those with it."""
        return await self._ops.members(self._id, status, limit)

    async def enqueue_with_delay(
        self,
        event: Event,
        delay: float | timedelta = 0,
        *,
        context: Mapping[str, str] | None = None,
        key: str | None = None,
        timeout: float | timedelta | None = None,
        priority: int | None = None,
    ) -> bool:
        """Add ``event`` to the batch, due after ``delay`` (as
        ``EventService.enqueue_with_delay``); True when it was enqueued."""
        (done,) = await self._ops.add(
            self, [(event, delay_ms(delay))], False, context, key, timeout, priority
        )
        return done

    async def enqueue_at(
        self,
        event: Event,
        when: datetime,
        *,
        context: Mapping[str, str] | None = None,
        key: str | None = None,
        timeout: float | timedelta | None = None,
        priority: int | None = None,
    ) -> bool:
        """Add ``event`` to the batch, due at ``when`` (as ``EventService.enqueue_at``)."""
        (done,) = await self._ops.add(
            self, [(event, due_unix_ms(when))], True, context, key, timeout, priority
        )
        return done

    async def enqueue_many(
        self,
        events: Iterable[Item],
        delay: float | timedelta = 0,
        *,
        context: Mapping[str, str] | None = None,
        key: str | None = None,
        timeout: float | timedelta | None = None,
        priority: int | None = None,
    ) -> list[bool]:
        """Add many events (events due after ``delay``, or ``(event, delay)`` pairs) in one
        add; one result per event, in order (as ``EventService.enqueue_many``)."""
        default = delay_ms(delay)
        items = [item_due(item, default) for item in events]  # as the service's items
        return await self._ops.add(self, items, False, context, key, timeout, priority)

    async def enqueue_envelopes(
        self,
        event_type: str,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool = False,
        keys: Sequence[str | None] | None = None,
        timeout: float | timedelta | None = None,
        priority: int | Sequence[int] | None = None,
    ) -> list[int]:
        """Add events already encoded (as ``EventService.enqueue_envelopes``); codes 1
        added, 0 kept (already a member, or an event with the id exists)."""
        return await self._ops.add_envelopes(
            self, event_type, items, absolute, keys, timeout, priority
        )

    def __repr__(self) -> str:
        return f"Batch(id={self._id!r}, name={self._name!r})"
