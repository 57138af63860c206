"""What :func:`delayq.testing.drain` reports: every handler run of a service, as it ended.

:class:`Recorder` is a tracing hook (``EventService(..., tracing=Recorder())``, as
:func:`delayq.testing.isolated_service` and the ``delayq_service`` fixture build their
services): the consumers call it around each handler run, with the exception the handler
raised, at no cost to services built without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..context import Delivery
from ..observer import Tracing

__all__ = ["Delivered", "Recorder"]


@dataclass(frozen=True, slots=True)
class Delivered:
    """One handler run, as :func:`delayq.testing.drain` returns it."""

    type: str
    """The event type's wire name (``MyEvent.event_name``)."""
    id: str
    """The event id."""
    attempt: int
    """1 for the first delivery, 2 for the first retry, and so on."""
    outcome: str
    """``"success"``; after a failure ``"retry"`` (a retry is scheduled) or ``"dead"`` (it
    became a dead letter); ``"cancelled"`` when the run was stopped: the service stopped
    during it, its event was cancelled (``cancel``) or its lease was lost."""
    result: Any = None
    """The value a successful run kept, for a type with ``results=`` (``drain`` reads it
    with ``service.results()``); None otherwise."""
    group: str = "default"
    """The delivery group of the handler."""
    error: str | None = None
    """The failure as the event's last error shows it (``"ValueError: ..."``), or None."""
    at: datetime | None = None
    """When the handler started, on the service's clock (``advance`` included)."""
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    """The exception the handler raised, if any (``drain(raise_errors=True)`` raises it)."""


class Recorder:
    """A tracing hook that keeps every handler run of a service as a :class:`Delivered`.

    ``inner``: another tracing (OpenTelemetry's, say) that sees every call as before.
    """

    def __init__(self, inner: Tracing | None = None):
        self.inner = inner
        self.deliveries: list[Delivered] = []
        """Every run so far, in the order the runs ended."""
        self.drained = 0
        """How many of :attr:`deliveries` an earlier ``drain`` returned (or passed over)."""
        self.max_deliveries: Callable[[str, str], int | None] = lambda type_name, group: None
        """(type, group) -> its consumer's deliveries before a dead letter (set by the kit)."""

    def sending(
        self,
        type_names: Sequence[str],
        event_id: str | None,
        count: int,
        context: Mapping[str, str] | None,
    ) -> AbstractContextManager[Mapping[str, str] | None]:
        """The inner tracing's span around an enqueue, if any."""
        if self.inner is None:
            return nullcontext(context)
        return self.inner.sending(type_names, event_id, count, context)

    def handling(self, delivery: Delivery) -> Any:
        """A handler run starts: remember its delivery (and the inner tracing's state)."""
        return delivery, None if self.inner is None else self.inner.handling(delivery)

    def handled(
        self, state: Any, outcome: str, failure: str | None, error: BaseException | None
    ) -> None:
        """A handler run ended: record it (before its ack or failure reaches Redis)."""
        delivery, inner = state
        if self.inner is not None:
            self.inner.handled(inner, outcome, failure, error)
        if failure is None:
            result = "success"
        elif outcome == "cancelled":
            result = "cancelled"
        else:
            most = self.max_deliveries(delivery.event_type, delivery.group)
            result = "dead" if most is not None and delivery.attempt >= most else "retry"
        self.deliveries.append(
            Delivered(
                type=delivery.event_type,
                id=delivery.id,
                attempt=delivery.attempt,
                outcome=result,
                group=delivery.group,
                error=failure,
                at=datetime.fromtimestamp(delivery.claimed_us / 1e6, timezone.utc),
                exception=error,
            )
        )
