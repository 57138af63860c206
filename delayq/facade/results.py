"""``EventService``'s kept results (:mod:`~delayq.operations.results`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from ..durations import delay_seconds
from ..events import Event
from ..results import Outcome
from .parts import ServiceParts

__all__ = ["ResultsMixin"]


class ResultsMixin(ServiceParts):
    """The results of event types declared with ``results=`` (docs/WORKFLOWS.md, "Results")."""

    async def result(
        self, event_type: type[Event], id: str, timeout: float | timedelta | None = None
    ) -> Any:
        """The kept result of the event ``(event_type, id)``, waiting until it is done.

        Waits without polling (a wake-up on the prefix's results channel, with a re-check
        every few seconds as a safety net) up to ``timeout`` (None: for ever). Raises
        ``delayq.EventFailed`` (its ``error`` is the dead letter's) if the event became
        a dead letter, ``TimeoutError`` when ``timeout`` passes first, and ``LookupError``
        when there is no such event and no kept result (never enqueued, cancelled,
        purged, or its result expired). While an event with this id is pending (a new
        run after a replace or a requeue included), it waits for that run.
        """
        name = self._types.register(_keeping(event_type))
        wait = None if timeout is None else delay_seconds(timeout, "timeout")
        return await self._results.result(name, id, wait)

    async def results(self, event_type: type[Event], ids: Iterable[str]) -> dict[str, Outcome]:
        """Where each of ``ids`` stands, read at once without waiting: id -> ``Outcome``
        (``status`` ``"ok"`` with the ``value``, ``"failed"`` with the dead letter's
        ``error``, ``"pending"`` or ``"missing"``), in the order of ``ids``."""
        if isinstance(ids, str):
            raise TypeError("ids must be an iterable of ids, not one str")
        name = self._types.register(_keeping(event_type))
        return await self._results.outcomes(name, ids)


def _keeping(event_type: type[Event]) -> type[Event]:
    if getattr(event_type, "event_results_ms", None) is None:
        raise ValueError(
            f"{getattr(event_type, '__qualname__', event_type)!r} keeps no results: declare it "
            "with a class option, e.g. `class Thumbnail(Event, results=timedelta(hours=1))`"
        )
    return event_type
