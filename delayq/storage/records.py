"""What the store's reads return: the record types, and parsing of script replies into them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import IntEnum
from typing import Any

__all__ = [
    "Claimed",
    "DeadRecord",
    "EventRecord",
    "GroupEventRecord",
    "MoveResult",
    "QueueCounts",
    "ReadyRecord",
    "ScheduledRecord",
    "Throttle",
    "sum_counts",
]


class Enqueued(IntEnum):
    """What ``enqueue.lua`` (and ``sink_enqueue.lua``) answer for each event: an int on the
    wire, compared with these names."""

    KEPT = 0
    """An event with that id exists (or unique_for refused it): nothing was written."""
    ADDED = 1
    """Stored (or this very call was retried after a lost reply)."""
    REPLACED = 2
    """The event with that id was replaced."""
    FANNED_OUT = 3
    """Not written: a replace of an event already fanned out to delivery groups (the store
    then runs ``group_replace.lua``, which answers ADDED or REPLACED)."""
    IN_LEDGER = 4
    """Not written: a streaming sink's ledger holds the id for this batch already."""


@dataclass(frozen=True, slots=True)
class Claimed:
    """An event a consumer claimed: it holds the lease until ack, fail or expiry."""

    raw_id: bytes
    envelope: bytes
    attempt: int
    due_ms: int | None
    token: bytes

    @property
    def id(self) -> str:
        """The event id as text."""
        return self.raw_id.decode("utf-8", "replace")


def token_flow_key(token: bytes) -> str | None:
    """The flow key of a claim token: a keyed delivery's token is ``<n>|<key>``
    (``lua/claim.lua``), a plain one ``<n>``."""
    bar = token.find(b"|")
    return (token[bar + 1 :].decode("utf-8", "replace") or None) if bar >= 0 else None


@dataclass(frozen=True, slots=True)
class Throttle:
    """How a claim was held back by flow limits (see ``lua/claim.lua``)."""

    wait_ms: int
    """How long to wait before claiming again (0..1000)."""
    reason: str
    """``paused``, ``concurrency`` or ``rate``: the last limit that held back."""
    live: int
    """Live leases of the group across the fleet (0 without a concurrency limit)."""
    limit: int
    """The fleet-wide concurrency limit, -1 when none is set."""


@dataclass(frozen=True, slots=True)
class MoveResult:
    """What one ``move_due`` call did for one type."""

    moved: int
    more: bool
    next_ms: int | None
    now_ms: int
    dead: int
    queued: int
    late_ms: int
    missing: list[bytes]
    dead_groups: dict[str, int] = field(default_factory=dict)
    """For a type with delivery groups: how many of ``dead`` each group made (by name)."""


@dataclass(frozen=True, slots=True)
class DeadRecord:
    """A dead letter as stored."""

    raw_id: bytes
    failed_at_ms: int
    envelope: bytes | None
    attempts: int
    error: str


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """How many events of one type are in each state, and how far behind its consumers are.

    Equality compares the four state counts only (the other fields change with time).
    """

    scheduled: int
    """Waiting for their due time (including retries waiting for their backoff)."""
    ready: int
    """Due and queued for a consumer, not claimed yet."""
    in_flight: int
    """Claimed by a consumer: a handler is running (or its process died and the lease runs)."""
    dead: int
    """Dead letters."""
    next_due_at: datetime | None = field(default=None, compare=False)
    """The earliest due time among scheduled events (UTC, Redis's clock); None when none."""
    backlog_age: float = field(default=0.0, compare=False)
    """Seconds the oldest due event that no consumer has claimed yet has been waiting past
    its due time (the head of the ready list, or a scheduled event the scheduler has not
    moved yet); 0 when nothing due is waiting."""
    due: int = field(default=0, compare=False)
    """Due events that no consumer has claimed yet: ``ready`` plus scheduled events whose
    due time has passed."""
    paused: bool = field(default=False, compare=False)
    """True while the type (its default group) is paused (``EventService.pause``)."""
    results_kept: int = field(default=0, compare=False)
    """Outcomes of done events kept and not expired (types with ``results=``; else 0)."""
    ready_by_priority: dict[int, int] = field(default_factory=dict, compare=False)
    """``ready`` per priority level (0 most urgent .. 9), levels with events only; empty
    while no ready event is above level 0 (then all of ``ready`` is level 0)."""
    waiting: int = field(default=0, compare=False)
    """Events waiting for their parents (``after=[...]``; docs/WORKFLOWS.md)."""
    relay_backlog: int = field(default=0, compare=False)
    """The dependency relay's work due in the type's slots and not done: completions of
    its events not yet handed to every child, audits of its waiting children past their
    time (docs/WORKFLOWS.md, "Dependencies"); 0 for a type without dependencies."""
    relay_lag: float = field(default=0.0, compare=False)
    """Seconds the oldest of :attr:`relay_backlog` has been due (0 when none)."""


