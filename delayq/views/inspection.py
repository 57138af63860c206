"""Looking at queues: one event by id, scheduled events by due time, dead letters, counts.

:class:`Inspector` fills the public records of the lookups (:class:`EventInfo`,
:class:`GroupState`, :class:`ScheduledEvent`, :class:`DeadLetter`, defined in
:mod:`~delayq.views.records` and importable from here too). The service accepts an
Event class or a type's wire name (tools such as the ``delayq`` command cannot
import the application's classes); when the class is known (met by the service, or
defined in this process) payloads decode into it, otherwise from the stored
envelope (MessagePack or JSON) into plain data. Either way :attr:`EventInfo.payload`
is JSON-able. For a type with delivery groups, :attr:`EventInfo.groups` gives the
event's state in each group.

Redis is read through :class:`~delayq.storage.store.Store` (read-only scripts, one
consistent view per call, bounded by the page size); nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Literal

from ..codec import Codec
from ..context import AFTER_KEY, Parent
from ..events import EventTypes
from ..keyspace.groups import stored_group
from ..partitions.routing import Router
from ..partitions.shards import parse_shard
from ..results import decode_parent
from ..storage.store import EventRecord, QueueCounts, Store
from .records import (
    MAX_PAGE,
    DeadLetter,
    EventInfo,
    EventState,
    EventTypeRef,
    GroupState,
    RunProgress,
    ScheduledEvent,
    _Decoded,
    check_page,
    dead_letter,
    decode_payload,
    utc,
)

__all__ = [
    "MAX_PAGE",
    "DeadLetter",
    "EventInfo",
    "EventState",
    "EventTypeRef",
    "GroupState",
    "Inspector",
    "RunProgress",
    "ScheduledEvent",
    "check_page",
    "decode_payload",
    "utc",
]

# the order in which a type with delivery groups takes its overall state from its groups'
_MOST_ACTIVE: tuple[EventState, ...] = ("in_flight", "ready", "scheduled", "dead")


def _group_states(record: EventRecord) -> dict[str, GroupState]:
    """Each group's state of an event of a type with delivery groups."""
    states: dict[str, GroupState] = {}
    for name, g in sorted((record.groups or {}).items()):
        state: EventState
        due = None
        if g.dead_at_ms is not None:
            state = "dead"
        elif g.lease_deadline_ms is not None:
            state = "in_flight"
        elif g.queued_score is not None:
            state = "ready"
        elif g.retry_ms is not None or record.scheduled_ms is not None:
            state = "scheduled"
            due = g.retry_ms if g.retry_ms is not None else record.scheduled_ms
        else:
            state = "absent"
        states[name] = GroupState(
            group=name,
            state=state,
            due_at=utc(due),
            lease_deadline=utc(g.lease_deadline_ms),
            failed_at=utc(g.dead_at_ms),
            attempts=g.attempts,
            last_error=g.error,
        )
    return states


