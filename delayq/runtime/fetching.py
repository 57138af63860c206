"""The fetching side of a :class:`~delayq.runtime.consumer.Consumer`: BRPOP, claim, slots.

A partitioned type has one fetch loop per partition (shard), each blocking in BRPOP
on its own connection; they share the consumer's handler :class:`Slots`, and each claim
takes at most its share of the free slots (see :mod:`delayq.runtime.consumer`). The
consumer owns a :class:`Fetcher` and the :class:`Slots` it shares with its handler tasks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

from .._pacing import Retrying, log_retry
from ..metrics import ServiceMetrics
from ..storage.store import Claimed, Store
from .consumer_settings import ConsumerSettings
from .flow_waits import FlowWaits
from .handler_tasks import HandlerTasks
from .settlement import Lease, Settlement

# the consumer's logger: the records keep the name they had before the split
log = logging.getLogger("delayq.consumer")

# A fetcher's longest wait between failed BRPOPs: one partition's fetcher fails when its
# cluster node does (killed, failing over), and must be back within about a second of
# the promotion; up to 5 s, it left events the scheduler had moved waiting in the ready
# list of a healthy node long after (issue 37). A try is one refused connection.
_FETCH_MAX_BACKOFF = 1.0
# The most entries one claim call takes. A claim costs Redis about 15 µs per entry
# (benchmarks/script_cost.py), and every other client waits while it runs: 64 keeps a
# call near 1 ms; more free slots are filled by the next claims, at once, without a BRPOP.
# It also bounds how many handler tasks one claim starts in one turn of the event loop.
CLAIM_MAX = 64


class Slots:
    """One consumer's handler slots: shared by its fetch loops (which take them) and its
    handler tasks (which give them back), and the figures reported about them."""

    __slots__ = (
        "_freed",
        "_wanted",
        "concurrency",
        "count_delivered",
        "reserved",
        "running",
        "set_in_flight",
        "shards",
        "started",
    )

    def __init__(self, concurrency: int):
        self.concurrency = concurrency
        self.running = 0
        self.reserved = 0  # slots promised to claims under way (several fetch loops)
        self.shards = 1  # fetch loops sharing the slots
        # lease (shard, id, claim token) -> (claim time in µs, Redis's clock; its task) of
        # each running handler: the heartbeat shows the longest-running ones
        # (Consumer.running_since), a cancel finds the task. The key is the lease tuple the
        # settlement holds, built once per delivery.
        self.started: dict[Lease, tuple[int, asyncio.Task[None]]] = {}
        # the in_flight gauge and delivered counter, bound at the first claim (when they
        # were first reported before): the history records neither, so the sink alone
        self.set_in_flight: Callable[[float], None] | None = None
        self.count_delivered: Callable[[int], None] | None = None
        # fetch loops waiting for a free slot wait on this; it is set (and cleared at
        # once) only when one has waited since the last set, so a finished handler
        # costs one test. asyncio's Event needs no running loop to be created.
        self._freed = asyncio.Event()
        self._wanted = False

    @property
    def free(self) -> int:
        """Slots neither running a handler nor promised to a claim under way."""
        return self.concurrency - self.running - self.reserved

    def reset(self) -> None:
        """A fresh wait for the consumer's next run (on its event loop)."""
        self._freed = asyncio.Event()
        self._wanted = False

    async def wait(self) -> None:
        """Wait until a handler ends (or a claim gives back what it did not use)."""
        self._wanted = True
        await self._freed.wait()

    def wake(self) -> None:
        """Wake every fetch loop waiting for a slot. Setting an asyncio event resolves every
        waiter's future at once, so clearing it straight away loses none, and each waits
        again only after :meth:`wait` anew."""
        self._wanted = False
        freed = self._freed
        freed.set()
        freed.clear()

    def ended(self, lease: Lease, report: bool) -> None:
        """A handler task ended (settled or not): its slot is free. ``report``: the
        service reports metrics (the in_flight gauge)."""
        self.running -= 1
        self.started.pop(lease, None)
        if report and self.set_in_flight is not None:
            self.set_in_flight(self.running)
        if self._wanted:
            self.wake()


