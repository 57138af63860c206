"""Producers' calls: checking and encoding events, batching them per type, cancelling,
counting the outcomes.

Every enqueue goes through :meth:`~delayq.partitions.routing.Router.enqueue` and ends in
``enqueue.lua`` on the shard the event's id routes to: one call per event for
a single enqueue (concurrent ones coalesced by the store), one pipelined batch
per shard for :meth:`Enqueuer.many` and :meth:`Enqueuer.envelopes`. Each
outcome is counted as ``enqueued``, ``kept`` (the id existed) or
``replaced``, and a cancel that removed an event as ``cancelled``. The tracing hooks of
:class:`~delayq.observer.Observer` wrap the encoding, so a trace context
travels in the stored envelope.

(Over 400 lines: one job, the producer's side of an enqueue: the per-event options
checks, enqueue hooks, timeouts and priority levels that the single, many and envelope
routes share, and the ``after=`` route up to its registration (whose three steps are
:mod:`delayq.operations.dependencies`'); a batch's adds and callbacks
(:mod:`delayq.operations.batches`) go through these routes too.)
"""

from __future__ import annotations

import enum
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..codec import Codec, add_to_context, check_context
from ..context import AFTER_KEY, TIMEOUT_KEY
from ..durations import delay_ms
from ..errors import DecodeError
from ..events import (
    Event,
    EventTypes,
    Item,
    check_event,
    find_event_type,
    item_due,
    validate_name,
)
from ..flow.dedup import Dedup, check_debounce
from ..flow.keys import check_key, event_key
from ..flow.priorities import check_priority
from ..keyspace.groups import stored_group
from ..metrics import ServiceMetrics
from ..observer import Observer
from ..options import check_timeout
from ..partitions.routing import Router
from ..storage.running import cancel_message
from ..storage.store import Enqueued, Store

if TYPE_CHECKING:
    from .dependencies import Dependencies
    from .groups import PendingGroups

__all__ = [
    "CancelResult",
    "EnqueueHook",
    "Enqueuer",
    "after_envelopes",
    "with_timeout",
]

# the counter of each outcome, by its code
_OUTCOMES: dict[int, str] = {
    Enqueued.KEPT: "kept",
    Enqueued.ADDED: "enqueued",
    Enqueued.REPLACED: "replaced",
}
# Enqueued.KEPT as a plain int, for the compare every single enqueue makes (looking up
# an IntEnum member costs some 900 CPU instructions, 1.5 % of the whole enqueue)
_KEPT = int(Enqueued.KEPT)
_UNBOUND: Any = object()


class CancelResult(enum.Enum):
    """What :meth:`~delayq.EventService.cancel` did. True unless ``UNKNOWN``, as the bool
    ``cancel`` returned before was True when it removed an event."""

    REMOVED = "removed"
    """The event was pending (scheduled, ready, or waiting for a retry) and is gone."""
    SIGNALLED = "signalled"
    """The event was running: it is gone, and its handler's task is being cancelled
    wherever it runs (it sees ``CancelledError`` within about a second)."""
    UNKNOWN = "unknown"
    """No pending or running event has that id (never enqueued, handled, or a dead letter)."""

    def __bool__(self) -> bool:
        return self is not CancelResult.UNKNOWN


EnqueueHook = Callable[[Event, dict[str, str]], "Awaitable[None] | None"]
"""``hook(event, context)``, sync or async: may add to ``context`` (a dict of str to str
stored with the event) or raise to refuse the event (nothing is written)."""


def with_timeout(
    context: Mapping[str, str] | None, timeout: float | timedelta | None
) -> Mapping[str, str] | None:
    """``context`` carrying one event's handler ``timeout`` (checked; None: as it was)."""
    if timeout is None:
        return context
    ms = str(math.ceil(check_timeout(timeout) * 1000))
    return {**(check_context(context) or {}), TIMEOUT_KEY: ms}


