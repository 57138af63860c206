"""``EventService``'s handlers and delivery groups: which types this process handles, in
which group, and the groups registered in Redis (:mod:`~delayq.runtime.runtime`,
:mod:`~delayq.operations.groups`)."""

from __future__ import annotations

from datetime import timedelta

from ..events import Event
from ..operations.groups import check_group
from ..retry import Backoff
from ..runtime.consumer import Handler
from ..runtime.middleware import Middleware
from ..storage.store import QueueCounts
from ..views.inspection import EventTypeRef
from .parts import ServiceParts

__all__ = ["HandlersMixin"]


class HandlersMixin(ServiceParts):
    """Adding and removing handlers; registering, listing and counting delivery groups."""

    # -- types and handlers ------------------------------------------------------

    def add_handler(
        self,
        event_type: type[Event],
        handler: Handler,
        concurrency: int = 1,
        *,
        group: str | None = None,
        retry_attempts: int | None = None,
        retry_backoff: Backoff | None = None,
        timeout: float | timedelta | None = None,
    ) -> None:
        """Handle events of ``event_type`` with ``async def handler(event)``.

        At most ``concurrency`` handlers of this type (and group) run at once
        in this process. The handler returns True or None when done; False or
        an exception means "retry later". Works before and after :meth:`start`.

        ``group`` names a delivery group: every group registered for the type
        gets each event once, with its own retries and dead letters (see
        docs/guides/groups.md). The group is registered in Redis as its
        consumer starts, and at the latest before this process's next enqueue
        or scheduler pass: an event enqueued here after ``add_handler``
        returns reaches the group. (Other processes' enqueues reach it once it
        is registered; ``await register_group(...)`` first to be sure.)
        Without ``group`` the handler joins the default group. ``retry_attempts`` and ``retry_backoff`` override the service's
        options for this group's deliveries, and ``timeout`` (a timedelta or seconds) the
        service's ``handler_timeout``: a run past it is cancelled and fails with
        ``HandlerTimeout`` (retried like any failure). An event enqueued with its own
        ``timeout=`` uses that one (docs/guides/running-handlers.md).
        """
        name = self._types.register(event_type)
        self._runtime.add_consumer(
            name,
            event_type,
            handler,
            concurrency,
            check_group(group),
            retry_attempts,
            retry_backoff,
            timeout,
        )

    def use(self, middleware: Middleware) -> None:
        """Run every handler inside ``middleware`` from now on (the first added outermost).

        ``middleware`` is ``async def mw(delivery, call_next)``, which returns
        ``await call_next()`` (the handler's result) or raises, or a callable taking the
        :class:`~delayq.Delivery` and returning an async context manager (such as an
        ``@asynccontextmanager`` function). It runs in the handler's task, inside the
        handler's timeout, and must let ``CancelledError`` through
        (docs/guides/middleware.md). Works before and after :meth:`start`.
        """
        self._runtime.pipeline.add(middleware)

    async def remove_handler(self, event_type: type[Event], *, group: str | None = None) -> bool:
        """Stop handling ``event_type`` (in ``group``) once its in-flight handlers finish.

        False if there was no such handler. The group stays registered: its
        events wait for it (see :meth:`remove_group`).
        """
        name = self._types.register(event_type)
        return await self._runtime.remove_consumer(name, check_group(group))

    # -- delivery groups -------------------------------------------------------------

    async def register_group(
        self, event_type: type[Event], group: str, *, retry_attempts: int | None = None
    ) -> bool:
        """Register a delivery group of ``event_type`` in Redis; True when it is new.

        From the scheduler's next move on, every event of the type that becomes
        due is delivered to this group too, even while no process handles it
        (its events wait in its ready list). ``add_handler(..., group=...)``
        registers its group by itself; this is for registering one ahead of
        its handlers. ``retry_attempts`` (default: the service's) sets how many
        times a lease of this group may expire before the event becomes the
        group's dead letter. Registering the first named group registers the
        default group with it (remove it if no handler uses it).
        """
        name = self._types.register(event_type)
        checked = check_group(group)
        return await self._groups.register(name, checked, retry_attempts)

    async def remove_group(self, event_type: type[Event], group: str) -> bool:
        """Drop a delivery group: its pending deliveries, retries and dead letters.

        Events no other group holds are deleted. This process's handler for
        the group is stopped; stop the group's handlers in other processes
        first, or they register it again when they start. Returns False when
        the group was not registered; raises ``ValueError`` for the type's
        last group.
        """
        name = self._types.register(event_type)
        checked = check_group(group)
        await self._runtime.remove_consumer(name, checked)
        return await self._groups.remove(name, checked)

    async def groups(self, event_type: EventTypeRef) -> list[str]:
        """The delivery groups registered for ``event_type`` (class or wire name;
        ``["default"]`` if none is named), those of handlers just added included."""
        if self._runtime.pending.any:
            await self._runtime.pending.flush()
        return await self._groups.names(self._types.name(event_type))

    async def group_stats(self, event_type: EventTypeRef) -> dict[str, QueueCounts]:
        """Counts per delivery group of ``event_type`` (class or wire name).

        A group's ``scheduled`` counts the type's events not yet due (each will
        reach every group) plus the group's own retries waiting.
        """
        if self._runtime.pending.any:
            await self._runtime.pending.flush()
        return await self._groups.counts(self._types.name(event_type))
