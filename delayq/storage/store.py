"""The only module that talks to Redis: every queue operation is one command or one script.

``store`` knows key names and scripts but nothing of handlers or loops; the
scheduler, the consumers and the service call it. Its operations live in
``delayq/storage/``, one module per concern, over the primitives of
``base.py`` (the keys of a shard, running scripts); this module
composes them into :class:`Store`, sets up its clients and scripts, and holds
the wake-up subscription.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster

from .. import lua
from ..keyspace.layout import PrefixKeys
from ..lua.shift import shifted
from .base import Script, log
from .browsing import Browsing
from .connect import no_retry
from .dead import DeadLetters
from .delivery import Deliveries
from .enqueueing import ENQUEUE_CHUNK as ENQUEUE_CHUNK
from .enqueueing import Enqueueing
from .flow import FlowLimitsStore
from .format import FormatVersions
from .records import (
    Claimed,
    DeadRecord,
    Enqueued,
    EventRecord,
    MoveResult,
    QueueCounts,
    ScheduledRecord,
    Throttle,
    sum_counts,
    token_flow_key,
)
from .results import OutcomeReads
from .running import RunControl
from .schedules import ScheduleStore
from .scheduling import Scheduling
from .workers import Workers

__all__ = [
    "Claimed",
    "DeadRecord",
    "Enqueued",
    "EventRecord",
    "MoveResult",
    "QueueCounts",
    "ScheduledRecord",
    "Store",
    "Throttle",
    "WakeupListener",
    "sum_counts",
    "token_flow_key",
]


class Store(
    Enqueueing,
    Scheduling,
    Deliveries,
    DeadLetters,
    Browsing,
    Workers,
    ScheduleStore,
    FlowLimitsStore,
    FormatVersions,
    OutcomeReads,
    RunControl,
):
    """Queue operations on one Redis for one prefix.

    Per-type operations take a *shard*: the type name itself for an unpartitioned
    type, or ``"T#k/N"`` for partition ``k`` of ``N`` (see
    :mod:`delayq.keyspace.shards`); each shard is one key space on one cluster slot. ``redis`` serves ordinary commands and scripts; ``blocking`` (default: the
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
        self._call_keys = {}
        self._keyed_claims = set()
        self._scripts = _scripts(redis, 0)
        # what each attribute holds: see its declaration in delayq/storage/
        self._groups = {}
        self._known_types = set()
        self._layouts = {}
        self._batches = {}
        self._wakeup_turn = 0  # wake-up subscriptions made (a cluster's go round the nodes)

    def set_clock_offset(self, offset_ms: int) -> None:
        """Tests only (``delayq.testing.advance``): run every script with Redis's clock
        ``offset_ms`` ahead, and :meth:`server_time_ms` too.

        The scripts that read the clock are sent again with the offset in their source
        (:func:`delayq.lua.shift.shifted`; loaded at their first call after NOSCRIPT);
        the others keep their SHA. A store never shifted runs the scripts as they are.
        """
        self.clock_offset_ms = offset_ms
        self._scripts = _scripts(self.redis, offset_ms)

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
        """A subscription to the prefix's wake-up channel.

        On a cluster every node hears every ``PUBLISH`` (the bus forwards them), so the
        subscription need not live on the channel's own node, the ``{prefix}`` one: the
        first is made there, and each one made again after a loss goes to the next node
        of the slot map in turn. A subscriber whose node failed thus hears wake-ups again
        at its next try, not after the promotion (until then the slot map still names
        the dead node for the channel).
        """
        blocking = self.blocking
        if isinstance(blocking, RedisCluster):
            nodes = sorted(blocking.get_nodes(), key=lambda n: n.name)
            self._wakeup_turn += 1
            node = (
                nodes[self._wakeup_turn % len(nodes)] if nodes and self._wakeup_turn > 1 else None
            )
            return WakeupListener(blocking.pubsub(node), self.keys.wakeup_channel, self.connect)
        return WakeupListener(blocking.pubsub(), self.keys.wakeup_channel, self.connect)

    def cancel_signals(self) -> WakeupListener:
        """A subscription to the prefix's cancel channel (messages: ``running.cancel_message``)."""
        return WakeupListener(self.blocking.pubsub(), self.keys.cancel_channel, self.connect)

    def result_wakeups(self) -> WakeupListener:
        """A subscription to the prefix's results channel (``"<shard> <id>"`` messages)."""
        return WakeupListener(self.blocking.pubsub(), self.keys.results_channel, self.connect)


def _scripts(redis: Redis | RedisCluster, offset_ms: int) -> dict[str, Script]:
    names = (*lua.PER_TYPE, *lua.GROUPED, *lua.STANDALONE)
    return {name: Script(redis, shifted(lua.source(name), offset_ms)) for name in names}


class WakeupListener:
    """Receives the type names that enqueues publish to wake the scheduler."""

    def __init__(self, pubsub: PubSub, channel: str, connect: Callable[[], Awaitable[None]]):
        self._pubsub = pubsub
        self._channel = channel
        self._connect = connect
        self._retry: tuple[Any, Any] | None = None  # (connection, its own retry policy)

    async def subscribe(self) -> None:
        """Start listening (again, after a disconnect)."""
        # a cluster client picks the pub/sub node by the channel's slot: without its
        # slot map loaded, the first SUBSCRIBE failed (KeyError) and was retried later
        await self._connect()
        await self._pubsub.subscribe(self._channel)
        # A lost subscription must raise, not be re-made by redis-py's retries: its owner
        # resubscribes and then looks at everything, since wake-ups published while it was
        # gone are missed. (The pooled connection gets its retries back in aclose.)
        connection = getattr(self._pubsub, "connection", None)
        if connection is not None and self._retry is None:
            self._retry = (connection, connection.retry)
            connection.retry = no_retry()

    async def next(self, timeout: float) -> str | None:
        """The next woken type name, or None when ``timeout`` passes first."""
        msg = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout)
        if msg is None or msg.get("type") != "message":
            return None
        data = msg["data"]
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)

    async def aclose(self) -> None:
        """Unsubscribe and give the connection back."""
        if self._retry is not None:
            connection, retry = self._retry
            connection.retry, self._retry = retry, None
        try:
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        except Exception:  # closing a broken connection may fail; nothing to keep
            log.debug("closing the wake-up subscription failed", exc_info=True)