def timed_envelopes(
    items: Sequence[tuple[str, bytes, int]], timeout: float | timedelta | None
) -> Sequence[tuple[str, bytes, int]]:
    """``enqueue_envelopes`` items whose envelopes carry ``timeout`` (None: as they were)."""
    if timeout is None:
        return items
    extra = with_timeout(None, timeout)
    assert extra is not None
    out = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 3 and isinstance(item[1], bytes)):
            raise TypeError(f"items are (id: str, envelope: bytes, ms: int), not {item!r}")
        try:
            out.append((item[0], add_to_context(item[1], extra), item[2]))
        except DecodeError as exc:
            raise ValueError(f"{item[0]!r}: {exc}") from exc
    return out


def after_envelopes(items: Sequence[tuple[str, bytes, int]]) -> list[tuple[str, bytes, int]]:
    """``enqueue_envelopes`` items of children (``after=``): each context marked, so their
    consumers read their parents."""
    out = []
    for item in timed_envelopes(items, None):
        if not (isinstance(item, tuple) and len(item) == 3 and isinstance(item[1], bytes)):
            raise TypeError(f"items are (id: str, envelope: bytes, ms: int), not {item!r}")
        try:
            out.append((item[0], add_to_context(item[1], {AFTER_KEY: "1"}), item[2]))
        except DecodeError as exc:
            raise ValueError(f"{item[0]!r}: {exc}") from exc
    return out


