"""Reading queue state: counts, one event's record, pages of scheduled, ready and in-flight
events, the due-time histogram, searches (ids by prefix, dead letters by error text), and
Redis's clock and policy.

Reads that take ``group`` show one delivery group of a type with groups: its
lists, plus the type's schedule (events not fanned out yet, which every group
gets) and the group's retries (see ``keyspace.layout.TypeKeys.read_view``). Without
``group`` they read the type's keys as always.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..keyspace.groups import DEFAULT_GROUP, stored_group
from .base import StoreCore
from .groups import DeliveryGroups
from .layouts import Layouts
from .records import (
    DeadRecord,
    EventRecord,
    GroupEventRecord,
    QueueCounts,
    ReadyRecord,
    ScheduledRecord,
    _counts,
    _int,
    _opt_int,
    _text,
    sum_counts,
)


class Browsing:
    """Read-only views of a type's queues, one consistent read per call (``types``: a
    type's shards; ``groups``: reads that reach every delivery group)."""

    def __init__(self, core: StoreCore, types: Layouts, groups: DeliveryGroups):
        self._core = core
        self._types = types
        self._groups = groups

    async def counts(self, type_names: Iterable[str]) -> dict[str, QueueCounts]:
        """Per-type counts, next due time and backlog age: one read-only script per shard.

        A partitioned type counts as one: sums over the shards of every known
        layout (the earliest next due time, the oldest backlog). The calls for
        all types go in one pipeline (on a cluster, a few at a time).
        """
        names = sorted(type_names)
        per_name = [self._types.shards(name) for name in names]
        calls: list[tuple[Sequence[str], Sequence[Any]]] = [
            (self._counts_keys(s, None), []) for sl in per_name for s in sl
        ]
        replies = await self._core.calls("counts", calls)
        result: dict[str, QueueCounts] = {}
        at = 0
        for name, shard_list in zip(names, per_name, strict=True):
            result[name] = sum_counts([_counts(r) for r in replies[at : at + len(shard_list)]])
            at += len(shard_list)
        return result

    def _counts_keys(self, shard: str, group: str | None) -> Sequence[str]:
        """``counts.lua``'s keys: the read keys (see :meth:`StoreCore.read_keys`: for the type's own
        counts its schedule stands in for a retry schedule it must not count), with the
        limits HASH, for the paused flag, and the flow keys' lines (the next key's head)."""
        return self._core.read_keys("counts", shard, group)

    async def shard_counts(self, shard_list: Sequence[str]) -> list[QueueCounts]:
        """Counts of each shard on its own."""
        async with self._core.redis.pipeline(transaction=False) as pipe:
            for shard in shard_list:
                k = self._core.view(shard)
                waiting = self._core.keys.for_shard(shard).waiting  # the type's own
                for key in (k.scheduled, k.queued, k.inflight, k.dead, waiting):
                    pipe.zcard(key)
            replies = [int(x) for x in await pipe.execute()]
        return [
            QueueCounts(
                scheduled=replies[5 * i],
                ready=replies[5 * i + 1],
                in_flight=replies[5 * i + 2],
                dead=replies[5 * i + 3],
                waiting=replies[5 * i + 4],
            )
            for i in range(len(shard_list))
        ]

    async def inspect(self, shard: str, event_id: str) -> EventRecord:
        """Everything stored about one event, in one atomic read (in every delivery group)."""
        r = await self._groups.every_group(
            "group_inspect", shard, [event_id], ("inspect", [event_id])
        )
        if r[0] == b"groups":
            groups = {
                _text(r[i]) or "": GroupEventRecord(
                    retry_ms=_opt_int(r[i + 1]),
                    queued_score=float(r[i + 2]) if r[i + 2] else None,
                    lease_deadline_ms=_opt_int(r[i + 3]),
                    dead_at_ms=_opt_int(r[i + 4]),
                    attempts=_int(r[i + 5]),
                    error=_text(r[i + 6]),
                )
                for i in range(7, len(r), 7)
            }
            return EventRecord(
                now_ms=int(r[1]),
                envelope=r[2] or None,
                scheduled_ms=_opt_int(r[3]),
                queued_score=None,
                lease_deadline_ms=None,
                dead_at_ms=None,
                attempts=0,
                error=None,
                groups=groups,
                pending=_int(r[4]),
                priority=_int(r[5]),
                waiting_ms=_opt_int(r[6]),
            )
        return EventRecord(
            now_ms=int(r[0]),
            envelope=r[1] or None,
            scheduled_ms=_opt_int(r[2]),
            queued_score=float(r[3]) if r[3] else None,
            lease_deadline_ms=_opt_int(r[4]),
            dead_at_ms=_opt_int(r[5]),
            attempts=_int(r[6]),
            error=_text(r[7]),
            priority=_int(r[8]) if len(r) > 8 else 0,
            waiting_ms=_opt_int(r[9]) if len(r) > 9 else None,
        )

    async def scheduled_page(
        self, shard: str, offset: int, limit: int, *, group: str | None = None
    ) -> list[ScheduledRecord]:
        """Scheduled events ``offset .. offset+limit-1`` by due time, earliest first
        (with ``group``: the type's schedule and that group's retries, merged)."""
        r = await self._core.read("scheduled_list", shard, [offset, limit], group)
        return [
            ScheduledRecord(
                raw_id=r[i],
                due_ms=int(float(r[i + 1])),
                envelope=r[i + 2] or None,
                attempts=_int(r[i + 3]),
                error=_text(r[i + 4]),
            )
            for i in range(0, len(r), 5)
        ]

    async def group_counts(self, shard: str, groups: Iterable[str]) -> dict[str, QueueCounts]:
        """Counts per group (one read-only ``counts.lua`` per group, pipelined): ``scheduled``
        is the type's schedule plus the group's retries, ``backlog_age`` the group's."""
        names = sorted(groups)
        calls: list[tuple[Sequence[str], Sequence[Any]]] = [
            (self._counts_keys(shard, name), []) for name in names
        ]
        replies = await self._core.calls("counts", calls)
        return {name: _counts(r) for name, r in zip(names, replies, strict=True)}

    async def server_time_ms(self) -> int:
        """Redis's clock in ms (TIME), as the scripts see it: also a cheap check that Redis
        answers."""
        seconds, micros = await self._core.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000 + self._core.clock_offset_ms

    async def eviction_policy(self) -> str | None:
        """Redis's ``maxmemory-policy``, or None when CONFIG is not allowed."""
        try:
            reply: dict[Any, Any] = await self._core.redis.config_get("maxmemory-policy")
        except Exception:  # ACLs or managed Redis may forbid CONFIG
            return None
        value: Any = reply.get(b"maxmemory-policy") or reply.get("maxmemory-policy")
        return value.decode() if isinstance(value, bytes) else value

    async def idle_timeout(self) -> int | None:
        """Redis's ``timeout`` (seconds an idle connection is kept; 0: forever), or None when
        CONFIG is not allowed."""
        try:
            reply: dict[Any, Any] = await self._core.redis.config_get("timeout")
            value: Any = reply.get(b"timeout") or reply.get("timeout")
            return int(value)
        except Exception:  # ACLs or managed Redis may forbid CONFIG (or rename it)
            return None

    async def inflight_page(
        self, shard: str, offset: int, limit: int, *, group: str | None = None
    ) -> tuple[int, list[tuple[bytes, int, int]]]:
        """Redis's time (ms) and ``(id, lease deadline ms, attempts)`` of in-flight events
        (of ``group``; the default group's without)."""
        r = await self._core.read("inflight_list", shard, [offset, limit], group)
        page = [(r[i], int(float(r[i + 1])), _int(r[i + 2])) for i in range(1, len(r), 3)]
        return int(r[0]), page

    async def due_histogram(
        self, shard: str, bounds_ms: Sequence[int], *, group: str | None = None
    ) -> tuple[int, list[int]]:
        """Redis's time (ms) and scheduled counts per due-time range (see due_histogram.lua;
        with ``group``, the group's retries count too)."""
        r = await self._core.read("due_histogram", shard, list(bounds_ms), group)
        return int(r[0]), [int(x) for x in r[1:]]

    async def ready_page(
        self, shard: str, offset: int, limit: int, *, group: str | None = None
    ) -> tuple[int, list[ReadyRecord]]:
        """Redis's time (ms) and ready events ``offset .. offset+limit-1`` in the order
        consumers get them (of ``group``; the type's default group without)."""
        r = await self._core.read("ready_list", shard, [offset, limit], group)
        page = [
            ReadyRecord(
                raw_id=r[i],
                score=float(r[i + 1]),
                envelope=r[i + 2] or None,
                attempts=_int(r[i + 3]),
                error=_text(r[i + 4]),
            )
            for i in range(1, len(r), 5)
        ]
        return int(r[0]), page

    async def dead_find(
        self,
        shard: str,
        needle: str,
        offset: int,
        scan: int,
        limit: int,
        *,
        group: str | None = None,
    ) -> tuple[int, list[DeadRecord]]:
        """Dead letters whose error contains ``needle`` (lower case) among the ``scan`` from
        position ``offset``: where to continue, and up to ``limit`` matches (dead_find.lua)."""
        r = await self._core.read("dead_find", shard, [offset, scan, limit, needle], group)
        found = [
            DeadRecord(
                raw_id=r[i],
                failed_at_ms=int(float(r[i + 1])),
                envelope=r[i + 2] or None,
                attempts=_int(r[i + 3]),
                error=_text(r[i + 4]) or "",
            )
            for i in range(1, len(r), 5)
        ]
        return int(r[0]), found

    def id_sets(self, shard: str, groups: Sequence[str]) -> list[tuple[str, str, str]]:
        """``(state, group, key)`` of each sorted set that holds a shard's event ids by state:
        the type's own sets, then each named group's (the default group's retries too)."""
        k = self._core.view(shard)
        states = (
            ("scheduled", "scheduled"),
            ("ready", "queued"),
            ("in_flight", "inflight"),
            ("dead", "dead"),
        )
        sets = [(state, DEFAULT_GROUP, getattr(k, name)) for state, name in states]
        tk = self._core.keys.for_shard(shard)
        for group in groups:
            if stored_group(group) is None:  # the type's own sets, listed above, and its retries
                sets.append(("scheduled", group, tk.view().retries))
                continue
            view = tk.view(group)
            sets.extend((state, group, getattr(view, name)) for state, name in states)
        return sets

    async def scan_ids(
        self, key: str, pattern: str, count: int, calls: int, want: int
    ) -> tuple[list[bytes], bool]:
        """Members of the sorted set ``key`` matching the glob ``pattern``: ZSCAN with
        ``COUNT count``, at most ``calls`` times, stopping once ``want`` are found.
        Also whether the scan reached the set's end."""
        cursor: int = 0
        found: list[bytes] = []
        for _ in range(calls):
            cursor, items = await self._core.redis.zscan(key, cursor, match=pattern, count=count)
            found.extend(m for m, _ in items if isinstance(m, bytes))  # decode_responses=False
            if cursor == 0:
                return found, True
            if len(found) >= want:
                break
        return found, False
