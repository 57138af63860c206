"""What a running handler can learn about the event it handles."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from datetime import datetime
from datetime import timezone as _timezone
from types import MappingProxyType
from typing import Any

from .batches import Batch

_UTC = _timezone.utc

__all__ = ["PROPAGATION_KEYS", "Delivery", "Parent", "current_delivery", "event_context"]

_EMPTY: Mapping[str, str] = MappingProxyType({})

PROPAGATION_KEYS: frozenset[str] = frozenset({"traceparent", "tracestate", "baggage"})
"""Context keys that carry trace propagation (W3C Trace Context and Baggage).

Tracing (:mod:`delayq.otel`) writes them at enqueue; :func:`event_context`
leaves them out unless asked.
"""
# a recurring schedule's fires carry its name and slot (see delayq.schedules.spec)
_SCHEDULE_KEY, _SLOT_KEY = "delayq-schedule", "delayq-slot"
# one event's handler timeout in ms (``enqueue_*(..., timeout=...)``), only when given
TIMEOUT_KEY = "delayq-timeout"
# an event enqueued with after=[...]: its consumer reads its parents before the handler runs
AFTER_KEY = "delayq-after"
# with tracing on, a child's parents' creation contexts (W3C traceparents, space-separated,
# "-" for a parent without one): its process span links to them (docs/OBSERVABILITY.md)
PARENT_SPANS_KEY = "delayq-parent-spans"
# a batch's member: its batch's id (and name, when it has one); its consumer offers
# ``current_delivery().batch`` (docs/WORKFLOWS.md, "Batches")
BATCH_KEY, BATCH_NAME_KEY = "delayq-batch", "delayq-batch-name"
_hidden: frozenset[str] = PROPAGATION_KEYS | {
    _SCHEDULE_KEY,
    _SLOT_KEY,
    TIMEOUT_KEY,
    AFTER_KEY,
    PARENT_SPANS_KEY,
    BATCH_KEY,
    BATCH_NAME_KEY,
}


@dataclass(frozen=True, slots=True)
class Parent:
    """One parent of an event enqueued with ``after=[...]``, as its child's handler sees it
    (``current_delivery().parents``; docs/WORKFLOWS.md, "Dependencies")."""

    event_type: str
    """The parent's type (wire name)."""
    id: str
    """The parent's id."""
    status: str
    """``"ok"`` (done), ``"failed"`` (a dead letter), ``"cancelled"``, ``"skipped"`` (its
    own parents failed and its policy was ``"skip"``), ``"missing"`` (no such event when
    the child was enqueued: done earlier without a kept result, or never enqueued),
    ``"vanished"`` (it left Redis without a completion while the child waited: its last
    delivery group removed, its type repartitioned, or deleted by hand; found by the
    child's audit), or ``"pending"`` (not done yet: seen only by ``inspect``)."""
    value: Any = None
    """The parent's result, when its type keeps results (``results=``) and it is ``"ok"``."""
    error: str | None = None
    """Why it failed (``"failed"``: the dead letter's error)."""
    done_ms: int | None = None
    """When it was done, ms on Redis's clock (None while pending)."""

    @property
    def failed(self) -> bool:
        """True for ``"failed"``, ``"cancelled"``, ``"skipped"`` and ``"vanished"``: what
        ``on_parent_failure`` acts on."""
        return self.status in ("failed", "cancelled", "skipped", "vanished")


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of an event to a handler."""

    event_type: str
    """The event type's wire name."""
    id: str
    """The event id."""
    attempt: int
    """1 for the first delivery, 2 for the first retry, and so on."""
    due_ms: int | None
    """When the event became due, in ms since the epoch by Redis's clock."""
    claimed_us: int
    """When this process claimed it, in µs since the epoch by Redis's clock."""
    context: Mapping[str, str]
    """The context given at enqueue time, propagation keys included (see :func:`event_context`)."""
    group: str = "default"
    """The delivery group this delivery is for (see ``add_handler(group=...)``)."""
    enqueued_ms: int | None = None
    """When it was enqueued (or last replaced), in ms since the epoch by the producer's clock."""
    envelope: bytes = field(default=b"", repr=False, compare=False)
    """The stored envelope (never changes after enqueue; ``version`` is derived from it)."""
    flow_key: str | None = None
    """The event's flow key (``enqueue_*(..., key=...)``; docs/FLOW.md), or None: none."""

    @property
    def parents(self) -> tuple[Parent, ...]:
        """The event's parents and their outcomes, in the order of its ``after=[...]`` (empty
        for an event enqueued without ``after=``; docs/WORKFLOWS.md, "Dependencies")."""
        return ()

    @property
    def batch(self) -> Batch | None:
        """The batch the event is a member of (add members to it with its ``enqueue_*``),
        or, in an ``on_complete``/``on_success`` callback's handler, the batch it was
        enqueued for, with :attr:`Batch.info` loaded (docs/WORKFLOWS.md, "Batches"); None
        for other events."""
        return None

    @property
    def version(self) -> str:
        """Which version of the event this is: 32 hex digits, the same on every redelivery.

        It is a digest of the stored envelope (payload, context and enqueue time),
        so an event enqueued again after it was handled, or replaced, is a new
        version, while retries and redeliveries of one enqueue share it.
        """
        return hashlib.blake2b(self.envelope, digest_size=16).hexdigest()

    @property
    def idempotency_key(self) -> str:
        """A stable key for this version of this event: ``"dq-"`` and 40 hex digits.

        The same on every redelivery of one enqueue, different for another event
        or another version of it. Pass it to external APIs that take idempotency
        keys (Stripe's ``Idempotency-Key`` header, say) so a handler that runs
        twice charges once.
        """
        digest = hashlib.blake2b(digest_size=20)
        for part in (self.event_type.encode(), self.id.encode("utf-8", "surrogatepass")):
            digest.update(len(part).to_bytes(4, "big"))
            digest.update(part)
        digest.update(self.envelope)
        return "dq-" + digest.hexdigest()

    @property
    def schedule(self) -> str | None:
        """The name of the recurring schedule that fired this event (None: not a fire)."""
        return self.context.get(_SCHEDULE_KEY)

    @property
    def slot(self) -> datetime | None:
        """The nominal time (UTC) of the schedule's slot this event was fired for; for a
        manual trigger the time of the trigger. None for events not fired by a schedule."""
        raw = self.context.get(_SLOT_KEY)
        if raw is None or not raw.isdigit():
            return None
        return datetime.fromtimestamp(int(raw) / 1000, _UTC)

    async def progress(self, value: Any, note: str | None = None) -> None:
        """Report how far the handler got: ``value`` a number (say 0 to 100) or small
        JSON-able data, ``note`` an optional short text.

        Stored with the run (``inspect``, ``delayq inspect`` and the dashboard show it)
        at most once a second: a call in a tight loop costs no Redis call, and the last
        value is written. Raises ``TypeError``/``ValueError`` for a value that is not
        small JSON-able data, ``RuntimeError`` outside the handler's run.
        """
        sink = _progress_sink.get()
        if sink is None:
            raise RuntimeError("progress() is for the delivery a handler is running")
        sink(self, value, note)

    @property
    def lateness_ms(self) -> float | None:
        """How long after its due time the event was claimed, in ms (Redis's clock)."""
        if self.due_ms is None:
            return None
        return self.claimed_us / 1000 - self.due_ms


