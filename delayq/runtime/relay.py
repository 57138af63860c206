"""The relay: hands parents' completions to their children's slots, and audits waiting
children (docs/WORKFLOWS.md, "Dependencies").

It runs in the scheduler's task group while the process leads (holds the scheduler
lock). Each completion is handed on in three steps, each one script on one slot:

1. ``read``: ``dep_work.lua`` reads the due completions and audits of a shard (a
   completion stays there until step 3).
2. ``applied``: the completions read in one call are grouped by child shard and applied
   with one script call per child shard: ``dep_apply.lua`` in an event type's,
   ``batch_apply.lua`` in a batch shard (a batch is a child of its members: docs/
   WORKFLOWS.md, "Batches"). Applying again changes nothing (each edge, each member,
   takes its first record).
3. ``relayed``: one ``dep_relayed.lua`` call forgets the children handed on of every
   completion read; a completion goes once all its children are.

A relay killed between any two steps leaves the completion in the parent's slot, and
the next leader hands it on again: no completion is lost or counted twice. An audit
links a waiting child's open edges again (``dep_link.lua``, idempotent) and applies the
answers of parents already done: that finishes an enqueue whose caller died between its
steps, and releases a child whose parent vanished without a completion by its policy.
Wake-ups (``dep:<shard>`` on the wake-up channel, published after an ack that completed
a parent) only make it faster: every dependency shard is looked at every ten scheduling
intervals, and each when its next work (a completion, an audit) is due. A pass reads the
shards in turn, one read each, until none has more due: a shard with much work (a large
fan-out, many audits) delays the others by one read, not by all of it. A batch shard's
look also sweeps it (:class:`~delayq.runtime.batch_sweep.BatchSweeper`: batches whose open
lease ran out, adds not confirmed within their grace, done batches past the retention).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import anyio
import anyio.lowlevel

from .._pacing import MAX_BACKOFF, wait_to_retry
from ..events import find_event_type
from ..keyspace.shards import is_batch_shard, parse_shard
from ..metrics import ServiceMetrics
from ..operations.dependencies import (
    AUDIT_MS,
    NotedShards,
    chunked,
    merge_answers,
    parent_shards,
)
from ..storage.dependencies import Audit, Completion
from ..storage.store import Store
from .batch_sweep import BatchSweeper

__all__ = ["STEP_HOOK", "Relay"]

log = logging.getLogger("delayq.relay")

# relay members read per call, children handed on per completion per call, children read
# per call in all (a call's completions are applied with one script call per child shard:
# a batch's members' completions, one child each, go 256 to a call)
_MEMBERS = 256
_CHILDREN = 256
_READ = 1024
# every this many scheduling intervals the relay reads the set of dependency shards and
# looks at each (a lost wake-up costs that much latency; unused, one SMEMBERS per sweep);
# between sweeps it looks at a shard when woken for it or when its next work is due
_SWEEP = 10
# the longest an audit waits before the next
_AUDIT_CAP_MS = 3_600_000

STEP_HOOK: Callable[[str], None] | None = None
"""Tests only: called with each step's name (``"read"``, ``"applied"``, ``"relayed"``,
``"audit-linked"``) after it, so a test can kill the process there."""


def _step(name: str) -> None:
    if STEP_HOOK is not None:
        STEP_HOOK(name)


class Relay:
    """The relay loop of one process (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        metrics: ServiceMetrics,
        *,
        interval: float,
        is_leader: Callable[[], bool],
        audit_ms: int = AUDIT_MS,
    ):
        self._store = store
        self._metrics = metrics
        self._interval = interval
        self._is_leader = is_leader
        self.audit_ms = audit_ms
        self._woken: set[str] = set()
        self._wake: anyio.Event | None = None
        self._next: dict[str, float] = {}  # shard -> when it has work next (monotonic s)
        self._last_all = -math.inf
        self._noted = NotedShards(store)  # dependency shards known to be recorded as such
        self.sweeper = BatchSweeper(store, self._partitions, self._noted)
        """The batch shards' sweep (open leases, unconfirmed adds, retention)."""

    def _keep_ms(self, shard: str) -> int | None:
        """How long the type of ``shard`` keeps results (its class, if defined here)."""
        cls = find_event_type(parse_shard(shard)[0])
        return None if cls is None else cls.event_results_ms

    def _partitions(self, name: str) -> int:
        cls = find_event_type(name)
        return cls.event_partitions if cls is not None else self._store.types.layouts(name)[0]

    def wake(self, shard: str | None = None) -> None:
        """Look at ``shard`` (None: every dependency shard) now."""
        if shard is None:
            self._last_all = -math.inf
        else:
            self._woken.add(shard)
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Hand on completions and audit while this process leads, until cancelled."""
        backoff = 0.1
        self._wake = wake = anyio.Event()
        while True:
            sleep_for = self._interval
            try:
                if self._is_leader():
                    sleep_for = await self._pass()
                else:
                    # a standby hands nothing on; once it leads it looks at every shard
                    self._woken.clear()
                    self._last_all = -math.inf
                backoff = 0.1
            except Exception as exc:  # loops never die: log, back off, go on
                self._metrics.increment("redis_errors")
                log.warning(
                    "relay pass failed (%s: %s); retrying in %.2fs",
                    type(exc).__name__,
                    exc,
                    backoff,
                )
                await wait_to_retry(wake, backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                self._wake = wake = anyio.Event()
                continue
            if not self._woken:
                with anyio.move_on_after(sleep_for):
                    await wake.wait()
            else:
                await anyio.lowlevel.checkpoint()  # never spin without letting others run
            self._wake = wake = anyio.Event()

    async def _pass(self) -> float:
        now = anyio.current_time()
        todo = set(self._woken)
        self._woken.clear()
        sweep = self._interval * _SWEEP
        if now - self._last_all >= sweep:
            self._last_all = now
            shards = await self._store.dependencies.dependency_shards()
            self._noted.known(shards)
            todo |= shards
        todo |= {s for s, at in self._next.items() if at <= now}
        # one read per shard in turn until none has more due: a shard with much due work (a
        # fan-out, its audits, a burst of completions) holds the others (those woken
        # meanwhile too) one read, not all of its work
        turn = sorted(todo)
        while turn:
            turn = [shard for shard in turn if await self._relay_once(shard)]
            if turn and self._woken:
                turn += sorted(self._woken.difference(turn))
                self._woken.clear()
        nearest = min(self._next.values(), default=math.inf)
        return max(0.0, min(nearest, self._last_all + sweep) - anyio.current_time())

    async def relay_shard(self, shard: str) -> None:
        """Hand on every due completion of ``shard`` and run its due audits (and, in a
        batch shard, its due sweep: :class:`~delayq.runtime.batch_sweep.BatchSweeper`)."""
        while await self._relay_once(shard):
            pass

    async def _relay_once(self, shard: str) -> bool:
        """Hand on the due completions and run the due audits of one read of ``shard``;
        True while more is due there (else its sweep, if a batch shard, and its next time
        are done)."""
        work = await self._store.dependencies.dep_work(
            shard,
            limit=_MEMBERS,
            per=_CHILDREN,
            audit_ms=self.audit_ms,
            audit_cap_ms=_AUDIT_CAP_MS,
            most=_READ,
        )
        _step("read")
        partial = False
        if work.completions:
            partial = not await self._hand_on(shard, work.completions)
        if work.audits:
            await self._audit(shard, work.audits)
        if partial or work.more or len(work.completions) + len(work.audits) >= _MEMBERS:
            return True
        wait = -1 if work.next_ms < 0 else max(0, work.next_ms - work.now_ms)
        if is_batch_shard(shard):
            swept = await self.sweeper.sweep(shard)
            if swept >= 0 and (wait < 0 or swept < wait):
                wait = swept
        if wait < 0:
            self._next.pop(shard, None)
        else:
            self._next[shard] = anyio.current_time() + wait / 1000
        return False

    async def _hand_on(self, shard: str, completions: list[Completion]) -> bool:
        """Apply completions read in one call to their children: one script call per child
        shard (``dep_apply.lua``, or ``batch_apply.lua`` for batches), then one to forget
        them all (``dep_relayed.lua``); True when every one is fully handed on."""
        kind = parse_shard(shard)[0]
        by_shard: dict[str, list[tuple[str, str, bytes]]] = {}
        to_batches: dict[str, dict[str, list[tuple[str, bytes]]]] = {}
        for c in completions:
            ref = f"{kind}\0{c.parent_id}"
            for cshard, cid in c.children:
                if not cshard:  # a child field gone already (handed on by a relay before us)
                    continue
                if is_batch_shard(cshard):
                    to_batches.setdefault(cshard, {}).setdefault(cid, []).append((ref, c.record))
                else:
                    by_shard.setdefault(cshard, []).append((cid, ref, c.record))
        for cshard, edges in by_shard.items():
            await self._store.dependencies.dep_apply(cshard, edges, self._keep_ms(cshard))
            _step("applied")
        for cshard, members in to_batches.items():
            ignored, _ = await self._store.batches.apply(cshard, members)
            if ignored:  # (the members are all of this shard's type)
                self._metrics.increment("batch_completions_ignored", ignored, event_type=kind)
                log.info("%d member completions came after their batch was done", ignored)
            _step("applied")
        done = await self._store.dependencies.dep_relayed_many(
            shard, [(c.member, c.lo + len(c.children) - 1) for c in completions]
        )
        _step("relayed")
        return all(done)

    async def _audit(self, shard: str, audits: list[Audit]) -> None:
        """Link waiting children's open edges again; apply the answers of parents done.

        The audits read in one call go together: one ``dep_link`` call per parent shard
        (:data:`~delayq.operations.dependencies.CHUNK` links at most), then ``dep_apply``
        calls for the answers, not a round trip per child (20,000 children of one parent
        audited one by one held the relay, and every other shard's completions, for
        ~12 s)."""
        by_shard: dict[str, list[tuple[str, str, str]]] = {}  # (parent type, id, child id)
        for a in audits:
            for ptype, pid in a.parents:
                for pshard in parent_shards(self._store, ptype, pid, self._partitions(ptype)):
                    by_shard.setdefault(pshard, []).append((ptype, pid, a.child_id))
        # a parent's shard not recorded yet (its type's new layout, say)
        await self._noted.note(by_shard)
        said: dict[tuple[str, str, str], list[bytes]] = {}
        for pshard, refs in by_shard.items():
            for part in chunked(refs):
                answers = await self._store.dependencies.dep_link(
                    pshard, [(pid, shard, cid) for _, pid, cid in part]
                )
                for ref, answer in zip(part, answers, strict=True):
                    said.setdefault(ref, []).append(answer)
        edges: list[tuple[str, str, bytes]] = []
        for (ptype, pid, cid), answers in said.items():
            answer = merge_answers(answers)
            if answer != b"p":
                edges.append((cid, f"{ptype}\0{pid}", answer))
        _step("audit-linked")
        for chunk in chunked(edges):
            await self._store.dependencies.dep_apply(shard, chunk, self._keep_ms(shard))
