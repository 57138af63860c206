"""``EventService``'s producer side: enqueue one event, many, or encoded envelopes, and
cancel one (:mod:`~delayq.operations.enqueueing`)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from ..durations import delay_ms, due_unix_ms
from ..events import Event
from ..flow.dedup import Dedup, check_debounce, dedup_mode
from ..flow.priorities import check_priority
from ..operations.dependencies import (
    ParentFailurePolicy,
    ParentRef,
    check_policy,
    parent_refs,
)
from ..operations.enqueueing import (
    CancelResult,
    EnqueueHook,
    after_envelopes,
    timed_envelopes,
    with_timeout,
)
from ..operations.groups import check_view
from ..views.inspection import EventTypeRef
from .parts import ServiceParts

__all__ = ["EnqueueMixin"]


class EnqueueMixin(ServiceParts):
    """Enqueueing events (with a delay, at a time, in batches, as envelopes) and cancelling one."""

    async def enqueue_with_delay(
        self,
        event: Event,
        delay: float | timedelta = 0,
        *,
        context: Mapping[str, str] | None = None,
        replace: bool = False,
        debounce: float | timedelta | None = None,
        unique_for: float | timedelta | None = None,
        key: str | None = None,
        timeout: float | timedelta | None = None,
        priority: int | None = None,
        after: Sequence[ParentRef] | None = None,
        on_parent_failure: ParentFailurePolicy = "fail",
    ) -> bool:
        """Handle ``event`` once ``delay`` (a timedelta or seconds, >= 0) has passed.

        The due time is counted on Redis's clock. Returns True when scheduled.
        When an event of the same type and id exists, it is kept and False is
        returned, unless ``replace=True`` swaps its payload, context and due
        time in one step (and returns True).

        Two more dedup modes (at most one of the three per call; docs/FLOW.md):
        ``debounce=max_wait`` replaces an existing event like ``replace`` but
        never pushes its due time past the id's first enqueue + ``max_wait``
        (``delay`` must not exceed ``max_wait``); ``unique_for=ttl`` keeps the
        first like the default, and once the event has been handled refuses
        the id (returns False) until ``ttl`` has passed.

        ``key``: the event's flow key (say, its tenant; docs/FLOW.md "Flow
        keys"): ready events are served in fair turns between keys, and
        per-key limits apply to each key. None: the field named by the class's
        ``flow_key=...``, if any; events without a key share one.

        ``timeout`` (a timedelta or seconds): this event's handler timeout, over the
        handler's ``add_handler(timeout=...)`` and the service's ``handler_timeout``
        (docs/guides/running-handlers.md). None: theirs.

        ``priority``: the event's priority level, an int from 0 (the most urgent) to 9;
        among a type's ready events a lower number is claimed first
        (docs/guides/priorities.md). None: the class's ``priority=`` (default 0). A
        ``replace`` sets the level again (to this one). Anything else raises
        ``ValueError`` before anything is written.

        ``after=[(ParentType, id), ...]``: the event waits (state ``waiting``) until every
        parent is done, then becomes due at the later of its own due time and its last
        parent's completion; ``on_parent_failure`` (``"fail"``, ``"run"`` or ``"skip"``)
        says what it does when a parent failed, was cancelled or skipped
        (docs/WORKFLOWS.md, "Dependencies"). Not with ``replace``, ``debounce``,
        ``unique_for``, a flow key or ``priority``.
        """
        if timeout is not None:
            context = with_timeout(context, timeout)
        ms = delay_ms(delay)
        if after is not None:
            parents = self._parents(
                after, on_parent_failure, replace, debounce, unique_for, key, priority
            )
            return await self._child(event, ms, False, context, parents, on_parent_failure)
        if debounce is None and unique_for is None:  # the usual call: no dedup mode to check
            mode: bool | Dedup = bool(replace)
        else:
            mode = dedup_mode(replace, debounce, unique_for)
            check_debounce(mode, ms)
        if priority is None:  # the usual call: no priority argument, positional (cheaper)
            return await self._enqueuer.one(event, ms, False, context, mode, key)
        return await self._levelled(event, ms, False, context, mode, key, priority)

    async def enqueue_at(
        self,
        event: Event,
        when: datetime,
        *,
        context: Mapping[str, str] | None = None,
        replace: bool = False,
        debounce: float | timedelta | None = None,
        unique_for: float | timedelta | None = None,
        key: str | None = None,
        timeout: float | timedelta | None = None,
        priority: int | None = None,
        after: Sequence[ParentRef] | None = None,
        on_parent_failure: ParentFailurePolicy = "fail",
    ) -> bool:
        """Handle ``event`` at ``when`` (a timezone-aware datetime); past times mean now.

        ``replace``, ``debounce``, ``unique_for``, ``key``, ``timeout`` and ``priority`` as in
        :meth:`enqueue_with_delay`. With ``debounce=max_wait`` the due time is capped
        (on Redis's clock) at the id's first enqueue + ``max_wait``; ``when`` further
        than ``max_wait`` from now (this process's clock: a check for mistakes) raises
        ``ValueError``. ``after`` and ``on_parent_failure`` as in :meth:`enqueue_with_delay`
        (the event is due at the later of ``when`` and its last parent's completion).
        """
        if timeout is not None:
            context = with_timeout(context, timeout)
        ms = due_unix_ms(when)
        if after is not None:
            parents = self._parents(
                after, on_parent_failure, replace, debounce, unique_for, key, priority
            )
            return await self._child(event, ms, True, context, parents, on_parent_failure)
        mode = dedup_mode(replace, debounce, unique_for)
        check_debounce(mode, ms - round(time.time() * 1000))
        if priority is None:  # as in enqueue_with_delay
            return await self._enqueuer.one(event, ms, True, context, mode, key)
        return await self._levelled(event, ms, True, context, mode, key, priority)

    async def enqueue_many(
        self,
        events: Iterable[Event | tuple[Event, float | timedelta]],
        delay: float | timedelta = 0,
        *,
        context: Mapping[str, str] | None = None,
        replace: bool = False,
        debounce: float | timedelta | None = None,
        unique_for: float | timedelta | None = None,
        key: str | None = None,
        timeout: float | timedelta | None = None,
        priority: int | None = None,
        after: Sequence[ParentRef] | None = None,
        on_parent_failure: ParentFailurePolicy = "fail",
    ) -> list[bool]:
        """Enqueue many events in pipelined batches; one result per event, in order.

        Items are events (due after ``delay``) or ``(event, delay)`` pairs. All
        items are validated before anything is written. ``replace``, ``debounce``
        (every item's delay at most ``max_wait``) and ``unique_for`` as in
        :meth:`enqueue_with_delay` (with ``debounce``, an id given twice in one call:
        the later replaces the earlier); ``key`` is every event's flow key (None: each
        class's ``flow_key`` field, if any); ``timeout`` is every event's handler timeout;
        ``priority`` every event's priority level (None: each class's ``priority=``).

        ``after`` and ``on_parent_failure`` (as in :meth:`enqueue_with_delay`): every event
        waits for those parents.
        """
        if timeout is not None:
            context = with_timeout(context, timeout)
        if after is not None:
            parents = self._parents(
                after, on_parent_failure, replace, debounce, unique_for, key, priority
            )
            codes = await self._enqueuer.children(
                list(events),
                delay_ms(delay),
                absolute=False,
                context=context,
                parents=parents,
                policy=on_parent_failure,
                dependencies=self._dependencies,
            )
            return [code != 0 for code in codes]
        mode = dedup_mode(replace, debounce, unique_for)
        return await self._enqueuer.many(events, delay, context, mode, key, priority)

    async def enqueue_envelopes(
        self,
        event_type: str,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool = False,
        replace: bool = False,
        keys: Sequence[str | None] | None = None,
        timeout: float | timedelta | None = None,
        priority: int | Sequence[int] | None = None,
        after: Sequence[ParentRef] | None = None,
        on_parent_failure: ParentFailurePolicy = "fail",
    ) -> list[int]:
        """Enqueue events already encoded into envelopes; one code per item, in order.

        For tools that encode elsewhere and send later, such as the transactional
        outbox of :mod:`delayq.postgres`: ``event_type`` is a wire name, and each
        item is ``(id, envelope, ms)`` with an envelope made by
        :class:`delayq.codec.Codec` and ``ms`` a delay in ms or, with
        ``absolute=True``, a unix time in ms. The same script, dedup and
        ``replace`` rule as every enqueue apply. Codes: 1 added, 0 kept (the id
        existed), 2 replaced. Envelopes are not decoded here: one that does not
        decode becomes a dead letter when it is delivered. ``keys``: a flow key
        per item (None: none; see :meth:`enqueue_with_delay`). ``timeout``: every
        item's handler timeout (as in :meth:`enqueue_with_delay`), added to each
        envelope's context. Enqueue hooks (:meth:`use_enqueue`) do not run here: the
        envelopes are already encoded. ``priority``: every item's priority level, or one
        per item (see :meth:`enqueue_with_delay`; None: the class's ``priority=`` when
        the class is defined in this process, else 0).

        ``after`` and ``on_parent_failure`` as in :meth:`enqueue_with_delay` (every item waits for those parents; codes 1 added, 0
        kept; not with ``replace`` or ``keys``).
        """
        items = timed_envelopes(items, timeout)
        if after is not None:
            parents = self._parents(after, on_parent_failure, replace, None, None, keys, priority)
            return await self._dependencies.enqueue(
                self._types.name(event_type),
                await self._enqueuer.partitions_of(event_type),
                after_envelopes(items),
                absolute=absolute,
                parents=parents,
                policy=on_parent_failure,
            )
        return await self._enqueuer.envelopes(
            event_type, items, absolute=absolute, replace=replace, keys=keys, priorities=priority
        )

    async def _levelled(
        self,
        event: Event,
        ms: int,
        absolute: bool,
        context: Mapping[str, str] | None,
        mode: bool | Dedup,
        key: str | None,
        priority: int,
    ) -> bool:
        """Enqueue one event at ``priority`` (checked here: the usual call, without one,
        checks nothing)."""
        return await self._enqueuer.one(
            event,
            ms,
            absolute=absolute,
            context=context,
            replace=mode,
            key=key,
            priority=check_priority(priority),
        )

    async def _child(
        self,
        event: Event,
        ms: int,
        absolute: bool,
        context: Mapping[str, str] | None,
        parents: list[tuple[str, str]],
        policy: str,
    ) -> bool:
        """Enqueue one event that waits for ``parents``; True when added."""
        (code,) = await self._enqueuer.children(
            [event],
            ms,
            absolute=absolute,
            context=context,
            parents=parents,
            policy=policy,
            dependencies=self._dependencies,
        )
        return code != 0

    def _parents(
        self,
        after: Sequence[ParentRef],
        policy: str,
        replace: bool,
        debounce: object,
        unique_for: object,
        key: object,
        priority: object,
    ) -> list[tuple[str, str]]:
        """``after=[...]`` checked, with the options that cannot go with it."""
        check_policy(policy)
        if replace or any(x is not None for x in (debounce, unique_for, key, priority)):
            raise ValueError(
                "after= does not go with replace, debounce, unique_for, a flow key or priority"
            )
        return parent_refs(after, self._types)

    def use_enqueue(self, hook: EnqueueHook) -> None:
        """Run ``hook(event, context)`` (sync or async) before every enqueue of one event
        or of ``enqueue_many``, in the order added.

        ``context`` is a dict of str to str that is stored with the event: a hook may add
        to it (a request id, a tenant) and handlers read it with
        :func:`~delayq.event_context`. A hook that raises refuses the event: the call
        raises that exception and nothing of it (or, for ``enqueue_many``, of the whole
        call) is written. With no hook, an enqueue does no extra work. Not run by
        :meth:`enqueue_envelopes` nor by schedules' fires (see
        docs/guides/middleware.md).
        """
        self._enqueuer.add_hook(hook)

    async def cancel(
        self, event_type: EventTypeRef, id: str, *, group: str | None = None
    ) -> CancelResult:
        """Remove a pending (scheduled, ready or in-flight) event, and stop its handler if
        one is running.

        Returns :class:`~delayq.CancelResult`: ``REMOVED`` (it was pending),
        ``SIGNALLED`` (it was running: its handler's task, wherever it runs, sees
        ``CancelledError`` within about a second, and the event is neither retried nor a
        dead letter) or ``UNKNOWN`` (nothing under that id). Only ``UNKNOWN`` is false,
        so ``if await service.cancel(...)`` reads as before. ``event_type`` is the class
        or its wire name. With delivery groups, without ``group`` every group's delivery
        goes and every group's run is cancelled; with ``group`` (``"default"`` for the
        default group) that group's alone, the others keeping theirs (an event not due
        yet stays due at its time for them). Dead letters are not touched: use
        :meth:`purge_dead_letters`. See docs/guides/running-handlers.md.
        """
        name = self._types.name(event_type)
        return await self._enqueuer.cancel(name, id, check_view(group))