class Fetcher:
    """BRPOP, claims and group registration of one consumer (type and group)."""

    def __init__(
        self,
        *,
        store: Store,
        metrics: ServiceMetrics,
        settings: ConsumerSettings,
        type_name: str,
        group: str | None,
        label: str,
        slots: Slots,
        settlement: Settlement,
        flow: FlowWaits,
        handle: Callable[[Claimed, int, Lease], Coroutine[Any, Any, None]],
        on_registered: Callable[[], None] | None = None,
    ):
        self.type_name = type_name
        self.group = group
        self.label = label
        self.stopping = False
        self._store = store
        self._metrics = metrics
        self._s = settings
        self._slots = slots
        self._settlement = settlement
        self._flow = flow
        self._handle = handle
        self._on_registered = on_registered  # called once its group is registered in Redis

    @property
    def max_deliveries(self) -> int:
        """Deliveries of an event to this consumer's group before it becomes a dead letter."""
        return 1 + self._s.retry_attempts

    async def register_group(self) -> None:
        """Make a named group exist in Redis (durably) before fetching its events."""
        if self.group is None:
            return
        retrying = Retrying()
        while not self.stopping:
            try:
                for shard in self._store.types.shards(self.type_name):
                    await self._store.types.register_type(shard)
                    await self._store.groups.register_group(shard, self.group, self.max_deliveries)
                if self._on_registered is not None:
                    self._on_registered()
                return
            except Exception as exc:  # loops never die: back off, go on
                self._metrics.increment("redis_errors", event_type=self.type_name)
                log.warning("%s: registering the group failed (%s)", self.label, exc)
                await retrying.sleep()

    async def fetch_all(self, handlers: HandlerTasks) -> None:
        """One fetch loop per shard of the type; shards of a layout that appears later
        (a partition count being changed, as the scheduler's sweeps learn) join."""
        block = max(0.05, self._s.polling_timeout)
        retrying = Retrying()
        while len(self._store.types.shards(self.type_name)) > 1 and not self.stopping:
            try:
                await self._store.connect()
                break
            except Exception as exc:  # loops never die: back off, go on
                log.warning("%s: connecting failed (%s)", self.label, exc)
                await retrying.sleep()
        async with anyio.create_task_group() as fetchers:
            started: set[str] = set()
            while not self.stopping:
                for shard in self._store.types.shards(self.type_name):
                    if shard not in started:
                        started.add(shard)
                        self._slots.shards = len(started)
                        fetchers.start_soon(self._fetch_loop, handlers, shard)
                await anyio.sleep(block)  # in-process check only: no Redis command

    async def _fetch_loop(self, handlers: HandlerTasks, shard: str) -> None:
        retrying = Retrying(most=_FETCH_MAX_BACKOFF)
        leased = self._settlement.leased  # never replaced
        slots = self._slots
        popped: list[bytes] = []  # a BRPOP'd entry whose claim has not gone through yet
        level = 0  # the priority level of its ready list
        drain = False  # the last claim filled its share of the slots: more may be waiting
        block = max(0.05, self._s.polling_timeout)
        while not self.stopping:
            free = slots.free
            if free <= 0:
                await slots.wait()
                continue
            try:
                if not popped and not drain:
                    got = await self._store.deliveries.pop_ready(shard, block, group=self.group)
                    if got is None:
                        continue
                    entry, level = got
                    popped.append(entry)
                    # other fetchers may have taken the slots while this one waited
                    free = slots.free
                    if free <= 0:
                        continue
                # each partition's claim takes its share of the free slots (all of
                # them with one partition), so no partition is starved by another
                share = max(len(popped), min(CLAIM_MAX, -(-free // slots.shards)))
                slots.reserved += share
                # A claim that ran must be read to the end, or its events wait
                # a whole lease for nothing: never cancel it half-way.
                try:
                    with anyio.CancelScope(shield=True):
                        now_us, claimed, throttle = await self._store.deliveries.claim_limited(
                            shard,
                            popped,
                            share - len(popped),
                            self._s.visibility_ms,
                            group=self.group,
                            level=level,
                        )
                        popped = []
                        drain = len(claimed) >= share
                        for c in claimed:
                            slots.running += 1
                            lease = (shard, c.raw_id, c.token)
                            leased.add(lease)
                            task = handlers.start_soon(self._handle, c, now_us, lease)
                            slots.started[lease] = (now_us, task)
                finally:
                    slots.reserved -= share
                    if slots.shards > 1:  # a fetcher may wait for slots this claim left
                        slots.wake()
                if claimed:
                    if slots.set_in_flight is None:
                        self._bind_claim_metrics()
                    assert slots.count_delivered is not None and slots.set_in_flight is not None
                    slots.count_delivered(len(claimed))
                    slots.set_in_flight(slots.running)
                if throttle is not None:  # flow limits held it back (delayq.runtime.flow_waits)
                    await self._flow.wait(shard, throttle)
                    drain = True  # claim again without BRPOP: the entries are still there
                elif self._flow.paused:
                    self._flow.claimed()
                retrying.reset()
            except Exception as exc:  # Redis down, connection killed, ...: back off, go on
                drain = False
                self._metrics.increment("redis_errors", event_type=self.type_name)
                log_retry(log, f"{self.label}: fetching", exc, retrying.delay)
                await retrying.sleep()

    def _bind_claim_metrics(self) -> None:
        view, name = self._metrics, self.type_name
        self._slots.count_delivered = view.bind_increment("delivered", name) or _ignore
        # in_flight goes to the sink alone: the history recorder keeps no gauge but lateness
        in_flight = view.sink_only().bind_gauge("in_flight", name)
        self._slots.set_in_flight = in_flight or _ignore


def _ignore(value: float) -> None:
    """A figure nobody records."""
