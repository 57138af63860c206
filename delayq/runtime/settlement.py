"""What becomes of a consumer's deliveries after their handlers: acks, failures, leases.

Successful deliveries are acked in batches by one task, so a busy consumer
sends one ack call for many events; failures are recorded as a retry or a dead
letter; and the lease of every delivery is renewed until its ack or failure
has been recorded.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from .._pacing import Retrying
from ..metrics import Metrics
from ..retry import Backoff, delay_seconds
from ..storage.store import Claimed, Store

__all__ = ["Lease", "Settlement", "delivery_fields"]

# the consumer's logger: these records are about its deliveries
log = logging.getLogger("delayq.consumer")

# The most deliveries one ack (or renew) call settles: about 9 µs of Redis time each
# (benchmarks/script_cost.py), so a call stays near 2 ms however many acks piled up
# while the last one was under way; the rest follow in the next calls, one at a time
# (a pipeline would hold the other clients just as long).
ACK_MAX = 256
# A stopping consumer gives its last acks at least this long, even with shutdown_grace=0.
_MIN_ACK_FLUSH = 2.0

# the outcome record of a handler that returned no value (delayq.results, MessagePack nil)
_NO_VALUE = b"om\xc0"

Lease = tuple[str, bytes, bytes]
"""One delivery's lease: (shard, id, claim token)."""


def delivery_fields(type_name: str, c: Claimed) -> dict[str, Any]:
    """Structured fields of a log record about one delivery (for JSON log formatters)."""
    return {"event_type": type_name, "event_id": c.id, "attempt": c.attempt}