_current: ContextVar[Delivery | None] = ContextVar("delayq_delivery", default=None)
# the running consumer's progress reporter (set once per consumer run, inherited by its tasks)
_progress_sink: ContextVar[Callable[[Delivery, Any, str | None], None] | None] = ContextVar(
    "delayq_progress", default=None
)


def event_context(*, propagation: bool = False) -> Mapping[str, str]:
    """The context mapping given at enqueue time, inside a handler; empty outside one.

    Trace propagation keys (``traceparent``, ``tracestate``, ``baggage`` and
    any other the configured propagator writes) are left out unless
    ``propagation=True``.
    """
    delivery = _current.get()
    if delivery is None:
        return _EMPTY
    context = delivery.context
    if propagation or _hidden.isdisjoint(context):
        return context
    return MappingProxyType({k: v for k, v in context.items() if k not in _hidden})


def hide_context_keys(keys: frozenset[str] | set[str]) -> None:
    """Also leave ``keys`` out of :func:`event_context` (a propagator's own fields)."""
    global _hidden
    _hidden = _hidden | frozenset(keys)


def current_delivery() -> Delivery | None:
    """The :class:`Delivery` being handled by the current task, or None outside a handler."""
    return _current.get()


# the consumer sets it once per delivery: the ContextVar's own method, no wrapper call
_set_delivery = _current.set


@dataclass(frozen=True, slots=True)
class _ChildDelivery(Delivery):
    """A delivery of an event enqueued with ``after=[...]``: it carries its parents (a
    subclass, so a plain delivery builds and stores no field for them)."""

    known_parents: tuple[Parent, ...] = ()
    known_batch: Batch | None = None

    @property
    def parents(self) -> tuple[Parent, ...]:
        """See :attr:`Delivery.parents`."""
        return self.known_parents

    @property
    def batch(self) -> Batch | None:
        """See :attr:`Delivery.batch`."""
        return self.known_batch


def with_parents(
    delivery: Delivery, parents: tuple[Parent, ...], batch: Batch | None = None
) -> Delivery:
    """``delivery`` with its event's parents and its batch (the consumer's step for a child
    event or a batch's member)."""
    known: dict[str, Any] = {f.name: getattr(delivery, f.name) for f in fields(Delivery)}
    return _ChildDelivery(**known, known_parents=parents, known_batch=batch)
