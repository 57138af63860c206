"""The only module that talks to Redis: every queue operation is one command or one script.

``store`` knows key names and scripts but nothing of handlers or loops; the
scheduler, the consumers and the service call it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

import msgspec
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from . import lua
from .errors import NotReplicatedError, QueueFullError
from .events import validate_name
from .keys import DEFAULT_GROUP, PrefixKeys
from .partitions import layout_member, parse_member, parse_shard, shards

__all__ = [
    "Claimed",
    "DeadRecord",
    "EventRecord",
    "MoveResult",
    "QueueCounts",
    "ScheduledRecord",
    "Store",
    "WakeupListener",
]

log = logging.getLogger("delayq.store")

# Enqueue sends at most this many events per script call: keeps each call
# well under a millisecond of Redis time.
ENQUEUE_CHUNK = 200

# How many keys of a group's view (keys.TypeKeys.view) each script takes:
# only what it uses, so a type without groups sends what it always sent.
_NKEYS = {
    "claim": 10, "renew": 10, "dead_list": 10, "migrate_out": 10, "move_due": 11, "cancel": 11,
    "group_register": 11, "ack": 12, "dead_purge": 12,
}  # fmt: skip
_STALE = b"stale"

_pack = msgspec.msgpack.Encoder().encode


@dataclass(frozen=True, slots=True)
class Claimed:
    """An event a consumer claimed: it holds the lease until ack, fail or expiry."""

    raw_id: bytes
    envelope: bytes
    attempt: int
    due_ms: int | None
    token: bytes

    @property
    def id(self) -> str:
        """The event id as text."""
        return self.raw_id.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class MoveResult:
    """What one ``move_due`` call did for one type."""

    moved: int
    more: bool
    next_ms: int | None
    now_ms: int
    dead: int
    queued: int
    late_ms: int
    missing: list[bytes]


@dataclass(frozen=True, slots=True)
class DeadRecord:
    """A dead letter as stored."""

    raw_id: bytes
    failed_at_ms: int
    envelope: bytes | None
    attempts: int
    error: str


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """How many events of one type are in each state, and how far behind its consumers are.

    Equality compares the four state counts only (the other fields change with time).
    """

    scheduled: int
    """Waiting for their due time (including retries waiting for their backoff)."""
    ready: int
    """Due and queued for a consumer, not claimed yet."""
    in_flight: int
    """Claimed by a consumer: a handler is running (or its process died and the lease runs)."""
    dead: int
    """Dead letters."""
    next_due_at: datetime | None = field(default=None, compare=False)
    """The earliest due time among scheduled events (UTC, Redis's clock); None when none."""
    backlog_age: float = field(default=0.0, compare=False)
    """Seconds the oldest due event that no consumer has claimed yet has been waiting past
    its due time (the head of the ready list, or a scheduled event the scheduler has not
    moved yet); 0 when nothing due is waiting."""
    due: int = field(default=0, compare=False)
    """Due events that no consumer has claimed yet: ``ready`` plus scheduled events whose
    due time has passed."""


@dataclass(frozen=True, slots=True)
class EventRecord:
    """Everything Redis holds about one event id, read at one instant (``now_ms``)."""

    now_ms: int
    envelope: bytes | None
    scheduled_ms: int | None
    queued_score: float | None
    lease_deadline_ms: int | None
    dead_at_ms: int | None
    attempts: int
    error: str | None


@dataclass(frozen=True, slots=True)
class ScheduledRecord:
    """A scheduled event as stored."""

    raw_id: bytes
    due_ms: int
    envelope: bytes | None
    attempts: int
    error: str | None


@dataclass(slots=True)
class _Batch:
    """Single-event enqueues of one (type, mode) waiting to be sent together."""

    pending: list[tuple[tuple[str, bytes, int], asyncio.Future[int]]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


def _int(value: Any) -> int:
    return int(value) if value not in (None, False, b"") else 0


def _opt_int(value: Any) -> int | None:
    return int(float(value)) if value not in (None, False, b"") else None


def _text(value: Any) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) and value else None


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


class Store:
    """Queue operations on one Redis for one prefix.

    Per-type operations take a *shard* where they say ``type_name``: the type
    name itself for an unpartitioned type, or ``"T#k/N"`` for partition ``k``
    of ``N`` (see :mod:`delayq.partitions`); each shard is one key space on one
    cluster slot. ``redis`` serves ordinary commands and scripts; ``blocking`` (default: the
    same client) serves BRPOP and pub/sub, which hold a connection while they
    wait. Both must return bytes (``decode_responses=False``).
    """

    def __init__(
        self,
        redis: Redis | RedisCluster,
        prefix: str,
        *,
        blocking: Redis | RedisCluster | None = None,
        min_replicas: int = 0,
        replica_timeout_ms: int = 1000,
    ):
        if min_replicas and isinstance(redis, RedisCluster):
            raise ValueError("min_replicas is not supported on a Redis Cluster")
        self.redis = redis
        self.min_replicas = min_replicas
        self.replica_timeout_ms = replica_timeout_ms
        self.blocking = blocking if blocking is not None else redis
        self.keys = PrefixKeys(prefix)
        self._type_keys: dict[tuple[str, str | None], tuple[str, ...]] = {}
        self._scripts = {
            name: redis.register_script(lua.source(name))
            for name in (*lua.PER_TYPE, *lua.GROUPED, *lua.STANDALONE)
        }
        # type -> its delivery groups as last seen; absent: no groups (or not
        # looked yet). Scripts that need every group's keys say when it is stale.
        self._groups: dict[str, tuple[str, ...]] = {}
        self._known_types: set[str] = set()
        # type -> partition counts it has events in (its layouts), as last read from
        # {prefix}:types or declared by this process's event classes
        self._layouts: dict[str, set[int]] = {}
        self._batches: dict[tuple[str, bool, bool], _Batch] = {}

    def _k(self, type_name: str, group: str | None = None) -> tuple[str, ...]:
        """The 13 keys of a group's view (``TypeKeys.view``); the default group's by default."""
        if group == DEFAULT_GROUP:
            group = None
        keys = self._type_keys.get((type_name, group))
        if keys is None:
            keys = self.keys.for_shard(type_name).view(group)
            self._type_keys[type_name, group] = keys
        return keys

    async def _run(
        self,
        script: str,
        type_name: str,
        args: Sequence[Any],
        client: Any = None,
        *,
        group: str | None = None,
    ) -> Any:
        keys = self._k(type_name, group)[: _NKEYS.get(script, 13)]
        return await self._scripts[script](keys=keys, args=args, client=client)

    # -- delivery groups -----------------------------------------------------------

    def _remember_groups(self, type_name: str, names: Sequence[Any]) -> tuple[str, ...] | None:
        groups = tuple(sorted(n.decode() if isinstance(n, bytes) else str(n) for n in names))
        if groups:
            self._groups[type_name] = groups
            return groups
        self._groups.pop(type_name, None)
        return None

    def _group_call(self, type_name: str, groups: Sequence[str]) -> tuple[list[str], list[Any]]:
        """Keys and leading arguments of a script in ``lua.GROUPED`` for ``groups``."""
        tk = self.keys.for_shard(type_name)
        keys = list(self._k(type_name))
        for group in groups:
            keys.extend(tk.group_keys(group))
        return keys, [len(groups), *groups]

    async def _every_group(
        self,
        script: str,
        type_name: str,
        args: Sequence[Any],
        ungrouped: tuple[str, Sequence[Any]] | None = None,
    ) -> Any:
        """Run ``script`` with the keys of every registered group of the type.

        While the type is not known to have groups, ``ungrouped`` (a per-type
        script and its arguments) runs instead; it answers ``stale`` if the
        type has groups after all. A group registered or removed by another
        process makes the script answer ``stale`` with the registered groups:
        the call is made again with those, so the move never misses a group.
        """
        groups = self._groups.get(type_name)
        if groups is None and ungrouped is None:
            groups = self._remember_groups(
                type_name, await self.redis.hkeys(self._k(type_name)[10])
            )
            if groups is None:
                return None
        for _ in range(20):
            if groups is None:
                assert ungrouped is not None
                reply = await self._run(ungrouped[0], type_name, ungrouped[1])
            else:
                keys, lead = self._group_call(type_name, groups)
                reply = await self._scripts[script](keys=keys, args=[*lead, *args])
            if not (isinstance(reply, list) and reply and reply[0] == _STALE):
                return reply
            groups = self._remember_groups(type_name, reply[1:])
            if groups is None and ungrouped is None:
                return None
        raise RuntimeError(f"{type_name}: its delivery groups keep changing; try again")

    async def register_group(self, type_name: str, group: str, max_deliveries: int) -> bool:
        """Register a delivery group of the type; True when it is new."""
        return bool(await self._run("group_register", type_name, [group, max_deliveries]))

    async def remove_group(self, type_name: str, group: str, batch: int = 500) -> int:
        """Drop a group and its pending deliveries (in bounded steps).

        Returns 1 removed, 0 no such group, -1 refused (the type's last group).
        """
        self._groups.pop(type_name, None)
        keys, lead = self._group_call(type_name, [group])
        first = "1"
        while True:
            code = int(await self._scripts["group_remove"](keys=keys, args=[*lead, batch, first]))
            if code != 2:
                return code
            first = "0"

    async def groups(self, type_name: str) -> dict[str, int]:
        """The type's registered groups and their max deliveries (empty: no named group)."""
        reply = await self.redis.hgetall(self._k(type_name)[10])
        return {(k.decode() if isinstance(k, bytes) else k): _int(v) for k, v in reply.items()}

    async def group_counts(self, type_name: str, groups: Iterable[str]) -> dict[str, QueueCounts]:
        """Counts per group: ``scheduled`` is the type's schedule plus the group's retries."""
        names = sorted(groups)
        tk = self.keys.for_shard(type_name)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(tk.scheduled)
            for name in names:
                k = tk.group_keys(name)
                for i in (0, 2, 3, 7):  # scheduled (retries), queued, inflight, dead
                    pipe.zcard(k[i])
            replies = [int(x) for x in await pipe.execute()]
        return {
            name: QueueCounts(
                replies[0] + replies[1 + 4 * i],
                replies[2 + 4 * i],
                replies[3 + 4 * i],
                replies[4 + 4 * i],
            )
            for i, name in enumerate(names)
        }

    async def _pipelined(
        self,
        script: str,
        type_name: str,
        calls: Sequence[Sequence[Any]],
        *,
        wait: bool = False,
        group: str | None = None,
    ) -> list[Any]:
        """Run one script several times in one pipeline (one slot: fine on a cluster too).

        Every script is safe to run twice, so after a NOSCRIPT (a restarted or
        flushed Redis) the script is loaded and the whole pipeline sent again.
        With ``wait`` and ``min_replicas``, a ``WAIT`` ends the pipeline: it
        runs on the same connection, so it counts the replicas that have this
        pipeline's writes (see :meth:`_replicated`).
        """
        if isinstance(self.redis, RedisCluster):
            # redis-py refuses EVALSHA in cluster pipelines: send a few calls at a time
            results: list[Any] = []
            for i in range(0, len(calls), 16):
                batch = [
                    self._run(script, type_name, args, group=group) for args in calls[i : i + 16]
                ]
                results.extend(await asyncio.gather(*batch))
            return results
        source = self._scripts[script]
        keys = self._k(type_name, group)[: _NKEYS.get(script, 13)]
        wait = wait and self.min_replicas > 0
        for attempt in (1, 2):
            async with self.redis.pipeline(transaction=False) as pipe:
                for args in calls:
                    pipe.evalsha(source.sha, len(keys), *keys, *args)
                if wait:
                    pipe.execute_command("WAIT", self.min_replicas, self.replica_timeout_ms)
                try:
                    replies = list(await pipe.execute())
                except NoScriptError:
                    if attempt == 2:
                        raise
                    await self.redis.script_load(source.script)
                    continue
            if wait:
                self._replicated(int(replies.pop()), script, type_name)
            return replies
        raise AssertionError("unreachable")

    async def _run_durable(
        self, script: str, type_name: str, args: Sequence[Any], *, group: str | None = None
    ) -> Any:
        """Run a script; with ``min_replicas``, also wait for that many replicas to have it."""
        if not self.min_replicas:
            return await self._run(script, type_name, args, group=group)
        (reply,) = await self._pipelined(script, type_name, [args], wait=True, group=group)
        return reply

    def _replicated(self, replicas: int, script: str, type_name: str) -> None:
        if replicas >= self.min_replicas:
            return
        message = (
            f"{type_name}: only {replicas} of the {self.min_replicas} replicas asked for "
            f"(min_replicas) confirmed the {script} within {self.replica_timeout_ms} ms; "
            "a failover now could undo it"
        )
        if script == "enqueue":
            raise NotReplicatedError(message + ". Enqueueing again is safe (same id, same event)")
        # an ack a failover undoes means the event runs again: at-least-once still holds
        log.warning("%s", message)

    # -- producers -----------------------------------------------------------

    async def register_type(self, type_name: str) -> None:
        """Record the type (layout) of shard ``type_name`` in the prefix's type set, once
        per process: ``T`` for an unpartitioned type, ``T#N`` for N partitions."""
        name, _, partitions = parse_shard(type_name)
        member = layout_member(name, partitions)
        if member not in self._known_types:
            await self.redis.sadd(self.keys.types, member)
            self._known_types.add(member)
            self.declare(name, partitions)

    def declare(self, type_name: str, partitions: int) -> None:
        """Note that ``type_name`` has (or may have) events in ``partitions`` partitions."""
        self._layouts.setdefault(type_name, set()).add(partitions)

    def layouts(self, type_name: str) -> tuple[int, ...]:
        """The partition counts the type is known to have events in (largest first)."""
        return tuple(sorted(self._layouts.get(type_name) or {1}, reverse=True))

    def shards(self, type_name: str) -> list[str]:
        """Every shard of every known layout of the type."""
        return [s for n in self.layouts(type_name) for s in shards(type_name, n)]

    async def forget_layout(self, type_name: str, partitions: int) -> None:
        """Drop a layout from the prefix's type set (after it has been emptied)."""
        member = layout_member(type_name, partitions)
        await self.redis.srem(self.keys.types, member)
        self._known_types.discard(member)
        known = self._layouts.get(type_name)
        if known is not None:
            known.discard(partitions)

    async def enqueue(
        self,
        type_name: str,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool,
        replace: bool,
    ) -> list[int]:
        """Add ``(id, envelope, ms)`` items of one type; return a code per item.

        Codes: 1 added, 0 kept (the id exists), 2 replaced. ``ms`` is a delay
        or, with ``absolute``, a unix time in ms. Chunks are pipelined.

        Single-event calls made concurrently (say, a hundred request handlers
        each enqueueing one event) are coalesced: events of one type and mode
        that arrive while a script call is on its way go together in the next
        call, one round trip for many. Each caller still gets its own code or
        exception, and the calls of one task keep their order.
        """
        if len(items) != 1:
            return await self._enqueue_now(type_name, items, absolute=absolute, replace=replace)
        key = (type_name, absolute, replace)
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = _Batch()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        batch.pending.append((items[0], future))
        if batch.task is None:
            batch.task = asyncio.create_task(self._flush(key, batch))
        return [await future]

    async def aclose(self) -> None:
        """Wait for coalesced enqueues still on their way (their callers are waiting too)."""
        tasks = [b.task for b in self._batches.values() if b.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    async def _flush(self, key: tuple[str, bool, bool], batch: _Batch) -> None:
        """Send coalesced single-event enqueues until none are waiting."""
        type_name, absolute, replace = key
        sending: list[tuple[tuple[str, bytes, int], asyncio.Future[int]]] = []
        try:
            await asyncio.sleep(0)  # the callers of this loop iteration join the first call
            while batch.pending:
                # a caller cancelled before its event was sent does not enqueue it
                sending = [p for p in batch.pending[:ENQUEUE_CHUNK] if not p[1].cancelled()]
                del batch.pending[:ENQUEUE_CHUNK]
                if not sending:
                    continue
                try:
                    codes = await self._enqueue_now(
                        type_name, [item for item, _ in sending], absolute=absolute,
                        replace=replace,
                    )  # fmt: skip
                except Exception as exc:
                    for _, future in sending:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for (_, future), code in zip(sending, codes, strict=True):
                        if not future.done():
                            future.set_result(code)
                sending = []
        finally:
            batch.task = None
            # Cancelled (the event loop is closing): no caller may wait forever.
            for _, future in sending + batch.pending:
                if not future.done():
                    future.cancel()
            batch.pending.clear()

    async def _enqueue_now(
        self,
        type_name: str,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool,
        replace: bool,
    ) -> list[int]:
        """One script call per chunk of ``ENQUEUE_CHUNK`` items, pipelined."""
        try:
            await self.register_type(type_name)
            # "<replace>:<call id>:<chunk no>": the call id lets the script tell
            # a retried chunk from a new call that encoded identical bytes.
            flags = f"{'1' if replace else '0'}:{uuid.uuid4().hex}"
            chunks = [items[i : i + ENQUEUE_CHUNK] for i in range(0, len(items), ENQUEUE_CHUNK)]
            # ":mp": each chunk's events go as two arguments, not three per event
            # (redis-py's packing of many small arguments costs more than the script)
            mode = "at:mp" if absolute else "delay:mp"
            calls = [
                [
                    mode,
                    f"{flags}:{n}",
                    self.keys.wakeup_channel,
                    type_name,
                    _pack([x for i, env, ms in chunk for x in (i, ms, len(env))]),
                    b"".join([env for _, env, _ in chunk]),
                ]
                for n, chunk in enumerate(chunks, 1)
            ]
            if len(calls) == 1:
                codes = [int(c) for c in await self._run_durable("enqueue", type_name, calls[0])]
            else:
                replies = await self._pipelined("enqueue", type_name, calls, wait=True)
                codes = [int(c) for reply in replies for c in reply]
            if 3 in codes:  # replaces of events already fanned out to delivery groups
                for i, code in enumerate(codes):
                    if code == 3:
                        codes[i] = await self._replace_fanned(type_name, items[i], absolute)
            return codes
        except ResponseError as exc:
            if "used memory > 'maxmemory'" not in str(exc):
                raise
            raise QueueFullError(
                f"Redis is out of memory (used memory > maxmemory, policy noeviction): "
                f"{type_name} events were not enqueued"
                + (
                    ""
                    if len(items) <= ENQUEUE_CHUNK
                    else f" (each group of {ENQUEUE_CHUNK} is all-or-nothing; earlier groups of "
                    f"this call may have been enqueued)"
                )
                + ". Handling queued events frees memory; or raise maxmemory."
            ) from exc

    async def _replace_fanned(
        self, type_name: str, item: tuple[str, bytes, int], absolute: bool
    ) -> int:
        """Replace one event for every group that still holds it; 2 replaced, 1 added."""
        event_id, envelope, ms = item
        args = [event_id, envelope, ms, "at" if absolute else "delay",
                self.keys.wakeup_channel, type_name]  # fmt: skip
        reply = await self._every_group("group_replace", type_name, args)
        if reply is None:  # the groups were all removed meanwhile: an ordinary replace
            (code,) = await self._enqueue_now(type_name, [item], absolute=absolute, replace=True)
            return code
        return int(reply)

    async def cancel(self, type_name: str, event_id: str) -> bool:
        """Remove a pending event (for every delivery group); True when one was removed.

        Dead letters stay (see :meth:`purge_dead`).
        """
        reply = await self._every_group(
            "group_cancel", type_name, [event_id], ("cancel", [event_id])
        )
        return bool(reply)

    # -- scheduler -----------------------------------------------------------

    async def known_types(self) -> set[str]:
        """Every type name used under the prefix (a partitioned type once).

        Also refreshes the layouts (partition counts) of every type, see :meth:`layouts`.
        """
        members = await self.redis.smembers(self.keys.types)
        names = set()
        found: dict[str, set[int]] = {}
        for member in members:
            try:
                # strict: a name that is not UTF-8 was not written by delayq, and
                # a replaced character would name other keys than the member's
                text = member.decode() if isinstance(member, bytes) else member
                name, partitions = parse_member(text)
                validate_name(name)
            except (TypeError, ValueError):  # UnicodeDecodeError is a ValueError
                log.warning("ignoring invalid event type name %r in %s", member, self.keys.types)
                continue
            names.add(name)
            found.setdefault(name, set()).add(partitions)
        for name, layouts in found.items():
            self._layouts.setdefault(name, set()).update(layouts)
        return names

    async def known_shards(self) -> set[str]:
        """Every shard of every type (and layout) used under the prefix."""
        return {s for name in await self.known_types() for s in self.shards(name)}

    async def scheduler_membership(self, token: str, ttl_ms: int, mode: str = "beat") -> list[str]:
        """Keep ``token`` in the scheduler membership (``beat``), leave it (``leave``), or
        evict another member (``evict:<token>``); return the live members, sorted."""
        reply = await self._scripts["members"](
            keys=[self.keys.members], args=[token, ttl_ms, mode, self.keys.wakeup_channel]
        )
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in reply)

    async def take_lock(self, token: str, ttl_ms: int) -> tuple[bool, str | None]:
        """Take or renew the scheduler lock.

        Returns whether ``token`` holds it now, and otherwise the holder's token.
        """
        r = await self._scripts["lock_take"](keys=[self.keys.scheduler_lock], args=[token, ttl_ms])
        if int(r[0]):
            return True, None
        holder = r[1] if len(r) > 1 else None
        return False, holder.decode("utf-8", "replace") if isinstance(holder, bytes) else holder

    async def steal_lock(self, holder: str, token: str, ttl_ms: int) -> bool:
        """Take the lock if ``holder`` (or nobody) still holds it; True when ``token`` holds it."""
        return bool(
            await self._scripts["lock_steal"](
                keys=[self.keys.scheduler_lock], args=[holder, token, ttl_ms]
            )
        )

    async def release_lock(self, token: str) -> bool:
        """Release the scheduler lock if ``token`` holds it, and tell the standbys so."""
        return bool(
            await self._scripts["lock_release"](
                keys=[self.keys.scheduler_lock], args=[token, self.keys.wakeup_channel]
            )
        )

    async def move_due(
        self, type_name: str, batch: int, visibility_ms: int, max_deliveries: int
    ) -> MoveResult:
        """Move due, expired and orphaned events of one type to its ready list.

        For a type with delivery groups: to the ready list of every group.
        """
        args = [batch, visibility_ms, max_deliveries]
        r = await self._every_group("group_move", type_name, args, ("move_due", args))
        next_ms = int(r[2])
        return MoveResult(
            moved=int(r[0]),
            more=bool(int(r[1])),
            next_ms=None if next_ms < 0 else next_ms,
            now_ms=int(r[3]),
            dead=int(r[4]),
            queued=int(r[5]),
            late_ms=int(r[6]),
            missing=list(r[7:]),
        )

    async def connect(self) -> None:
        """Discover a cluster's nodes before blocking calls start.

        Several fetchers (one per partition) starting at once on a cluster
        client that has not loaded its slot map yet each start loading it, and
        redis-py then replaces node objects under commands already sent: their
        replies (a popped entry) are lost. Nothing to do on a single Redis.
        """
        for client in {id(self.redis): self.redis, id(self.blocking): self.blocking}.values():
            if isinstance(client, RedisCluster):
                await client.initialize()

    async def peek_scheduled(self, shard: str, count: int) -> list[tuple[bytes, bytes, int]]:
        """Up to ``count`` scheduled events of a shard, earliest first: (id, envelope, due ms)."""
        k = self._k(shard)
        reply: list[Any] = await self.redis.zrange(k[1], 0, count - 1, withscores=True)
        if not reply:
            return []
        envelopes: list[Any] = await self.redis.hmget(k[0], [m for m, _ in reply])
        return [
            (cast(bytes, m), cast(bytes, env), int(score))
            for (m, score), env in zip(reply, envelopes, strict=True)
            if env is not None
        ]

    async def migrate_out(self, shard: str, event_id: bytes, envelope: bytes) -> bool:
        """Remove a copied event from a retired layout, if it is still that version."""
        return bool(await self._run("migrate_out", shard, [event_id, envelope]))

    async def has_groups(self, shard: str) -> bool:
        """True when the shard's type has named delivery groups."""
        return bool(await self.redis.exists(self._k(shard)[10]))

    def wakeups(self) -> WakeupListener:
        """A subscription to the prefix's wake-up channel."""
        return WakeupListener(self.blocking.pubsub(), self.keys.wakeup_channel)

    # -- consumers -----------------------------------------------------------

    async def pop_ready(
        self, type_name: str, timeout: float, *, group: str | None = None
    ) -> bytes | None:
        """Block up to ``timeout`` seconds for one ready entry of a group (BRPOP)."""
        reply = await self.blocking.brpop([self._k(type_name, group)[2]], timeout=timeout)
        return None if reply is None else cast(bytes, reply[1])

    async def claim(
        self,
        type_name: str,
        popped: Sequence[bytes],
        more: int,
        visibility_ms: int,
        *,
        group: str | None = None,
    ) -> tuple[int, list[Claimed]]:
        """Claim ``popped`` entries plus up to ``more`` from a group's ready list.

        Returns Redis's time in µs and the events now leased to the caller.
        """
        r = await self._run("claim", type_name, [visibility_ms, more, *popped], group=group)
        claimed = [
            Claimed(
                raw_id=r[i],
                envelope=r[i + 1],
                attempt=int(r[i + 2]),
                due_ms=int(r[i + 3]) if r[i + 3] else None,
                token=r[i + 4],
            )
            for i in range(1, len(r), 5)
        ]
        if any(c.attempt == 0 for c in claimed):
            missing = [c.raw_id for c in claimed if c.attempt == 0]
            log.warning(
                "%s: dropped %d queued ids that have no stored event: %s",
                type_name,
                len(missing),
                [m.decode("utf-8", "replace") for m in missing[:10]],
            )
            claimed = [c for c in claimed if c.attempt != 0]
        return int(r[0]), claimed

    async def ack(
        self, type_name: str, done: Iterable[tuple[bytes, bytes]], *, group: str | None = None
    ) -> int:
        """Settle deliveries whose handlers succeeded; stale tokens are ignored.

        The event leaves Redis with the last group that held it.
        """
        args = [x for pair in done for x in pair]
        return int(await self._run_durable("ack", type_name, args, group=group)) if args else 0

    async def renew(
        self,
        type_name: str,
        leases: Iterable[tuple[bytes, bytes]],
        visibility_ms: int,
        *,
        group: str | None = None,
    ) -> list[bytes]:
        """Extend leases; return the ids whose lease was lost."""
        args = [x for pair in leases for x in pair]
        if not args:
            return []
        return list(await self._run("renew", type_name, [visibility_ms, *args], group=group))

    async def fail(
        self,
        type_name: str,
        claimed: Claimed,
        *,
        dead: bool,
        delay_ms: int,
        error: str,
        group: str | None = None,
    ) -> int:
        """Retry after ``delay_ms`` or dead-letter; 0 when the lease was no longer ours."""
        args = [
            claimed.raw_id,
            claimed.token,
            "dead" if dead else "retry",
            delay_ms,
            error,
            self.keys.wakeup_channel,
            type_name,
        ]
        return int(await self._run("fail", type_name, args, group=group))

    # -- dead letters and stats ------------------------------------------------

    async def dead_letters(
        self, type_name: str, offset: int, limit: int, *, group: str | None = None
    ) -> list[DeadRecord]:
        """Dead letters of one type (and group), oldest first."""
        r = await self._run("dead_list", type_name, [offset, limit], group=group)
        return [
            DeadRecord(
                raw_id=r[i],
                failed_at_ms=int(float(r[i + 1])),
                envelope=r[i + 2] or None,
                attempts=_int(r[i + 3]),
                error=(r[i + 4] or b"").decode("utf-8", "replace"),
            )
            for i in range(0, len(r), 5)
        ]

    async def dead_ids(
        self, type_name: str, count: int, *, group: str | None = None
    ) -> list[bytes]:
        """The ``count`` oldest dead-letter ids."""
        key = self._k(type_name, group)[8]
        return cast(list[bytes], await self.redis.zrange(key, 0, count - 1))

    async def dead_count(self, type_name: str, *, group: str | None = None) -> int:
        """How many dead letters a group of the type has."""
        return int(await self.redis.zcard(self._k(type_name, group)[8]))

    async def requeue_dead(
        self,
        type_name: str,
        ids: Sequence[str | bytes],
        delay_ms: int,
        *,
        group: str | None = None,
    ) -> int:
        """Schedule dead letters again after ``delay_ms`` (for their group alone); return how many."""
        if not ids:
            return 0
        args = [delay_ms, self.keys.wakeup_channel, type_name, *ids]
        return int(await self._run("dead_requeue", type_name, args, group=group))

    async def purge_dead(
        self, type_name: str, ids: Sequence[str | bytes], *, group: str | None = None
    ) -> int:
        """Delete dead letters; return how many."""
        if not ids:
            return 0
        return int(await self._run("dead_purge", type_name, list(ids), group=group))

    async def counts(self, type_names: Iterable[str]) -> dict[str, QueueCounts]:
        """Per-type counts, next due time and backlog age: one read-only script per shard.

        A partitioned type counts as one: sums over the shards of every known
        layout (the earliest next due time, the oldest backlog). The calls for
        all types go in one pipeline (on a cluster, a few at a time).
        """
        names = sorted(type_names)
        per_name = [self.shards(name) for name in names]
        replies = await self._per_type("counts", [(s, []) for sl in per_name for s in sl])
        result: dict[str, QueueCounts] = {}
        at = 0
        for name, shard_list in zip(names, per_name, strict=True):
            result[name] = _sum_counts([_counts(r) for r in replies[at : at + len(shard_list)]])
            at += len(shard_list)
        return result

    async def shard_counts(self, shard_list: Sequence[str]) -> list[QueueCounts]:
        """Counts of each shard on its own."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in shard_list:
                k = self._k(shard)
                for i in (1, 3, 4, 8):
                    pipe.zcard(k[i])
            replies = [int(x) for x in await pipe.execute()]
        return [
            QueueCounts(
                scheduled=replies[4 * i], ready=replies[4 * i + 1],
                in_flight=replies[4 * i + 2], dead=replies[4 * i + 3],
            )
            for i in range(len(shard_list))
        ]  # fmt: skip

    async def inspect(self, type_name: str, event_id: str) -> EventRecord:
        """Everything stored about one event, in one atomic read."""
        r = await self._run("inspect", type_name, [event_id])
        return EventRecord(
            now_ms=int(r[0]),
            envelope=r[1] or None,
            scheduled_ms=_opt_int(r[2]),
            queued_score=float(r[3]) if r[3] else None,
            lease_deadline_ms=_opt_int(r[4]),
            dead_at_ms=_opt_int(r[5]),
            attempts=_int(r[6]),
            error=_text(r[7]),
        )

    async def scheduled_page(
        self, type_name: str, offset: int, limit: int
    ) -> list[ScheduledRecord]:
        """Scheduled events ``offset .. offset+limit-1`` by due time, earliest first."""
        r = await self._run("scheduled_list", type_name, [offset, limit])
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

    async def server_time_ms(self) -> int:
        """Redis's clock in ms (TIME): also a cheap check that Redis answers."""
        seconds, micros = await self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def _per_type(self, script: str, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """Run one script once per ``(type name, args)``, pipelined; replies in order."""
        if not calls:
            return []
        if isinstance(self.redis, RedisCluster):
            results: list[Any] = []
            for i in range(0, len(calls), 16):
                group = [self._run(script, name, args) for name, args in calls[i : i + 16]]
                results.extend(await asyncio.gather(*group))
            return results
        source = self._scripts[script]
        for attempt in (1, 2):
            async with self.redis.pipeline(transaction=False) as pipe:
                for name, args in calls:
                    keys = self._k(name)
                    pipe.evalsha(source.sha, len(keys), *keys, *args)
                try:
                    return list(await pipe.execute())
                except NoScriptError:
                    if attempt == 2:
                        raise
                    await self.redis.script_load(source.script)
        raise AssertionError("unreachable")

    # -- browsing (the dashboard) ------------------------------------------------

    async def run_now(self, type_name: str, event_id: str) -> bool:
        """Move a scheduled event to the ready list now; False when it is not scheduled."""
        return bool(await self._run("run_now", type_name, [event_id]))

    async def inflight_page(
        self, type_name: str, offset: int, limit: int
    ) -> tuple[int, list[tuple[bytes, int, int]]]:
        """Redis's time (ms) and ``(id, lease deadline ms, attempts)`` of in-flight events."""
        r = await self._run("inflight_list", type_name, [offset, limit])
        page = [(r[i], int(float(r[i + 1])), _int(r[i + 2])) for i in range(1, len(r), 3)]
        return int(r[0]), page

    async def due_histogram(
        self, type_name: str, bounds_ms: Sequence[int]
    ) -> tuple[int, list[int]]:
        """Redis's time (ms) and scheduled counts per due-time range (see due_histogram.lua)."""
        r = await self._run("due_histogram", type_name, list(bounds_ms))
        return int(r[0]), [int(x) for x in r[1:]]

    # -- worker heartbeats and history (see heartbeat.py, history.py) ----------

    async def heartbeat(self, worker_id: str, record: bytes, ttl_ms: int) -> int:
        """Write this worker's record with a TTL and index it; return Redis's time in ms."""
        keys = [self.keys.workers, self.keys.worker(worker_id)]
        return int(await self._scripts["heartbeat"](keys=keys, args=[worker_id, record, ttl_ms]))

    async def remove_worker(self, worker_id: str) -> bool:
        """Delete this worker's record and index entry; True when the record was there."""
        keys = [self.keys.workers, self.keys.worker(worker_id)]
        return bool(await self._scripts["worker_remove"](keys=keys, args=[worker_id]))

    async def worker_records(self, limit: int) -> list[bytes]:
        """Records of up to ``limit`` live workers (one ZRANGE and one MGET)."""
        ids = cast(list[bytes], await self.redis.zrange(self.keys.workers, 0, limit - 1))
        if not ids:
            return []
        base = self.keys.worker("").encode()
        values = cast(list[bytes | None], await self.redis.mget([base + i for i in ids]))
        return [v for v in values if v]  # records that expired since the index was pruned

    async def add_history(
        self,
        items: Sequence[tuple[str, bytes]],
        *,
        minute_slots: int,
        coarse_seconds: int,
        coarse_slots: int,
        ttl_ms: int,
    ) -> None:
        """Merge ``(type name, packed aggregate)`` items into the history rings (one script)."""
        if not items:
            return
        keys = [
            key
            for name, _ in items
            for key in (self.keys.history(name, "minute"), self.keys.history(name, "coarse"))
        ]
        args: list[Any] = [minute_slots, coarse_seconds, coarse_slots, ttl_ms]
        args.extend(packed for _, packed in items)
        await self._scripts["history_add"](keys=keys, args=args)

    async def history_ring(self, type_name: str, ring: str, slots: int) -> list[bytes | None]:
        """Every slot of one history ring (HMGET of at most ``slots`` fields)."""
        fields = [str(i) for i in range(slots)]
        return cast(
            list[bytes | None], await self.redis.hmget(self.keys.history(type_name, ring), fields)
        )

    async def eviction_policy(self) -> str | None:
        """Redis's ``maxmemory-policy``, or None when CONFIG is not allowed."""
        try:
            reply: dict[Any, Any] = await self.redis.config_get("maxmemory-policy")
        except Exception:  # ACLs or managed Redis may forbid CONFIG
            return None
        value: Any = reply.get(b"maxmemory-policy") or reply.get("maxmemory-policy")
        return value.decode() if isinstance(value, bytes) else value


def _counts(r: Sequence[Any]) -> QueueCounts:
    scheduled, ready, in_flight, dead = (int(x) for x in r[:4])
    next_due, overdue, head, now = int(r[4]), int(r[5]), r[6], int(r[7])
    oldest: int | None = None
    if overdue and next_due >= 0:
        oldest = next_due
    if ready and head:
        due_text = head.split(b":", 1)[0]
        if due_text.isdigit():
            oldest = int(due_text) if oldest is None else min(oldest, int(due_text))
    return QueueCounts(
        scheduled=scheduled,
        ready=ready,
        in_flight=in_flight,
        dead=dead,
        next_due_at=_utc(next_due) if next_due >= 0 else None,
        backlog_age=max(0, now - oldest) / 1000 if oldest is not None else 0.0,
        due=ready + overdue,
    )


def _sum_counts(parts: Sequence[QueueCounts]) -> QueueCounts:
    """One type's counts from its shards' (a single shard's are returned as they are)."""
    if len(parts) == 1:
        return parts[0]
    dues = [p.next_due_at for p in parts if p.next_due_at is not None]
    return QueueCounts(
        scheduled=sum(p.scheduled for p in parts),
        ready=sum(p.ready for p in parts),
        in_flight=sum(p.in_flight for p in parts),
        dead=sum(p.dead for p in parts),
        next_due_at=min(dues) if dues else None,
        backlog_age=max(p.backlog_age for p in parts),
        due=sum(p.due for p in parts),
    )


class WakeupListener:
    """Receives the type names that enqueues publish to wake the scheduler."""

    def __init__(self, pubsub: PubSub, channel: str):
        self._pubsub = pubsub
        self._channel = channel

    async def subscribe(self) -> None:
        """Start listening (again, after a disconnect)."""
        await self._pubsub.subscribe(self._channel)

    async def next(self, timeout: float) -> str | None:
        """The next woken type name, or None when ``timeout`` passes first."""
        msg = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout)
        if msg is None or msg.get("type") != "message":
            return None
        data = msg["data"]
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)

    async def aclose(self) -> None:
        """Unsubscribe and give the connection back."""
        try:
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        except Exception:  # closing a broken connection may fail; nothing to keep
            log.debug("closing the wake-up subscription failed", exc_info=True)
