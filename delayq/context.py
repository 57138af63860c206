"""What a running handler can learn about the event it handles."""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["Delivery", "current_delivery", "event_context"]

_EMPTY: Mapping[str, str] = MappingProxyType({})


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
    """The context given at enqueue time."""
    group: str = "default"
    """The delivery group this delivery is for (see ``add_handler(group=...)``)."""

    @property
    def lateness_ms(self) -> float | None:
        """How long after its due time the event was claimed, in ms (Redis's clock)."""
        if self.due_ms is None:
            return None
        return self.claimed_us / 1000 - self.due_ms


_current: ContextVar[Delivery | None] = ContextVar("delayq_delivery", default=None)


def event_context() -> Mapping[str, str]:
    """The context mapping given at enqueue time, inside a handler; empty outside one."""
    delivery = _current.get()
    return _EMPTY if delivery is None else delivery.context


def current_delivery() -> Delivery | None:
    """The :class:`Delivery` being handled by the current task, or None outside a handler."""
    return _current.get()


def _set_delivery(delivery: Delivery) -> None:
    _current.set(delivery)
