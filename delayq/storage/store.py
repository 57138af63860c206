"""The only module that talks to Redis: every queue operation is one command or one script.

``store`` knows key names and scripts but nothing of handlers or loops; the
scheduler, the consumers and the service call it. Its operations live in
``delayq/storage/``, one object per concern (``store.deliveries.ack(...)``), each given
the one :class:`~delayq.storage.base.StoreCore` (the clients, the keys, the scripts and
running them) and the other parts it uses; this module builds them into :class:`Store`,
and holds the wake-up subscriptions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster

from ..keyspace.layout import PrefixKeys
from .base import StoreCore, log
from .batches import BatchStore
from .browsing import Browsing
from .connect import no_retry
from .dead import DeadLetters
from .delivery import Deliveries
from .dependencies import DependencyStore
from .enqueueing import ENQUEUE_CHUNK as ENQUEUE_CHUNK
from .enqueueing import Enqueueing
from .flow import FlowLimitsStore
from .format import FormatVersions
from .groups import DeliveryGroups
from .layouts import Layouts
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


class Store:
    """Queue operations on one Redis for one prefix, one part per concern.

    Per-type operations take a *shard*: the type name itself for an unpartitioned
    type, or ``"T#k/N"`` for partition ``k`` of ``N`` (see
    :mod:`delayq.keyspace.shards`); each shard is one key space on one cluster slot.
    ``redis`` serves ordinary commands and scripts; ``blocking`` (default: the same
    client) serves BRPOP and pub/sub, which hold a connection while they wait. Both
    must return bytes (``decode_responses=False``).
    """

    core: StoreCore
    """The clients, the prefix's keys, the scripts and the primitives every part uses."""
    groups: DeliveryGroups
    """Delivery groups: the registry, and scripts that reach every group."""
    limits: FlowLimitsStore
    """Flow limits: a type's (or group's) limits HASH."""
    types: Layouts
    """The prefix's type set: types, their partition layouts and shards."""
    enqueueing: Enqueueing
    """Enqueue, replace, cancel."""
    scheduling: Scheduling
    """The scheduler's lock, membership and moves; run-now."""
    deliveries: Deliveries
    """Pop, claim, ack, renew, fail."""
    dead: DeadLetters
    """Dead letters: list, count, requeue, purge."""
    browsing: Browsing
    """Read-only views: counts, pages, searches, Redis's clock and policy."""
    workers: Workers
    """Worker heartbeats and history rings."""
    schedules: ScheduleStore
    """Recurring schedules: definitions, state, the index."""
    format: FormatVersions
    """The stored-data format check."""
    results: OutcomeReads
    """Kept outcomes of types that keep results."""
    running: RunControl
    """Running handlers' progress and cancel signals."""

    def __init__(
        self,
        redis: Redis | RedisCluster,
        prefix: str,
        *,
        blocking: Redis | RedisCluster | None = None,
        min_replicas: int = 0,
        replica_timeout_ms: int = 1000,
    ):
        core = StoreCore(
            redis, redis if blocking is None else blocking, prefix, min_replicas, replica_timeout_ms
        )
        self.core = core
        self.groups = DeliveryGroups(core)
        self.limits = FlowLimitsStore(core, self.groups)
        self.types = Layouts(core, self.limits)
        self.enqueueing = Enqueueing(core, self.types, self.groups)
        self.scheduling = Scheduling(core, self.groups)
        self.deliveries = Deliveries(core)
        self.dead = DeadLetters(core)
        self.browsing = Browsing(core, self.types, self.groups)
        self.workers = Workers(core)
        self.schedules = ScheduleStore(core, self.types)
        self.format = FormatVersions(core)
        self.results = OutcomeReads(core)
        self.running = RunControl(core)
        self.dependencies = DependencyStore(core)
        self.batches = BatchStore(core)
        self._wakeup_turn = 0  # wake-up subscriptions made (a cluster's go round the nodes)

    @property
    def redis(self) -> Redis | RedisCluster:
        """The client for ordinary commands and scripts."""
        return self.core.redis

    @property
    def blocking(self) -> Redis | RedisCluster:
        """The client for BRPOP and pub/sub."""
        return self.core.blocking

    @property
    def keys(self) -> PrefixKeys:
        """The prefix's key names."""
        return self.core.keys

    @property
    def clock_offset_ms(self) -> int:
        """How far ahead of Redis's clock the scripts run (tests only: ``set_clock_offset``)."""
        return self.core.clock_offset_ms

    def set_clock_offset(self, offset_ms: int) -> None:
        """Tests only (``delayq.testing.advance``): run every script with Redis's clock
        ``offset_ms`` ahead, and :meth:`server_time_ms` too.

        The scripts that read the clock are sent again with the offset in their source
        (:func:`delayq.lua.shift.shifted`; loaded at their first call after NOSCRIPT);
        the others keep their SHA. A store never shifted runs the scripts as they are.
        """
        self.core.set_clock_offset(offset_ms)

    async def aclose(self) -> None:
        """Wait for coalesced enqueues still on their way (their callers are waiting too)."""
        await self.enqueueing.aclose()

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