class Inspector:
    """Reads queue state for :class:`~delayq.EventService` (its lookup methods delegate here).

    Types come as wire names (the facade resolves classes); payloads decode into
    the class when the service has met it or this process defines it.
    """

    def __init__(self, store: Store, router: Router, codec: Codec, types: EventTypes):
        self._store = store
        self._router = router  # a partitioned type is read as one
        self._codec = codec
        self._types = types  # the service's registered types (shared, live)

    async def stats(self, type_names: Iterable[str] | None = None) -> dict[str, QueueCounts]:
        """Counts per type name: of ``type_names``, or of every type used under the prefix."""
        if type_names is None:
            type_names = await self._store.types.known_types()
        return await self._store.browsing.counts(type_names)

    async def inspect(self, name: str, event_id: str) -> EventInfo:
        """Where the event ``(name, event_id)`` is, and all that is stored about it."""
        if not isinstance(event_id, str) or not event_id:
            raise ValueError(f"event id must be a non-empty str, not {event_id!r}")
        cls = self._types.cls_of(name)
        if cls is not None:
            self._store.types.declare(name, cls.event_partitions)
        shard_list = self._router.shards_of_id(name, event_id)
        found = shard_list[0]
        r = await self._store.browsing.inspect(found, event_id)
        for shard in shard_list[1:]:  # a partition count being changed: look in each layout
            if r.envelope is not None:
                break
            found = shard
            r = await self._store.browsing.inspect(shard, event_id)
        groups = _group_states(r) if r.groups is not None else {}
        outcome: Literal["ok", "failed"] | None = None
        state: EventState
        due_at, lease_deadline, failed_at = None, utc(r.lease_deadline_ms), utc(r.dead_at_ms)
        attempts, last_error = r.attempts, r.error
        active = [g for s in _MOST_ACTIVE for g in groups.values() if g.state == s]
        if active:  # a type with groups: the most active group's state
            g = active[0]
            state, due_at, lease_deadline, failed_at = (
                g.state,
                g.due_at,
                g.lease_deadline,
                g.failed_at,
            )
            attempts, last_error = g.attempts, g.last_error
        elif r.dead_at_ms is not None:
            state = "dead"
        elif r.lease_deadline_ms is not None:
            state = "in_flight"
        elif r.queued_score is not None:
            state = "ready"
        elif r.scheduled_ms is not None:
            state = "scheduled"
            due_at = utc(r.scheduled_ms)
        elif r.waiting_ms is not None:
            state = "waiting"
            due_at = utc(r.waiting_ms)
        elif r.envelope is None:
            state = "absent"
            outcome = await self._kept_outcome(shard_list, event_id)
        else:
            state = "stranded"
        decoded = (
            decode_payload(r.envelope, event_id, cls, self._codec)
            if r.envelope is not None
            else _Decoded()
        )
        return EventInfo(
            type_name=name,
            id=event_id,
            state=state,
            due_at=due_at,
            lease_deadline=lease_deadline,
            failed_at=failed_at,
            attempts=attempts,
            last_error=last_error,
            context=decoded.context,
            enqueued_at=decoded.enqueued_at,
            event=decoded.event,
            payload=decoded.payload,
            serializer=decoded.serializer,
            raw=r.envelope,
            decode_error=decoded.error,
            checked_at=datetime.fromtimestamp(r.now_ms / 1000, timezone.utc),
            groups=groups,
            progress=await self._progress(found, event_id, groups)
            if state == "in_flight"
            else None,
            outcome=outcome,
            priority=r.priority,
            parents=await self._parents(found, event_id)
            if state == "waiting" or AFTER_KEY in decoded.context
            else (),
        )

    async def children(
        self, name: str, event_id: str, limit: int
    ) -> tuple[int, list[tuple[str, str]]]:
        """How many children wait for the event's next completion and the first ``limit`` of
        them as ``(type name, id)``, over every layout of a type being repartitioned."""
        total, found = 0, list[tuple[str, str]]()
        for shard in self._router.shards_of_id(name, event_id):
            count, kids = await self._store.dependencies.dep_children(
                shard, event_id, max(limit - len(found), 0)
            )
            total += count
            found += [(parse_shard(s)[0], i) for s, i in kids]
        return total, found

    async def _parents(self, shard: str, event_id: str) -> tuple[Parent, ...]:
        """A child's parents and their outcomes so far (one more read, for children only)."""
        _, _, edges = await self._store.dependencies.dep_parents(shard, event_id)
        return tuple(decode_parent(t, i, r) for t, i, r in edges)

    async def _progress(
        self, shard: str, event_id: str, groups: Mapping[str, GroupState]
    ) -> RunProgress | None:
        """The progress of the run holding the event's lease (of the first group running it)."""
        running = [n for n, g in groups.items() if g.state == "in_flight"] if groups else [None]
        for name in running:
            data = await self._store.running.read_progress(shard, stored_group(name), event_id)
            if data is not None:
                return RunProgress.decode(data)
        return None

    async def _kept_outcome(
        self, shard_list: list[str], event_id: str
    ) -> Literal["ok", "failed"] | None:
        """Whether a done event's outcome is kept (types with ``results=``; one more read,
        for absent events only)."""
        for shard in shard_list:
            ((found, _),) = await self._store.results.outcomes(shard, [event_id])
            if found in ("o", "f"):
                return "ok" if found == "o" else "failed"
        return None

    async def scheduled(
        self,
        name: str,
        limit: int = 100,
        offset: int = 0,
        *,
        group: str | None = None,
    ) -> list[ScheduledEvent]:
        """Up to ``limit`` scheduled events from position ``offset``, earliest due first.

        With ``group`` (a delivery group's name, ``"default"`` included; checked by
        the caller): what that group will get, the type's schedule and the group's
        own retries merged.
        """
        check_page(limit, offset)
        cls = self._types.cls_of(name)
        items = []
        for record in await self._router.scheduled_page(name, offset, limit, group):
            decoded = decode_payload(record.envelope, record.raw_id, cls, self._codec)
            items.append(
                ScheduledEvent(
                    id=record.raw_id.decode("utf-8", "replace"),
                    due_at=datetime.fromtimestamp(record.due_ms / 1000, timezone.utc),
                    attempts=record.attempts,
                    last_error=record.error,
                    context=decoded.context,
                    event=decoded.event,
                    payload=decoded.payload,
                    raw=record.envelope,
                    decode_error=decoded.error,
                )
            )
        return items

    async def dead_letters(
        self,
        name: str,
        limit: int = 100,
        offset: int = 0,
        *,
        group: str | None = None,
    ) -> list[DeadLetter]:
        """Up to ``limit`` dead letters (of ``group``) from position ``offset``, oldest first."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be a positive int, not {limit!r}")
        check_page(min(limit, MAX_PAGE), offset)
        cls = self._types.cls_of(name)
        records = await self._router.dead_letters(name, offset, limit, group)
        return [dead_letter(record, cls, self._codec) for record in records]
