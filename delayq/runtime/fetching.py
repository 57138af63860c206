"""The fetching side of a :class:`~delayq.runtime.consumer.Consumer`: BRPOP, claim, slots.

A partitioned type has one fetcher per partition (shard), each blocking in BRPOP
on its own connection; they share the consumer's handler slots, and each claim
takes at most its share of the free slots (see :mod:`delayq.runtime.consumer`).
A mixin of the consumer: its state is the consumer's, declared here for the type
checker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

from .._pacing import Retrying
from ..metrics import ServiceMetrics
from ..storage.store import Claimed, Store
from .consumer_settings import ConsumerSettings
from .flow_waits import FlowWaits
from .handler_tasks import HandlerTasks
from .settlement import Settlement

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


class Fetching:
    """BRPOP, claims and handler slots of one consumer (the state is the consumer's)."""

    type_name: str
    group: str | None
    label: str
    concurrency: int
    _store: Store
    _metrics: ServiceMetrics
    _settlement: Settlement
    _flow: FlowWaits
    _stopping: bool
    _running: int
    _reserved: int
    _n_shards: int
    _started: dict[bytes, tuple[bytes, int]]
    _slot_freed: asyncio.Event
    _slot_wanted: bool
    _on_registered: Callable[[], None] | None
    _set_in_flight: Callable[[float], None] | None
    _count_delivered: Callable[[int], None] | None
    _s: ConsumerSettings
    _handle: Callable[[Claimed, int, str], Coroutine[Any, Any, None]]

    @property
    def max_deliveries(self) -> int:
        """Deliveries of an event to this consumer's group before it becomes a dead letter."""
        return 1 + self._s.retry_attempts

    async def _register_group(self) -> None:
        """Make a named group exist in Redis (durably) before fetching its events."""
        if self.group is None:
            return
        retrying = Retrying()
        while not self._stopping:
            try:
                for shard in self._store.shards(self.type_name):
                    await self._store.register_type(shard)
                    await self._store.register_group(shard, self.group, self.max_deliveries)
                if self._on_registered is not None:
                    self._on_registered()
                return
            except Exception as exc:  # loops never die: back off, go on
                self._metrics.increment("redis_errors", event_type=self.type_name)
                log.warning("%s: registering the group failed (%s)", self.label, exc)
                await retrying.sleep()

    async def _wait_for_slot(self) -> None:
        self._slot_wanted = True
        await self._slot_freed.wait()

    def _free_slot(self) -> None:
        """Wake every fetcher waiting for a slot (a handler that ends calls it only
        when one waits). Setting an asyncio event resolves every waiter's future at
        once, so clearing it straight away loses none, and each waits again only
        after setting ``_slot_wanted`` anew."""
        self._slot_wanted = False
        freed = self._slot_freed
        freed.set()
        freed.clear()

    async def _fetch_all(self, handlers: HandlerTasks) -> None:
        """One fetch loop per shard of the type; shards of a layout that appears later
        (a partition count being changed, as the scheduler's sweeps learn) join."""
        block = max(0.05, self._s.polling_timeout)
        retrying = Retrying()
        while len(self._store.shards(self.type_name)) > 1 and not self._stopping:
            try:
                await self._store.connect()
                break
            except Exception as exc:  # loops never die: back off, go on
                log.warning("%s: connecting failed (%s)", self.label, exc)
                await retrying.sleep()
        async with anyio.create_task_group() as fetchers:
            started: set[str] = set()
            while not self._stopping:
                for shard in self._store.shards(self.type_name):
                    if shard not in started:
                        started.add(shard)
                        self._n_shards = len(started)
                        fetchers.start_soon(self._fetch_loop, handlers, shard)
                await anyio.sleep(block)  # in-process check only: no Redis command

    async def _fetch_loop(self, handlers: HandlerTasks, shard: str) -> None:
        retrying = Retrying(most=_FETCH_MAX_BACKOFF)
        leased = self._settlement.leased  # never replaced
        popped: list[bytes] = []  # a BRPOP'd entry whose claim has not gone through yet
        drain = False  # the last claim filled its share of the slots: more may be waiting
        block = max(0.05, self._s.polling_timeout)
        while not self._stopping:
            free = self.concurrency - self._running - self._reserved
            if free <= 0:
                await self._wait_for_slot()
                continue
            try:
                if not popped and not drain:
                    entry = await self._store.pop_ready(shard, block, group=self.group)
                    if entry is None:
                        continue
                    popped.append(entry)
                    # other fetchers may have taken the slots while this one waited
                    free = self.concurrency - self._running - self._reserved
                    if free <= 0:
                        continue
                # each partition's claim takes its share of the free slots (all of
                # them with one partition), so no partition is starved by another
                share = max(len(popped), min(CLAIM_MAX, -(-free // self._n_shards)))
                self._reserved += share
                # A claim that ran must be read to the end, or its events wait
                # a whole lease for nothing: never cancel it half-way.
                try:
                    with anyio.CancelScope(shield=True):
                        now_us, claimed, throttle = await self._store.claim_limited(
                            shard,
                            popped,
                            share - len(popped),
                            self._s.visibility_ms,
                            group=self.group,
                        )
                        popped = []
                        drain = len(claimed) >= share
                        for c in claimed:
                            self._running += 1
                            self._started[c.token] = (c.raw_id, now_us)
                            leased.add((shard, c.raw_id, c.token))
                            handlers.start_soon(self._handle, c, now_us, shard)
                finally:
                    self._reserved -= share
                    if self._n_shards > 1:  # a fetcher may wait for slots this claim left
                        self._free_slot()
                if claimed:
                    if self._set_in_flight is None:
                        self._bind_claim_metrics()
                    assert self._count_delivered is not None and self._set_in_flight is not None
                    self._count_delivered(len(claimed))
                    self._set_in_flight(self._running)
                if throttle is not None:  # flow limits held it back (delayq.runtime.flow_waits)
                    await self._flow.wait(shard, throttle)
                    drain = True  # claim again without BRPOP: the entries are still there
                elif self._flow.paused:
                    self._flow.claimed()
                retrying.reset()
            except Exception as exc:  # Redis down, connection killed, ...: back off, go on
                drain = False
                self._metrics.increment("redis_errors", event_type=self.type_name)
                log.warning(
                    "%s: fetching failed (%s: %s); retrying in %.2fs",
                    self.label,
                    type(exc).__name__,
                    exc,
                    retrying.delay,
                )
                await retrying.sleep()

    def _bind_claim_metrics(self) -> None:
        view, name = self._metrics, self.type_name
        self._count_delivered = view.bind_increment("delivered", name) or _ignore
        # in_flight goes to the sink alone: the history recorder keeps no gauge but lateness
        in_flight = view.sink_only().bind_gauge("in_flight", name)
        self._set_in_flight = in_flight or _ignore


def _ignore(value: float) -> None:
    """A figure nobody records."""
