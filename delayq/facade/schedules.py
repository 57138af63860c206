"""``EventService``'s recurring schedules: create, list, pause, trigger and delete them
(:mod:`~delayq.schedules.api`; docs/SCHEDULES.md)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from ..events import Event
from ..schedules.api import ScheduleInfo
from .parts import ServiceParts

__all__ = ["SchedulesMixin"]


class SchedulesMixin(ServiceParts):
    """Recurring schedules firing events into a type."""

    async def schedule(
        self,
        name: str,
        event_type: type[Event],
        *,
        cron: str | None = None,
        every: timedelta | float | None = None,
        timezone: str = "UTC",
        payload: Mapping[str, Any] | None = None,
        context: Mapping[str, str] | None = None,
        overlap: str = "skip",
        catch_up: timedelta | float | None = None,
        jitter: timedelta | float | None = None,
        start_at: datetime | None = None,
        end_at: datetime | None = None,
        priority: int | None = None,
    ) -> ScheduleInfo:
        """Create or update (by ``name``) a durable schedule firing ``event_type`` events.

        Exactly one of ``cron`` (5 fields, or 6 with seconds first; ``@hourly``-style
        aliases, ranges, steps, ``L`` and ``#``) evaluated in ``timezone`` (IANA), or
        ``every`` (a timedelta, slots at whole multiples from ``start_at`` or the unix
        epoch). Each slot is fired once, whichever and however many processes run the
        scheduler, as an event with id ``"<name>@<slot in UTC>"`` built from ``payload``
        (checked against ``event_type`` now) and ``context``; handlers read the slot from
        ``current_delivery().slot``. ``overlap``: ``"skip"`` (default: no fire while the
        previous one is still pending), ``"buffer_one"`` (one fire held back until the
        previous one has left, the others skipped) or ``"allow"``. ``catch_up``: after an outage, missed slots younger than this are
        fired (default None: only the latest missed slot). ``jitter``: a delay up to this
        long added per fire, the same for a slot in every process. Updating keeps the
        slots already fired; see docs/SCHEDULES.md. ``priority``: the level (0 the most
        urgent .. 9) of every fire (None: the event class's ``priority=``; see
        docs/guides/priorities.md). Bad arguments raise ``TypeError``/``ValueError`` and
        write nothing.
        """
        spec = self._schedules.build(
            name,
            event_type,
            cron=cron,
            every=every,
            timezone=timezone,
            payload=payload,
            context=context,
            overlap=overlap,
            catch_up=catch_up,
            jitter=jitter,
            start_at=start_at,
            end_at=end_at,
            priority=priority,
        )
        return await self._schedules.upsert(spec)

    async def schedules(self) -> list[ScheduleInfo]:
        """Every schedule under the prefix (by name): expression, next and last fire, state."""
        return await self._schedules.list()

    async def schedule_info(self, name: str) -> ScheduleInfo | None:
        """One schedule, or None when there is none by that name."""
        return await self._schedules.get(name)

    async def unschedule(self, name: str) -> bool:
        """Delete a schedule (fires already enqueued stay); False when there was none."""
        return await self._schedules.remove(name)

    async def pause_schedule(self, name: str) -> bool:
        """Stop firing a schedule until :meth:`resume_schedule`; False when there is none."""
        return await self._schedules.set_paused(name, True)

    async def resume_schedule(self, name: str) -> bool:
        """Fire a paused schedule again from its next slot (no late fires for the pause)."""
        return await self._schedules.set_paused(name, False)

    async def trigger_schedule(self, name: str) -> str | None:
        """Fire a schedule once now, besides its regular slots; the event id (None: no such
        schedule). Its id is ``"<name>@trigger-<unix ms>"``."""
        return await self._schedules.trigger(name)
