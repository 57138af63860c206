"""The only module that talks to Redis: every queue operation is one command or one script.

``store`` knows key names and scripts but nothing of handlers or loops; the
scheduler, the consumers and the service call it. Its operations live in
``delayq/_store/``, one module per concern (mixins over ``_store.base.StoreBase``);
this module composes them into :class:`Store` and keeps what needs redis itself:
the clients, pipelines of scripts, and Redis's errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from . import lua
from ._store.base import _NKEYS, log
from ._store.browsing import Browsing
from ._store.dead import DeadLetters
from ._store.delivery import Delivery
from ._store.enqueueing import ENQUEUE_CHUNK as ENQUEUE_CHUNK
from ._store.enqueueing import Enqueueing
from ._store.records import (
    Claimed,
    DeadRecord,
    EventRecord,
    MoveResult,
    QueueCounts,
    ScheduledRecord,
    sum_counts,
)
from ._store.schedules import ScheduleStore
from ._store.scheduling import Scheduling
from ._store.workers import Workers
from .errors import NotReplicatedError, QueueFullError
from .keys import PrefixKeys

__all__ = [
    "Claimed",
    "DeadRecord",
    "EventRecord",
    "MoveResult",
    "QueueCounts",
    "ScheduledRecord",
    "Store",
    "WakeupListener",
    "sum_counts",
]


class Store(Enqueueing, Scheduling, Delivery, DeadLetters, Browsing, Workers, ScheduleStore):
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
        self._type_keys = {}
        self._scripts = {
            name: redis.register_script(lua.source(name))
            for name in (*lua.PER_TYPE, *lua.GROUPED, *lua.STANDALONE)
        }
        # what each attribute holds: see its declaration in delayq/_store/
        self._groups = {}
        self._known_types = set()
        self._layouts = {}
        self._batches = {}

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

    async def _per_type(self, script: str, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """Run one script once per ``(type name, args)``, pipelined; replies in order."""
        n = _NKEYS.get(script, 13)
        return await self._with_keys(script, [(self._k(name)[:n], args) for name, args in calls])

    async def _with_keys(
        self, script: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Run one script once per ``(keys, args)``, pipelined; replies in order.

        Each call's keys share a hash tag; on a cluster the calls go a few at a time.
        """
        if not calls:
            return []
        source = self._scripts[script]
        if isinstance(self.redis, RedisCluster):
            results: list[Any] = []
            for i in range(0, len(calls), 16):
                batch = [source(keys=keys, args=args) for keys, args in calls[i : i + 16]]
                results.extend(await asyncio.gather(*batch))
            return results
        for attempt in (1, 2):
            async with self.redis.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    pipe.evalsha(source.sha, len(keys), *keys, *args)
                try:
                    return list(await pipe.execute())
                except NoScriptError:
                    if attempt == 2:
                        raise
                    await self.redis.script_load(source.script)
        raise AssertionError("unreachable")

    async def _enqueue_now(
        self,
        type_name: str,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool,
        replace: bool,
    ) -> list[int]:
        """Enqueue now (``_send_enqueue``); Redis out of memory raises :class:`QueueFullError`."""
        try:
            return await self._send_enqueue(type_name, items, absolute=absolute, replace=replace)
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

    def wakeups(self) -> WakeupListener:
        """A subscription to the prefix's wake-up channel."""
        return WakeupListener(self.blocking.pubsub(), self.keys.wakeup_channel)


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
