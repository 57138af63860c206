"""The store's core: the clients, the keys, the scripts and the primitives that run them.

Every part of :class:`delayq.storage.store.Store` (one object per concern in this
package) is given the one :class:`StoreCore` and sends its scripts through it: one call
(:meth:`StoreCore.run`), one read-only call (:meth:`StoreCore.read`), and one loop for
many calls (:meth:`StoreCore.calls`: pipelined, a few at a time on a cluster, sent again
after a NOSCRIPT). The caches here (a shard's keys, a call's keys) are the only state the
parts share; each part declares and keeps its own. With ``store.py`` it is the only part
of the store that imports redis.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from .. import lua
from ..errors import NotReplicatedError, error_code
from ..keyspace.layout import KeyView, PrefixKeys
from ..keyspace.scripts import SCRIPT_KEYS, keys_for, through
from ..lua.shift import shifted
from .connect import Client

# the logger of delayq.storage.store, whichever part of the store logs
log = logging.getLogger("delayq.store")

# redis-py refuses EVALSHA in cluster pipelines: there calls go this many at a time
_CLUSTER_BATCH = 16
# how many times a script is loaded again for one call that keeps meeting NOSCRIPT
_LOADS = 3


class Script(AsyncScript):
    """A script that is loaded again as long as the server answers NOSCRIPT (a few times).

    redis-py's loads it once, on one connection, and runs it again on another: during a
    failover the two can reach different servers (the load the old master, the call the
    new one, which has no scripts: they are not replicated), and the NOSCRIPT of the
    second call reached the caller (a lease renewal, a claim). Every script is safe to
    run twice. Called on the store's client only (never with a pipeline).
    """

    async def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        """Run the script (``EVALSHA``), loading it first when the server lacks it."""
        keys = keys or ()
        client = client or self.registered_client
        for attempt in range(_LOADS + 1):
            try:
                return await client.evalsha(self.sha, len(keys), *keys, *(args or ()))
            except ResponseError as exc:
                if attempt == _LOADS or error_code(exc) != "NOSCRIPT":
                    raise
            await client.script_load(self.script)
        raise AssertionError("unreachable")


class StoreCore:
    """What the parts of :class:`delayq.storage.store.Store` share: the clients, the
    prefix's keys, the scripts, and running them on a shard's keys.

    ``redis`` serves ordinary commands and scripts; ``blocking`` serves BRPOP and
    pub/sub, which hold a connection while they wait (the arguments of
    :class:`~delayq.storage.store.Store`, which builds it).
    """

    def __init__(
        self,
        redis: Client,
        blocking: Client,
        prefix: str,
        min_replicas: int,
        replica_timeout_ms: int,
    ):
        if min_replicas and isinstance(redis, RedisCluster):
            raise ValueError("min_replicas is not supported on a Redis Cluster")
        self.redis = redis
        self.blocking = blocking
        self.min_replicas = min_replicas
        self.replica_timeout_ms = replica_timeout_ms
        self.keys = PrefixKeys(prefix)
        self.scripts = _scripts(redis, 0)
        """Every script by name (sent again with a shifted clock by :meth:`set_clock_offset`)."""
        self.clock_offset_ms = 0
        """How far ahead of Redis's clock the scripts run (tests only: ``set_clock_offset``)."""
        self._type_keys: dict[tuple[str, str | None], KeyView] = {}
        # (script, shard, group, last key sent) -> the call's keys
        self._call_keys: dict[tuple[str, str, str | None, str | None], tuple[str, ...]] = {}

    def set_clock_offset(self, offset_ms: int) -> None:
        """Tests only: run every script with Redis's clock ``offset_ms`` ahead (see
        :meth:`delayq.storage.store.Store.set_clock_offset`)."""
        self.clock_offset_ms = offset_ms
        self.scripts = _scripts(self.redis, offset_ms)

    def view(self, shard: str, group: str | None = None) -> KeyView:
        """The keys of a group's view of a shard (``TypeKeys.view``; None: the default group)."""
        keys = self._type_keys.get((shard, group))
        if keys is None:
            keys = self.keys.for_shard(shard).view(group)
            self._type_keys[shard, group] = keys
        return keys

    def script_keys(
        self, script: str, shard: str, group: str | None, last: str | None = None
    ) -> tuple[str, ...]:
        """The keys a per-type script takes (``keyspace.scripts.SCRIPT_KEYS``) for a group
        of a shard; with ``last``, only those up to that name (a call that needs no more)."""
        keys = self._call_keys.get((script, shard, group, last))
        if keys is None:
            names = SCRIPT_KEYS[script] if last is None else through(script, last)
            keys = keys_for(names, self.keys.for_shard(shard).named(group))
            self._call_keys[script, shard, group, last] = keys
        return keys

    def read_keys(self, script: str, shard: str, group: str | None) -> tuple[str, ...]:
        """The keys of a read-only script: the type's own (its default group's lists) for
        ``None``, else the group's read view (``TypeKeys.read_view``)."""
        return keys_for(SCRIPT_KEYS[script], self.keys.for_shard(shard).named(group, read=True))

    async def read(self, script: str, shard: str, args: Sequence[Any], group: str | None) -> Any:
        """Run a read-only script on the type, or on one group of it (see :meth:`read_keys`)."""
        keys = self.read_keys(script, shard, group)
        return await self.scripts[script](keys=keys, args=args)

    async def run(
        self,
        script: str,
        shard: str,
        args: Sequence[Any],
        *,
        group: str | None = None,
        last: str | None = None,
        durable: bool = False,
    ) -> Any:
        """Run a per-type script on a group's view of a shard (None: the default group);
        ``last``: give it its keys only up to that name (a call that needs no more);
        ``durable`` with ``min_replicas``: also wait for that many replicas to have it."""
        if durable and self.min_replicas:
            (reply,) = await self.pipelined(
                script, shard, [args], wait=True, group=group, last=last
            )
            return reply
        keys = self.script_keys(script, shard, group, last)
        return await self.scripts[script](keys=keys, args=args)

    async def calls(
        self,
        script: str,
        calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
        *,
        wait: bool = False,
    ) -> list[Any]:
        """Run one script once per ``(keys, args)``, pipelined; replies in order.

        Each call's keys share a hash tag; on a cluster the calls go a few at a
        time. Every script is safe to run twice, so after a NOSCRIPT (a
        restarted or flushed Redis, a promoted replica) the script is loaded and the
        whole pipeline sent again. With ``wait`` a ``WAIT min_replicas`` ends the pipeline (on
        its connection, so it counts the replicas that have these writes): its
        reply is the last one.
        """
        if not calls:
            return []
        source = self.scripts[script]
        if isinstance(self.redis, RedisCluster):  # (no min_replicas on a cluster)
            results: list[Any] = []
            for i in range(0, len(calls), _CLUSTER_BATCH):
                batch = calls[i : i + _CLUSTER_BATCH]
                results.extend(await asyncio.gather(*(source(keys=k, args=a) for k, a in batch)))
            return results
        # loaded again up to _LOADS times, as Script does: during failovers in a row the
        # load and the next pipeline can reach different masters (an enqueue raised
        # NoScriptError after two planned failovers when it was loaded once)
        for attempt in range(_LOADS + 1):
            async with self.redis.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    pipe.evalsha(source.sha, len(keys), *keys, *args)
                if wait:
                    pipe.execute_command("WAIT", self.min_replicas, self.replica_timeout_ms)
                try:
                    return list(await pipe.execute())
                except ResponseError as exc:
                    if attempt == _LOADS or error_code(exc) != "NOSCRIPT":
                        raise
                await self.redis.script_load(source.script)
        raise AssertionError("unreachable")

    async def pipelined(
        self,
        script: str,
        shard: str,
        calls: Sequence[Sequence[Any]],
        *,
        wait: bool = False,
        group: str | None = None,
        last: str | None = None,
    ) -> list[Any]:
        """Run a per-type script once per ``args`` on one view, in one pipeline (one slot).

        With ``wait`` and ``min_replicas``, raise or warn (see :meth:`_replicated`)
        unless that many replicas confirm the calls.
        """
        keys = self.script_keys(script, shard, group, last)
        wait = wait and self.min_replicas > 0
        replies = await self.calls(script, [(keys, args) for args in calls], wait=wait)
        if wait:
            self._replicated(int(replies.pop()), script, shard)
        return replies

    def _replicated(self, replicas: int, script: str, shard: str) -> None:
        if replicas >= self.min_replicas:
            return
        message = (
            f"{shard}: only {replicas} of the {self.min_replicas} replicas asked for "
            f"(min_replicas) confirmed the {script} within {self.replica_timeout_ms} ms; "
            "a failover now could undo it"
        )
        if script == "enqueue":
            raise NotReplicatedError(message + ". Enqueueing again is safe (same id, same event)")
        # an ack a failover undoes means the event runs again: at-least-once still holds
        log.warning("%s", message)


def _scripts(redis: Redis | RedisCluster, offset_ms: int) -> dict[str, Script]:
    names = (*lua.PER_TYPE, *lua.GROUPED, *lua.STANDALONE)
    return {name: Script(redis, shifted(lua.source(name), offset_ms)) for name in names}