class Enqueuer:
    """The enqueue operations of one service (its enqueue methods delegate here)."""

    def __init__(
        self,
        store: Store,
        router: Router,
        codec: Codec,
        observer: Observer,
        metrics: ServiceMetrics,
        types: EventTypes,
        pending: PendingGroups,
    ):
        self._store = store
        self._router = router
        self._codec = codec
        self._observer = observer
        self._metrics = metrics
        self._types = types  # the service's registered types (shared, live)
        # groups added to the running service: registered before any enqueue goes out
        self._pending = pending
        self._layouts_read: set[str] = set()  # type names whose layouts were read from Redis
        # type name -> the bound counter of each enqueue outcome code (or _UNBOUND)
        self._by_code: dict[str, list[Any]] = {}
        # classes enqueued before -> (wire name, has a flow_key field, priority level,
        # partition count)
        self._known: dict[type, tuple[str, bool, int, int]] = {}
        # (async, hook) of service.use_enqueue, in order; empty: no per-event work
        self.hooks: list[tuple[bool, EnqueueHook]] = []

    def add_hook(self, hook: EnqueueHook) -> None:
        """Check and append an enqueue hook (see :data:`EnqueueHook`)."""
        if not callable(hook):
            raise TypeError(f"an enqueue hook must be callable, not {hook!r}")
        is_async = inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(
            getattr(hook, "__call__", None)  # noqa: B004
        )
        self.hooks.append((is_async, hook))

    async def _hooked(self, event: Any, context: Mapping[str, str] | None) -> dict[str, str] | None:
        """``context`` as the hooks leave it (a new dict; they may raise to refuse)."""
        ctx = dict(check_context(context) or {})
        for is_async, hook in self.hooks:
            returned = hook(event, ctx)
            if is_async:
                await returned  # type: ignore[misc]
        return check_context(ctx)

    def _prepare(
        self,
        event: Any,
        context: Mapping[str, str] | None,
        key: str | None,
        checked: bool = False,
    ) -> tuple[str, bytes, str | None, int, int]:
        """The event's type name, envelope, flow key (``key`` if given), and its class's
        priority level and partition count, checked.

        A class met before skips the class checks and the flow-key lookup when it has
        no ``flow_key`` field (a dict lookup instead of four calls per enqueue), and the
        lookups of its level and partitions.
        ``checked``: the context is a trace carrier delayq made (see ``Codec.encode``)."""
        cls = type(event)
        known = self._known.get(cls)
        if known is None:
            check_event(event)
            name = self._types.register(cls)
            has_field = getattr(cls, "event_flow_key", None) is not None
            known = self._known[cls] = (name, has_field, cls.event_priority, cls.event_partitions)
        else:
            event_id = event.id
            if type(event_id) is not str or not event_id:
                check_event(event)  # raises the error this id deserves
        name, has_field, level, partitions = known
        flow_key = event_key(event, key) if key is not None or has_field else None
        envelope = self._codec.encode(event, context, checked=checked)
        return name, envelope, flow_key, level, partitions

    def _counter(self, name: str, code: int) -> Callable[[int], None] | None:
        """The bound counter of outcome ``code`` (an :class:`Enqueued`) of type ``name``:
        bound at its first use, when its series first appeared before."""
        counters = self._by_code.get(name)
        if counters is None:
            counters = self._by_code[name] = [_UNBOUND] * len(_OUTCOMES)
        counter = counters[code]
        if counter is _UNBOUND:
            counter = counters[code] = self._metrics.bind_increment(_OUTCOMES[code], name)
        return counter  # type: ignore[no-any-return]

    def _count_codes(self, name: str, codes: list[int]) -> None:
        for code in (Enqueued.ADDED, Enqueued.KEPT, Enqueued.REPLACED):
            n = codes.count(code)
            if n:
                counter = self._counter(name, code)
                if counter is not None:
                    counter(n)

    async def one(
        self,
        event: Event,
        ms: int,
        absolute: bool,
        context: Any,
        replace: bool | Dedup,
        key: str | None = None,
        priority: int | None = None,
    ) -> bool:
        """Enqueue one event due in ``ms`` (or at unix ms ``ms`` when ``absolute``), under
        flow key ``key`` (None: its class's ``flow_key`` field, if any), at priority level
        ``priority`` (checked by the caller, so that the usual call, without one, checks
        nothing; None: its class's ``priority=``)."""
        if self.hooks:
            context = await self._hooked(event, context)
        if self._pending.any:
            await self._pending.flush()
        observer = self._observer
        if observer.tracing is None:
            stored_context, ours = context, False
        else:
            # inside an unsampled trace: no span, only the trace's context to store
            quick = observer.context_without_span
            stored_context = None if quick is None else quick(context)
            if stored_context is None:
                return await self._one_traced(event, ms, absolute, context, replace, key, priority)
            ours = context is None  # the trace's carrier alone: str to str already
        name, envelope, flow_key, level, partitions = self._prepare(
            event, stored_context, key, ours
        )
        if priority is not None:
            level = priority
        # positional: this is every single enqueue's call (keywords cost more)
        (code,) = await self._router.enqueue(
            name,
            partitions,
            [(event.id, envelope, ms)],
            absolute,
            replace,
            None if flow_key is None else [flow_key],
            [level] if level else None,
        )
        counters = self._by_code.get(name)
        inc = counters[code] if counters is not None else _UNBOUND
        if inc is _UNBOUND:
            inc = self._counter(name, code)
        if inc is not None:
            inc(1)
        return code != _KEPT

    async def _one_traced(
        self,
        event: Event,
        ms: int,
        absolute: bool,
        context: Any,
        replace: bool | Dedup,
        key: str | None,
        priority: int | None,
    ) -> bool:
        """:meth:`one` inside the send span of the enqueue."""
        with self._observer.sending(event, context) as stored_context:
            name, envelope, flow_key, level, parts = self._prepare(event, stored_context, key)
            if priority is not None:
                level = priority
            (code,) = await self._router.enqueue(
                name,
                parts,
                [(event.id, envelope, ms)],
                absolute=absolute,
                replace=replace,
                keys=None if flow_key is None else [flow_key],
                priorities=[level] if level else None,
            )
        self._count_codes(name, [code])
        return code != _KEPT

    async def cancel(self, name: str, event_id: str, group: str | None = None) -> CancelResult:
        """Remove a pending or running event of type ``name`` (for every delivery group, or
        ``group``, ``"default"`` the default one; counted when one was) and tell the
        processes running it to cancel their handlers."""
        # the leases held before the removal: a run claimed between the two is stopped by
        # its next lease renewal instead (it finds its lease gone)
        runs = await self._router.running(name, event_id)
        if group is not None:
            runs = [run for run in runs if run[1] == stored_group(group)]
        if not await self._router.cancel(name, event_id, group):
            return CancelResult.UNKNOWN
        self._metrics.increment("cancelled", event_type=name)
        if not runs:
            return CancelResult.REMOVED
        raw_id = event_id.encode()
        await self._store.running.signal_cancel(
            [cancel_message(s, g, raw_id, t) for s, g, t in runs]
        )
        return CancelResult.SIGNALLED

    async def many(
        self,
        events: Iterable[Item],
        delay: float | timedelta,
        context: Mapping[str, str] | None,
        replace: bool | Dedup,
        key: str | None = None,
        priority: int | None = None,
    ) -> list[bool]:
        """Enqueue events or ``(event, delay)`` pairs, all checked before any is written;
        ``key`` is every event's flow key (None: each class's ``flow_key`` field),
        ``priority`` every event's level (None: each class's ``priority=``)."""
        default_ms = delay_ms(delay)
        check_context(context)
        key = check_key(key)
        if priority is not None:
            check_priority(priority)
        items = list(events)
        # each item's context as the hooks leave it, all before anything is written
        hooked = (
            [await self._hooked(item_due(i, 0)[0], context) for i in items] if self.hooks else None
        )
        if self._pending.any:
            await self._pending.flush()
        names = [] if self._observer.tracing is None else self._type_names(items)
        with self._observer.sending_many(names, len(items), context) as stored_context:
            return await self._enqueue_items(
                items, default_ms, stored_context, replace, key, hooked, priority
            )

    def _type_names(self, items: list[Any]) -> list[str]:
        return [getattr(type(i[0] if isinstance(i, tuple) else i), "event_name", "") for i in items]

    async def _enqueue_items(
        self,
        items: list[Item],
        default_ms: int,
        context: Mapping[str, str] | None,
        replace: bool | Dedup,
        key: str | None,
        hooked: list[dict[str, str] | None] | None = None,
        priority: int | None = None,
    ) -> list[bool]:
        by_type: dict[str, list[tuple[int, tuple[str, bytes, int]]]] = {}
        keys: dict[str, list[str | None]] = {}
        levels: dict[str, list[int]] = {}
        partitions: dict[str, int] = {}
        count = 0
        for index, item in enumerate(items):
            event, ms = item_due(item, default_ms)
            check_debounce(replace, ms)
            ctx = context if hooked is None else {**(context or {}), **(hooked[index] or {})}
            name, envelope, flow_key, level, parts = self._prepare(event, ctx, key)
            partitions[name] = parts
            by_type.setdefault(name, []).append((index, (event.id, envelope, ms)))
            keys.setdefault(name, []).append(flow_key)
            levels.setdefault(name, []).append(level if priority is None else priority)
            count = index + 1
        results = [False] * count
        for name, entries in by_type.items():
            type_keys, type_levels = keys[name], levels[name]
            codes = await self._router.enqueue(
                name,
                partitions[name],
                [e for _, e in entries],
                absolute=False,
                replace=replace,
                keys=type_keys if any(type_keys) else None,
                priorities=type_levels if any(type_levels) else None,
            )
            self._count_codes(name, codes)
            for (index, _), code in zip(entries, codes, strict=True):
                results[index] = code != _KEPT
        return results

    async def children(
        self,
        items: list[Item],
        default_ms: int,
        *,
        absolute: bool,
        context: Mapping[str, str] | None,
        parents: Sequence[tuple[str, str]],
        policy: str,
        dependencies: Dependencies,
    ) -> list[int]:
        """Enqueue events that wait for ``parents`` (``after=[...]``, see
        :mod:`delayq.operations.dependencies`); a code per item (1 added, 0 kept)."""
        ctx = {**(check_context(context) or {}), AFTER_KEY: "1"}
        hooked = [await self._hooked(item_due(i, 0)[0], ctx) for i in items] if self.hooks else None
        if self._pending.any:
            await self._pending.flush()
        by_type: dict[str, list[tuple[int, tuple[str, bytes, int]]]] = {}
        partitions: dict[str, int] = {}
        for index, item in enumerate(items):
            event, ms = item_due(item, default_ms)
            name, envelope, flow_key, _, parts = self._prepare(
                event, ctx if hooked is None else {**ctx, **(hooked[index] or {})}, None
            )
            if flow_key is not None:
                raise ValueError("an event enqueued with after= cannot have a flow key (yet)")
            partitions[name] = parts
            by_type.setdefault(name, []).append((index, (event.id, envelope, ms)))
        codes = [0] * len(items)
        for name, entries in by_type.items():
            got = await dependencies.enqueue(
                name,
                partitions[name],
                [e for _, e in entries],
                absolute=absolute,
                parents=parents,
                policy=policy,
            )
            self._count_codes(name, got)
            for (index, _), code in zip(entries, got, strict=True):
                codes[index] = code
        return codes

    async def envelopes(
        self,
        event_type: str,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool,
        replace: bool,
        keys: Sequence[str | None] | None = None,
        priorities: Sequence[int] | int | None = None,
    ) -> list[int]:
        """Enqueue ``(id, envelope, ms)`` items of a type known by name; a code per item;
        ``keys``: a flow key per item (None: none); ``priorities``: a level per item, or one
        for all (None: the class's ``priority=`` when the class is defined here, else 0)."""
        validate_name(event_type)
        if keys is not None:
            if len(keys) != len(items):
                raise ValueError(f"{len(keys)} flow keys for {len(items)} items")
            keys = [check_key(k) for k in keys]
        levels = self._envelope_levels(event_type, len(items), priorities)
        checked = []
        for item in items:
            if not (
                isinstance(item, tuple)
                and len(item) == 3
                and isinstance(item[0], str)
                and item[0]
                and isinstance(item[1], bytes)
                and isinstance(item[2], int)
                and not isinstance(item[2], bool)
            ):
                raise TypeError(f"items are (id: str, envelope: bytes, ms: int), not {item!r}")
            if not absolute and item[2] < 0:
                raise ValueError(f"a delay in ms must be >= 0: {item!r}")
            checked.append(item)
        if not checked:
            return []
        if self._pending.any:
            await self._pending.flush()
        codes = await self._router.enqueue(
            event_type,
            await self.partitions_of(event_type),
            checked,
            absolute=absolute,
            replace=replace,
            keys=keys if keys is not None and any(keys) else None,
            priorities=levels if levels is not None and any(levels) else None,
        )
        self._count_codes(event_type, codes)
        return codes

    def _envelope_levels(
        self, event_type: str, count: int, priorities: Sequence[int] | int | None
    ) -> list[int] | None:
        """The checked priority level of each of ``count`` envelopes (None: all 0)."""
        if priorities is None:
            cls = self._types.get(event_type) or find_event_type(event_type)
            default = cls.event_priority if cls is not None else 0
            return [default] * count if default else None
        if not isinstance(priorities, (list, tuple)):  # one level for all (or a bad value)
            return [check_priority(priorities)] * count
        if len(priorities) != count:
            raise ValueError(f"{len(priorities)} priorities for {count} items")
        return [check_priority(p) for p in priorities]

    async def partitions_of(self, name: str) -> int:
        """The partition count of a type known by name: its class's, when the class is
        defined in this process, else the largest layout recorded in Redis."""
        cls = self._types.get(name) or find_event_type(name)
        if cls is not None:
            return cls.event_partitions
        if name not in self._layouts_read:
            self._layouts_read.add(name)
            await self._store.types.known_types()  # refreshes the layouts
        return self._store.types.layouts(name)[0]