@dataclass(frozen=True, slots=True)
class GroupEventRecord:
    """What one delivery group holds of an event (all None/0: nothing)."""

    retry_ms: int | None
    queued_score: float | None
    lease_deadline_ms: int | None
    dead_at_ms: int | None
    attempts: int
    error: str | None


@dataclass(frozen=True, slots=True)
class EventRecord:
    """Everything Redis holds about one event id, read at one instant (``now_ms``).

    For a type without named delivery groups the fields after ``scheduled_ms``
    are the type's own (``groups`` is None); with groups, ``scheduled_ms`` is
    its due time in the type's schedule (not fanned out yet), ``pending`` how
    many groups hold it, and ``groups`` what each registered group holds (the
    other fields stay empty).
    """

    now_ms: int
    envelope: bytes | None
    scheduled_ms: int | None
    queued_score: float | None
    lease_deadline_ms: int | None
    dead_at_ms: int | None
    attempts: int
    error: str | None
    groups: dict[str, GroupEventRecord] | None = None
    pending: int = 0
    priority: int = 0
    """The event's priority level (0, the most urgent, when it has none stored)."""
    waiting_ms: int | None = None
    """Its own due time while it waits for parents (``after=[...]``), else None."""


@dataclass(frozen=True, slots=True)
class ScheduledRecord:
    """A scheduled event as stored."""

    raw_id: bytes
    due_ms: int
    envelope: bytes | None
    attempts: int
    error: str | None


@dataclass(frozen=True, slots=True)
class ReadyRecord:
    """A ready event as stored: ``score`` > 0 is its push sequence number, < 0 marks an
    entry popped but not claimed."""

    raw_id: bytes
    score: float
    envelope: bytes | None
    attempts: int
    error: str | None


def _int(value: Any) -> int:
    return int(value) if value not in (None, False, b"") else 0


def _opt_int(value: Any) -> int | None:
    return int(float(value)) if value not in (None, False, b"") else None


def _text(value: Any) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) and value else None


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def _counts(r: Sequence[Any]) -> QueueCounts:
    scheduled, ready, in_flight, dead = (int(x) for x in r[:4])
    next_due, overdue, head, now = int(r[4]), int(r[5]), r[6], int(r[7])
    oldest: int | None = None
    if overdue and next_due >= 0:
        oldest = next_due
    if ready and head:
        due_text = head.split(b":", 1)[0]
        if due_text.isdigit():
            oldest = int(due_text) if oldest is None else min(oldest, int(due_text))
    return QueueCounts(
        scheduled=scheduled,
        ready=ready,
        in_flight=in_flight,
        dead=dead,
        next_due_at=_utc(next_due) if next_due >= 0 else None,
        backlog_age=max(0, now - oldest) / 1000 if oldest is not None else 0.0,
        due=ready + overdue,
        paused=len(r) > 8 and int(r[8]) == 1,
        results_kept=int(r[9]) if len(r) > 9 else 0,
        ready_by_priority={n: int(c) for n, c in enumerate(r[10]) if int(c)} if len(r) > 10 else {},
        waiting=int(r[11]) if len(r) > 11 else 0,
        relay_backlog=int(r[12]) if len(r) > 12 else 0,
        relay_lag=int(r[13]) / 1000 if len(r) > 13 else 0.0,
    )


def sum_counts(parts: Sequence[QueueCounts]) -> QueueCounts:
    """One type's counts from its shards' (a single shard's are returned as they are)."""
    if len(parts) == 1:
        return parts[0]
    dues = [p.next_due_at for p in parts if p.next_due_at is not None]
    return QueueCounts(
        scheduled=sum(p.scheduled for p in parts),
        ready=sum(p.ready for p in parts),
        in_flight=sum(p.in_flight for p in parts),
        dead=sum(p.dead for p in parts),
        next_due_at=min(dues) if dues else None,
        backlog_age=max(p.backlog_age for p in parts),
        due=sum(p.due for p in parts),
        results_kept=sum(p.results_kept for p in parts),
        waiting=sum(p.waiting for p in parts),
        relay_backlog=sum(p.relay_backlog for p in parts),
        relay_lag=max(p.relay_lag for p in parts),
        paused=any(p.paused for p in parts),  # pause() writes every partition
        ready_by_priority=_sum_levels(parts),
    )


def _sum_levels(parts: Sequence[QueueCounts]) -> dict[int, int]:
    """The shards' ready counts per priority level, summed (a shard without levels has
    all of its ``ready`` at level 0)."""
    if not any(p.ready_by_priority for p in parts):
        return {}
    total: dict[int, int] = {}
    for p in parts:
        for level, n in (p.ready_by_priority or {0: p.ready}).items():
            total[level] = total.get(level, 0) + n
    return {level: n for level, n in sorted(total.items()) if n}
