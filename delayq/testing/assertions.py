"""What is waiting in the queue: :func:`enqueued`, :func:`assert_enqueued`,
:func:`assert_not_enqueued`. A failed assertion shows what *was* enqueued."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec

from ..durations import delay_seconds
from ..events import Event, find_event_type
from ..service import EventService

__all__ = ["EnqueuedEvent", "assert_enqueued", "assert_not_enqueued", "enqueued"]

_PAGE = 1000
_SHOWN = 20  # events a failed assertion lists


@dataclass(frozen=True, slots=True)
class EnqueuedEvent:
    """An event waiting to be handled, as :func:`enqueued` lists it."""

    id: str
    """The event id."""
    state: str
    """``"scheduled"`` (waiting for its due time or a retry) or ``"ready"`` (due)."""
    due_at: datetime | None
    """When it is due (UTC, the service's clock); None for a ready event (due already)."""
    due_in: timedelta
    """How long until it is due, from the service's clock (0 for a ready event)."""
    attempts: int
    """Deliveries so far (more than 0: waiting for a retry)."""
    payload: Any
    """The payload as JSON-able data (the event's fields but ``id``)."""
    event: Event | None = None
    """The decoded event, when its class is known."""
    context: Mapping[str, str] = field(default_factory=dict)
    """The context given at enqueue time."""

    def __str__(self) -> str:
        when = "ready" if self.due_at is None else f"due in {_span(self.due_in)}"
        retry = f", attempt {self.attempts + 1}" if self.attempts else ""
        return f"id={self.id!r} {when}{retry} payload={self.payload!r}"


async def enqueued(
    service: EventService, event_type: type[Event] | str, *, group: str | None = None
) -> list[EnqueuedEvent]:
    """The events of ``event_type`` waiting to be handled: ready ones first (in the order
    consumers get them), then scheduled ones by due time. ``group``: a delivery group's
    ready events and retries (default: the type's own, and its default group's)."""
    name = event_type if isinstance(event_type, str) else event_type.event_name
    now = await service.store.browsing.server_time_ms()
    found: list[EnqueuedEvent] = []
    offset = 0
    while True:
        ready = await service.ready(name, _PAGE, offset, group=group)
        for r in ready:
            payload = r.payload
            found.append(
                EnqueuedEvent(
                    r.id,
                    "ready",
                    None,
                    timedelta(0),
                    r.attempts,
                    payload,
                    _event(name, payload),
                    r.context,
                )
            )
        if len(ready) < _PAGE:
            break
        offset += _PAGE
    offset = 0
    while True:
        scheduled = await service.scheduled(name, _PAGE, offset, group=group)
        for s in scheduled:
            due_ms = round(s.due_at.timestamp() * 1000)
            found.append(
                EnqueuedEvent(
                    s.id,
                    "scheduled",
                    s.due_at,
                    timedelta(milliseconds=max(0, due_ms - now)),
                    s.attempts,
                    s.payload,
                    s.event,
                    s.context,
                )
            )
        if len(scheduled) < _PAGE:
            break
        offset += _PAGE
    return found


async def assert_enqueued(
    service: EventService,
    event_type: type[Event] | str,
    id: str | None = None,
    payload: Mapping[str, Any] | Event | None = None,
    due_in: timedelta | float | None = None,
    tolerance: timedelta | float = timedelta(seconds=1),
    *,
    group: str | None = None,
) -> EnqueuedEvent:
    """Assert that an event of ``event_type`` waits, matching every criterion given; return it.

    ``payload``: a mapping whose items the payload must hold (other fields may differ), or
    an event that must equal the decoded one; ``due_in``: due that long from the service's
    clock, give or take ``tolerance``. The ``AssertionError`` lists what is enqueued.
    """
    found = await enqueued(service, event_type, group=group)
    matches = [e for e in found if _matches(e, id, payload, due_in, tolerance)]
    if not matches:
        raise AssertionError(
            f"expected {_name(event_type)} {_criteria(id, payload, due_in, tolerance)} "
            f"to be enqueued; {_listing(event_type, found)}"
        )
    return matches[0]


async def assert_not_enqueued(
    service: EventService,
    event_type: type[Event] | str,
    id: str | None = None,
    payload: Mapping[str, Any] | Event | None = None,
    due_in: timedelta | float | None = None,
    tolerance: timedelta | float = timedelta(seconds=1),
    *,
    group: str | None = None,
) -> None:
    """Assert that no event of ``event_type`` matching every criterion given waits (see
    :func:`assert_enqueued`); the ``AssertionError`` lists those that match."""
    found = await enqueued(service, event_type, group=group)
    matches = [e for e in found if _matches(e, id, payload, due_in, tolerance)]
    if matches:
        raise AssertionError(
            f"expected no {_name(event_type)} {_criteria(id, payload, due_in, tolerance)} "
            f"to be enqueued; {_listing(event_type, matches)}"
        )


def _matches(
    e: EnqueuedEvent,
    id: str | None,
    payload: Mapping[str, Any] | Event | None,
    due_in: timedelta | float | None,
    tolerance: timedelta | float,
) -> bool:
    if id is not None and e.id != id:
        return False
    if isinstance(payload, Event):
        if e.event != payload:
            return False
    elif payload is not None:
        if not isinstance(e.payload, Mapping):
            return False
        if any(k not in e.payload or e.payload[k] != v for k, v in payload.items()):
            return False
    if due_in is not None:
        wanted = delay_seconds(due_in, "due_in")
        slack = delay_seconds(tolerance, "tolerance")
        if abs(e.due_in.total_seconds() - wanted) > slack:
            return False
    return True


def _event(name: str, payload: Any) -> Event | None:
    """A ready event decoded with its class, when one of that name is defined here."""
    cls = find_event_type(name)
    if cls is None:
        return None
    try:
        return msgspec.convert(payload, cls, strict=False)
    except (msgspec.ValidationError, TypeError):  # no longer fits the class: payload shown
        return None


def _name(event_type: type[Event] | str) -> str:
    return event_type if isinstance(event_type, str) else event_type.__name__


def _criteria(
    id: str | None,
    payload: Mapping[str, Any] | Event | None,
    due_in: timedelta | float | None,
    tolerance: timedelta | float,
) -> str:
    parts = []
    if id is not None:
        parts.append(f"id={id!r}")
    if payload is not None:
        parts.append(f"payload={payload!r}")
    if due_in is not None:
        wanted = timedelta(seconds=delay_seconds(due_in, "due_in"))
        slack = timedelta(seconds=delay_seconds(tolerance, "tolerance"))
        parts.append(f"due in {_span(wanted)} ± {_span(slack)}")
    return ("with " + ", ".join(parts)) if parts else "(any)"


def _listing(event_type: type[Event] | str, events: list[EnqueuedEvent]) -> str:
    if not events:
        return f"no {_name(event_type)} events are enqueued"
    lines = [f"  {e}" for e in events[:_SHOWN]]
    if len(events) > _SHOWN:
        lines.append(f"  ... and {len(events) - _SHOWN} more")
    return f"{_name(event_type)} events enqueued:\n" + "\n".join(lines)


def _span(value: timedelta) -> str:
    return str(value - timedelta(microseconds=value.microseconds % 1000))