class Settlement:
    """A consumer's leases from claim to ack or failure, the ack task's batches, failures.

    The consumer's per-event code touches the containers directly, without a
    call: ``leased.add(lease)`` when it claims, ``acks.append(lease)`` when a
    handler succeeded, then ``ack_wanted.set()`` if that made the list's first
    entry (acks in a non-empty list are flushed with it). ``leased`` is never
    replaced, so a reference to it stays valid; ``acks`` is, and
    ``ack_wanted`` is made anew by each :meth:`open`, so they are read afresh
    each time.
    """

    ack_wanted: asyncio.Event
    """Set when acks are waiting for the ack task (made by :meth:`open`; the ack task
    clears it). A plain asyncio event: the consumer is asyncio-only, and setting
    one that is already set costs a single attribute test per event."""

    def __init__(
        self,
        *,
        store: Store,
        metrics: Metrics,
        type_name: str,
        label: str,
        group: str | None,
        visibility_ms: int,
        retry_backoff: Backoff,
        shutdown_grace: float,
        keep_results_ms: int | None = None,
    ):
        self._store = store
        self._metrics = metrics
        self._type_name = type_name
        self._label = label
        self._group = group
        self._visibility_ms = visibility_ms
        self._retry_backoff = retry_backoff
        self._shutdown_grace = shutdown_grace
        # a type that keeps results: its acks go through ack_results with these records
        self._keep_ms = keep_results_ms
        self.results: dict[Lease, bytes] = {}
        """Lease -> outcome record of an acked delivery (types with ``results=``):
        filled by the consumer before it appends the lease to :attr:`acks`."""
        # (shard, id, token) of every delivery whose lease we hold, acked or not yet
        self.leased: set[Lease] = set()
        # the subset whose ack or fail call is under way: a renew racing it finds
        # the lease gone, which is no loss
        self._settling: set[Lease] = set()
        self.acks: list[Lease] = []
        self._acking: list[Lease] = []  # the batch of the ack call under way
        self._acks_closing = False
        self._acks_done: anyio.Event | None = None
        self.on_lost: Callable[[list[Lease]], None] | None = None
        """Called with the leases a renewal found lost (the consumer cancels their runs)."""

    def open(self) -> None:
        """Get ready for a run of the consumer (in its event loop), before its tasks start.

        Every handler of a previous run (a crashed one the service restarts) has
        ended: the leases of those that did not finish are dropped, so that their
        events come back when the leases expire instead of being renewed for ever.
        Acks a previous run could not send are kept, with their leases, for this one.
        """
        self.leased.intersection_update(self.acks)  # in place: the consumer holds the set
        if self.results:  # the outcome records of acks that were dropped go with them
            kept = set(self.acks)
            self.results = {lease: r for lease, r in self.results.items() if lease in kept}
        self._settling.clear()
        self.ack_wanted = asyncio.Event()
        if self.acks:  # the consumer only wakes the ack task when it adds the first ack
            self.ack_wanted.set()
        self._acks_closing = False
        self._acks_done = anyio.Event()

    # -- failures ----------------------------------------------------------------

    async def fail(self, c: Claimed, shard: str, error: str, *, dead: bool) -> None:
        """Record a failed delivery: a retry after the backoff, or a dead letter if ``dead``."""
        delay_ms = 0
        if not dead:
            try:
                delay_ms = math.ceil(1000 * delay_seconds(self._retry_backoff(c.attempt)))
            except Exception:
                log.exception(
                    "%s: retry_backoff(%d) failed; retrying in 1s", self._label, c.attempt
                )
                delay_ms = 1000
        retrying: Retrying | None = None  # made at the first failure
        lease = (shard, c.raw_id, c.token)
        self._settling.add(lease)
        for _ in range(5):
            try:
                code = await self._store.deliveries.fail(
                    shard,
                    c,
                    dead=dead,
                    delay_ms=delay_ms,
                    error=error[:4000],
                    group=self._group,
                    keep_ms=self._keep_ms,
                )
                break
            except Exception as exc:
                log.warning(
                    "%s %r: recording the failure failed (%s); retrying", self._label, c.id, exc
                )
                retrying = retrying or Retrying()
                await retrying.sleep()
        else:
            # The lease runs out and the event comes back; the attempt still counts.
            log.error(
                "%s %r: could not record the failure; its lease will expire",
                self._label,
                c.id,
                extra=delivery_fields(self._type_name, c),
            )
            code = -1
        self.leased.discard(lease)
        self._settling.discard(lease)
        self._metrics.increment("failed", event_type=self._type_name)
        if code == 0:  # the lease had gone: the failure changed nothing
            self._count_stale(1, "failure records")
        elif code == 2:
            self._metrics.increment("dead_lettered", event_type=self._type_name)
            log.error(
                "%s %r: dead letter after %d deliveries: %s",
                self._label,
                c.id,
                c.attempt,
                error,
                extra=delivery_fields(self._type_name, c),
            )
        elif code == 1:
            self._metrics.increment("retried", event_type=self._type_name)

    # -- acks --------------------------------------------------------------------

    async def _flush_acks(self) -> None:
        retrying: Retrying | None = None  # made at the first failure: none on the hot path
        while self.acks:
            batch, self.acks = self.acks[:ACK_MAX], self.acks[ACK_MAX:]
            self._acking = batch
            self._settling.update(batch)
            try:
                settled, unsettled, error = await self._ack_batch(batch)
            finally:
                self._acking = []
            self.leased.difference_update(settled)
            self._settling.difference_update(batch)
            if self._keep_ms is not None:
                for lease in settled:
                    self.results.pop(lease, None)
            if unsettled:
                # only these go again: a partition that took its acks is not held back by
                # one whose node failed (nor are its acks sent twice and counted stale)
                self.acks = unsettled + self.acks
                self._metrics.increment("redis_errors", event_type=self._type_name)
                retrying = retrying or Retrying()
                log.warning(
                    "%s: ack failed (%s); retrying in %.2fs", self._label, error, retrying.delay
                )
                await retrying.sleep()

    async def _ack_batch(
        self, batch: list[Lease]
    ) -> tuple[list[Lease], list[Lease], Exception | None]:
        """Send one batch's acks: one call per partition, sent together.

        Returns the leases settled, those to send again (their partition's call
        failed) and that failure. Counts the successes and the stale acks.
        """
        by_shard: dict[str, list[Lease]] = {}
        for lease in batch:
            by_shard.setdefault(lease[0], []).append(lease)
        if len(by_shard) == 1:  # the common case, without a gather
            try:
                outcomes: list[int | BaseException] = [await self._ack_call(batch[0][0], batch)]
            except Exception as exc:
                outcomes = [exc]
        else:
            outcomes = await asyncio.gather(
                *(self._ack_call(s, leases) for s, leases in by_shard.items()),
                return_exceptions=True,
            )
        settled: list[Lease] = []
        unsettled: list[Lease] = []
        error: Exception | None = None
        removed = 0
        for leases, outcome in zip(by_shard.values(), outcomes):
            if isinstance(outcome, Exception):
                unsettled += leases
                error = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                settled += leases
                removed += outcome
        # only the acks that removed their event succeeded; the rest found their lease
        # gone (expired and redelivered, replaced, cancelled) and changed nothing
        if removed:
            self._metrics.increment("succeeded", removed, event_type=self._type_name)
        if removed < len(settled):
            self._count_stale(len(settled) - removed, "acks")
        return settled, unsettled, error

    def _ack_call(self, shard: str, leases: list[Lease]) -> Awaitable[int]:
        """One partition's ack call; for a type that keeps results, with each delivery's
        outcome record (ack_results.lua)."""
        if self._keep_ms is None:
            return self._store.deliveries.ack(
                shard, [(i, t) for _, i, t in leases], group=self._group
            )
        # every acked lease of such a type has its record (the consumer notes it first);
        # a missing one would keep None rather than hold up the acks behind it
        results = self.results
        done = [(i, t, results.get((s, i, t), _NO_VALUE)) for s, i, t in leases]
        return self._store.deliveries.ack_results(shard, done, self._keep_ms, group=self._group)

    async def ack_loop(self) -> None:
        """The one task that sends acks, until :meth:`close_acks` and none are left.

        Acks that arrive while one call is under way go together in the next.
        Only this task sends acks, so a batch is never cancelled half-way by a
        second flush racing it.
        """
        done = self._acks_done
        assert done is not None
        wanted = self.ack_wanted
        while not (self._acks_closing and not self.acks):
            await wanted.wait()
            wanted.clear()  # acks that come during the flush set it again
            await self._flush_acks()
        done.set()

    async def close_acks(self) -> None:
        """Let the ack task send what is pending, then end; wait for that a while.

        Pending includes a batch the task may hold in a call under way right
        now. The wait is ``max(shutdown_grace, 2 s)``; acks Redis has not taken
        by then are logged (their events run again when their leases expire).
        """
        done = self._acks_done
        assert done is not None
        self._acks_closing = True
        self.ack_wanted.set()
        with anyio.move_on_after(max(self._shutdown_grace, _MIN_ACK_FLUSH)):
            await done.wait()
        if not done.is_set():
            log.error(
                "%s: Redis did not take the acks of %d finished events during the "
                "shutdown; they will run again when their leases expire",
                self._label,
                len(self.acks) + len(self._acking),
            )

    def _count_stale(self, n: int, what: str) -> None:
        self._metrics.increment("stale_outcomes", n, event_type=self._type_name)
        log.info(
            "%s: %d %s changed nothing: the lease had gone (expired and redelivered, "
            "replaced or cancelled)",
            self._label,
            n,
            what,
        )

    # -- leases ------------------------------------------------------------------

    async def renew_loop(self) -> None:
        """Renew every held lease each third of ``visibility_ms``, until cancelled."""
        period = self._visibility_ms / 3000
        leased = self.leased
        while True:
            await anyio.sleep(period)
            if not leased:
                continue
            by_shard: dict[str, list[tuple[bytes, bytes]]] = {}
            for shard, raw_id, token in leased:
                by_shard.setdefault(shard, []).append((raw_id, token))
            lost = []
            for shard, leases in by_shard.items():
                # shard by shard: one whose cluster node is away must not keep the others'
                # leases from being renewed (they expired, and ran again, issue 37)
                try:
                    for i in range(0, len(leases), ACK_MAX):  # bounded calls, as acks
                        lost += await self._store.deliveries.renew(
                            shard, leases[i : i + ACK_MAX], self._visibility_ms, group=self._group
                        )
                except Exception as exc:
                    self._metrics.increment("redis_errors", event_type=self._type_name)
                    log.warning("%s: renewing leases failed (%s)", self._label, exc)
            # an ack or fail that ran just before this renew ended the lease itself
            held = {p[1] for p in leased - self._settling}
            lost = [i for i in lost if i in held]
            if lost:
                self._metrics.increment("leases_lost", len(lost), event_type=self._type_name)
                log.warning(
                    "%s: lost the lease of %d events (expired, cancelled or replaced): %s",
                    self._label,
                    len(lost),
                    [i.decode("utf-8", "replace") for i in lost[:10]],
                )
                gone = set(lost)
                lost_leases = [p for p in leased if p[1] in gone]
                # in place: the consumer holds a reference to the set
                leased.difference_update(lost_leases)
                if self.on_lost is not None:  # another delivery may run them now: stop ours
                    self.on_lost(lost_leases)
