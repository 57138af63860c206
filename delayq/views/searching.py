"""Views for finding events: the ready list, ids by prefix, dead letters by error text.

Each read goes through :class:`~delayq.storage.store.Store` and is bounded whatever the
queue size: the ready list is one page (a ZRANGE by rank); an id search is a
few ZSCANs with ``MATCH`` over the sets that hold ids by state, capped in calls;
an error search looks at a bounded number of dead letters per call and says
where to continue. :class:`~delayq.EventService` exposes them as ``ready``,
``find_ids`` and ``find_dead_letters``.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..codec import Codec
from ..events import Event, EventTypes
from ..storage.store import DeadRecord, Store
from .records import MAX_PAGE, DeadLetter, dead_letter, decode_payload, merged_page, utc

__all__ = [
    "DeadLetterSearch",
    "Finder",
    "IdMatch",
    "IdSearch",
    "ReadyEvent",
    "find_dead_letters",
    "find_ids",
    "ready",
]

MAX_SCAN = 5000
"""The most dead letters one :func:`find_dead_letters` call looks at."""
# ZSCAN's COUNT hint per call, and calls per set: about 5,000 members looked at per set
# at most, in calls short enough not to hold Redis up (COUNT 500 took 10+ ms on a
# 1,000,000-member set; COUNT 100 p99 1.9 ms; COUNT 50 halved that but doubled the round
# trips of a search page: benchmarks/RESULTS.md, "Dashboard")
_SCAN_COUNT = 100
_SCAN_CALLS = 50
_FIND_CHUNK = 200  # dead letters one dead_find.lua call looks at (a few ms at most)


def _check(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an int from {low} to {high}, not {value!r}")
    return value


_MAX_OFFSET = 2**40  # far beyond any set, and exact in Lua's doubles with a page added


@dataclass(frozen=True, slots=True)
class ReadyEvent:
    """An event in the ready list: due, waiting for a consumer to claim it."""

    id: str
    """The event id."""
    attempts: int
    """Deliveries so far (more than 0: a retry)."""
    last_error: str | None
    """The last failure, if it is a retry."""
    enqueued_at: datetime | None
    """When it was enqueued (the producer's clock)."""
    popped: bool
    """True when a consumer popped it without claiming it (say, it died in between): the
    scheduler hands it out again."""
    context: Mapping[str, str]
    """The context given at enqueue time."""
    payload: Any
    """The payload as JSON-able data."""
    checked_at: datetime
    """Redis's time of the read."""

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON-able fields."""
        when = self.enqueued_at
        return {
            "id": self.id,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "enqueued_at": None if when is None else when.isoformat().replace("+00:00", "Z"),
            "popped": self.popped,
            "context": dict(self.context),
            "payload": self.payload,
        }


async def ready(
    store: Store,
    codec: Codec,
    type_name: str,
    cls: type[Event] | None,
    limit: int = 100,
    offset: int = 0,
    *,
    group: str | None = None,
) -> list[ReadyEvent]:
    """Up to ``limit`` ready events from position ``offset``, in the order consumers get
    them (a partitioned type's partitions merged by push order)."""
    _check("limit", limit, 1, MAX_PAGE)
    _check("offset", offset, 0, _MAX_OFFSET)
    now_ms, page = await merged_page(
        store.types.shards(type_name),
        lambda shard, at, count: store.browsing.ready_page(shard, at, count, group=group),
        offset,
        limit,
        key=lambda r: (r.score, r.raw_id),
    )
    checked = utc(now_ms)
    items = []
    for r in page:
        decoded = decode_payload(r.envelope, r.raw_id, cls, codec)
        items.append(
            ReadyEvent(
                id=r.raw_id.decode("utf-8", "replace"),
                attempts=r.attempts,
                last_error=r.error,
                enqueued_at=decoded.enqueued_at,
                popped=r.score < 0,
                context=decoded.context,
                payload=decoded.payload,
                checked_at=checked,
            )
        )
    return items


@dataclass(frozen=True, slots=True)
class IdMatch:
    """An id found by :func:`find_ids`, with where it was found."""

    id: str
    """The event id."""
    state: str
    """``scheduled``, ``ready``, ``in_flight`` or ``dead``."""
    group: str
    """The delivery group that holds it in that state (``"default"`` without groups)."""


@dataclass(frozen=True, slots=True)
class IdSearch:
    """What :func:`find_ids` found."""

    matches: list[IdMatch]
    """Up to ``limit`` ids starting with the prefix, sorted by id."""
    complete: bool
    """True when every set was scanned to its end (no match is missing); False when the
    scan stopped at its bound or at ``limit``: type more of the id to narrow it."""


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


async def find_ids(store: Store, type_name: str, prefix: str, limit: int = 20) -> IdSearch:
    """Ids of ``type_name``'s events that start with ``prefix``, in every state and group.

    ZSCAN with ``MATCH prefix*`` over the sets that hold ids by state (scheduled,
    ready, in flight, dead; each delivery group's too), at most ~5,000 members
    looked at per set, in calls of ``COUNT 100``. Ids are compared as bytes (UTF-8).
    """
    _check("limit", limit, 1, MAX_PAGE)
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"prefix must be a non-empty str, not {prefix!r}")
    pattern = _glob_escape(prefix) + "*"
    found: dict[tuple[str, str, str], None] = {}
    complete = True
    for shard in store.types.shards(type_name):
        groups = sorted(await store.groups.groups(shard))
        for state, group, key in store.browsing.id_sets(shard, groups):
            members, done = await store.browsing.scan_ids(
                key, pattern, _SCAN_COUNT, _SCAN_CALLS, limit
            )
            complete = complete and done
            for raw in members:
                found[(raw.decode("utf-8", "replace"), state, group)] = None
    hits = sorted(found)
    distinct = sorted({event_id for event_id, _, _ in hits})
    if len(distinct) > limit:
        complete = False
    chosen = set(distinct[:limit])
    matches = [IdMatch(i, s, g) for i, s, g in hits if i in chosen]
    return IdSearch(matches, complete)


@dataclass(frozen=True, slots=True)
class DeadLetterSearch:
    """What :func:`find_dead_letters` found."""

    items: list[DeadLetter]
    """The matching dead letters, oldest first."""
    next_offset: int
    """Where a further search starts (pass it as ``offset``)."""
    complete: bool
    """True when the search reached the end of the dead letters."""


def _ascii_lower(text: str) -> str:
    # Lua's string.lower changes ASCII letters only: the same here, so both sides agree
    return "".join(c.lower() if c.isascii() else c for c in text)


async def find_dead_letters(
    store: Store,
    codec: Codec,
    type_name: str,
    cls: type[Event] | None,
    text: str,
    limit: int = 100,
    offset: int = 0,
    *,
    scan: int = 1000,
    group: str | None = None,
) -> DeadLetterSearch:
    """Dead letters whose last error contains ``text`` (ASCII case ignored), among the
    ``scan`` (≤ 5000) oldest from position ``offset``; at most ``limit``.

    Each script call looks at 200 dead letters at most (``dead_find.lua``). A
    partitioned type: ``offset`` and ``scan`` count in each partition; the
    matches are merged by failure time.
    """
    _check("limit", limit, 1, MAX_PAGE)
    _check("offset", offset, 0, _MAX_OFFSET)
    _check("scan", scan, 1, MAX_SCAN)
    if not isinstance(text, str) or not text:
        raise ValueError(f"text must be a non-empty str, not {text!r}")
    needle = _ascii_lower(text)
    pages: list[list[DeadRecord]] = []
    next_offset, complete = offset, True
    for shard in store.types.shards(type_name):
        # in short calls: one script never looks at more than _FIND_CHUNK dead letters
        part: list[DeadRecord] = []
        at, end = offset, offset + scan
        while at < end and len(part) < limit:
            chunk = min(_FIND_CHUNK, end - at)
            reached, found = await store.browsing.dead_find(
                shard, needle, at, chunk, limit - len(part), group=group
            )
            part.extend(found)
            if reached < at + chunk and len(part) < limit:  # the set ended
                at = reached
                break
            at = reached
        pages.append(part)
        next_offset = max(next_offset, at)
        count = await store.dead.dead_count(shard, group=group)
        complete = complete and at >= count
    records = list(heapq.merge(*pages, key=lambda r: (r.failed_at_ms, r.raw_id)))[:limit]
    items = [dead_letter(r, cls, codec) for r in records]
    return DeadLetterSearch(items, next_offset, complete)


class Finder:
    """The searches of :class:`~delayq.EventService` (its ``ready``, ``find_ids`` and
    ``find_dead_letters`` delegate here); payloads decode into the class when the service
    has met it or this process defines it."""

    def __init__(self, store: Store, codec: Codec, types: EventTypes):
        self._store = store
        self._codec = codec
        self._types = types

    async def ready(
        self, name: str, limit: int, offset: int, group: str | None
    ) -> list[ReadyEvent]:
        """See :func:`ready`."""
        cls = self._types.cls_of(name)
        return await ready(self._store, self._codec, name, cls, limit, offset, group=group)

    async def find_ids(self, name: str, prefix: str, limit: int) -> IdSearch:
        """See :func:`find_ids`."""
        return await find_ids(self._store, name, prefix, limit)

    async def find_dead_letters(
        self, name: str, text: str, limit: int, offset: int, scan: int, group: str | None
    ) -> DeadLetterSearch:
        """See :func:`find_dead_letters`."""
        cls = self._types.cls_of(name)
        return await find_dead_letters(
            self._store, self._codec, name, cls, text, limit, offset, scan=scan, group=group
        )
