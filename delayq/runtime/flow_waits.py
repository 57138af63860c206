"""A consumer's side of flow limits: waiting, without polling, after a claim was held back.

``lua/claim.lua`` decides every limit atomically and answers how long to wait
(a :class:`~delayq.storage.store.Throttle`). This module only waits and reports:

- **paused** or **at the concurrency limit**: BLPOP on the group's wake list
  for at most ``wait_ms`` (≤ 1 s). Acks of a type with a concurrency limit, and
  every change of limits (resume included), push wake tokens there, one
  consumer per token (failures too); the timeout is the fallback (a slot freed by
  an expired lease, a token lost in a failover), so a change is seen within 1 s.
- **out of rate tokens**: sleep until the next token (≤ 1 s), plus a little
  jitter so that the processes waiting for it do not all claim at once.

Waiting costs Redis one claim per wait (and the BLPOP while it blocks): about
one command per second per paused consumer, about ``rate`` (plus the losers of
each token's race) while rate-limited. See docs/FLOW.md.

Reported (through the service's metrics): ``throttled`` (claims held back),
``throttled_time`` (``observe``: seconds spent waiting, ``outcome`` = the
reason), gauges ``paused`` (1/0), ``fleet_in_flight`` and ``concurrency_limit``
(for a partitioned type, the sums of its partitions' last figures).
"""

from __future__ import annotations

import random
import time

import anyio

from ..metrics import Metrics
from ..storage.store import Store, Throttle

__all__ = ["FlowWaits"]


class FlowWaits:
    """Waits of one consumer (type and group) held back by its flow limits."""

    def __init__(self, store: Store, metrics: Metrics, type_name: str, group: str | None):
        self._store = store
        self._metrics = metrics
        self._type_name = type_name
        self._group = group
        self.paused = False
        """True while the last claim found the group paused."""
        self._shards: dict[str, tuple[int, int, float]] = {}  # shard -> live, limit, when
        self.waiting: dict[str, Throttle] = {}
        """Shard -> the throttle its fetcher waits out right now (read by delayq.testing)."""
        self._scopes: dict[str, anyio.CancelScope] = {}

    async def wait(self, shard: str, throttle: Throttle) -> None:
        """Wait as ``throttle`` says (see the module's doc); report the time waited."""
        metrics, type_name = self._metrics, self._type_name
        metrics.increment("throttled", event_type=type_name)
        paused = throttle.reason == "paused"
        if paused != self.paused:
            self.paused = paused
            metrics.gauge("paused", 1.0 if paused else 0.0, event_type=type_name)
        if throttle.limit >= 0:
            live, limit = self._fleet(shard, throttle)
            metrics.gauge("fleet_in_flight", live, event_type=type_name)
            metrics.gauge("concurrency_limit", limit, event_type=type_name)
        seconds = throttle.wait_ms / 1000
        if seconds <= 0:
            return
        start = time.monotonic()
        self.waiting[shard] = throttle
        try:
            with anyio.CancelScope() as self._scopes[shard]:
                if throttle.reason == "rate":
                    await anyio.sleep(seconds + random.uniform(0, min(0.005, seconds / 4)))
                else:
                    await self._store.deliveries.wait_for_flow(shard, seconds, group=self._group)
        finally:
            self.waiting.pop(shard, None)
            self._scopes.pop(shard, None)
        metrics.observe(
            "throttled_time",
            time.monotonic() - start,
            event_type=type_name,
            outcome=throttle.reason,
        )

    def wake(self) -> None:
        """End every wait now: the clock moved (``delayq.testing.advance``), so the next
        claim may be allowed."""
        self.waiting.clear()
        for scope in self._scopes.values():
            scope.cancel()

    def _fleet(self, shard: str, throttle: Throttle) -> tuple[int, int]:
        """Live leases and the limit of the whole type: a partitioned type's claims see one
        partition's (its share), so the last figures of each partition are added up, the
        live leases of those seen within the last 2 s (the rest are not at their share)."""
        now = time.monotonic()
        self._shards[shard] = (throttle.live, throttle.limit, now)
        if len(self._shards) == 1:
            return throttle.live, throttle.limit
        live = sum(v[0] for v in self._shards.values() if now - v[2] < 2.0)
        return live, sum(v[1] for v in self._shards.values())

    def claimed(self) -> None:
        """A claim went through unthrottled: a paused gauge goes back to 0."""
        if self.paused:
            self.paused = False
            self._metrics.gauge("paused", 0.0, event_type=self._type_name)
