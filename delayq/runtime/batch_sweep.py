"""The sweep of the batch shards (docs/WORKFLOWS.md, "Batches"): what finishes a batch
whose producer died between its steps, and what removes done batches.

The relay (:mod:`delayq.runtime.relay`), while its process leads, sweeps a batch shard
each time it looks at it: :class:`BatchSweeper` closes the batches whose open lease ran
out (their producer died or stalled), settles the adds not confirmed within their grace
(linked again: pending, confirmed; done, applied; never enqueued, dropped: the steps of
an add are :mod:`delayq.operations.batches`'), links a closed batch's pending members
again when none has finished for a while (a member gone without a completion counts as
vanished, so no batch waits for ever), and removes done batches past the retention.
Each step is one script on the batch's slot, or the add's own idempotent linking, so a
sweep killed anywhere loses nothing: the next leader's does it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..operations.batch_reads import RETENTION_MS
from ..operations.batches import AUDIT_MS, GRACE_MS, link_members
from ..operations.dependencies import NotedShards
from ..storage.store import Store

__all__ = ["BatchSweeper"]

log = logging.getLogger("delayq.batches")

_AUDIT_CAP_MS = 3_600_000  # the longest between two audits of a batch
_AUDITED = 2000  # members looked at per batch per audit (the rest at its next ones)
_SWEPT = 64  # of each kind of sweep work per look


class BatchSweeper:
    """The relay's look at a batch shard: closes the batches whose open lease ran out,
    settles adds not confirmed within their grace, removes done batches past the
    retention. Each step is idempotent, so a sweeper killed anywhere loses nothing."""

    def __init__(self, store: Store, partitions: Callable[[str], int], noted: NotedShards):
        self._store = store
        self._partitions = partitions
        self._noted = noted  # the relay's: the dependency shards known to be recorded
        self._cursors: dict[str, int] = {}  # batch id -> where its audit goes on
        self.retention_ms = RETENTION_MS
        self.grace_ms = GRACE_MS
        self.audit_ms = AUDIT_MS

    async def audit(self, batch_id: str) -> None:
        """Link a closed batch's pending members again (up to :data:`_AUDITED` members
        looked at; the next audit goes on from there): a member done or gone hands its
        record (``"vanished"``: a failure) to the batch now. Adds not confirmed yet are
        the unconfirmed sweep's."""
        store = self._store
        cursor, looked, pending = self._cursors.get(batch_id, 0), 0, []
        while looked < _AUDITED:
            cursor, page = await store.batches.members(batch_id, cursor, 500)
            looked += len(page)
            pending += [ref for ref, record in page if not record]
            if cursor == 0:
                break
        self._cursors[batch_id] = cursor
        pending = [
            r for r in pending if r not in await store.batches.unconfirmed(batch_id, pending)
        ]
        await link_members(
            store, batch_id, pending, self._partitions, self._noted.note, missing="ignore"
        )

    async def sweep(self, shard: str) -> int:
        """Sweep one batch shard; ms until its next sweep work is due (-1: none)."""
        store = self._store
        work = await store.batches.sweep(
            shard,
            limit=_SWEPT,
            retention_ms=self.retention_ms,
            grace_ms=self.grace_ms,
            audit_ms=self.audit_ms,
            audit_cap_ms=_AUDIT_CAP_MS,
        )
        for batch_id in work.expired:
            if await store.batches.close(batch_id, audit_ms=self.audit_ms, sweep=True):
                log.warning(
                    "batch %s: its open lease ran out (its producer died or stalled): closed",
                    batch_id,
                )
        by_batch: dict[str, list[str]] = {}
        for batch_id, ref in work.unconfirmed:
            by_batch.setdefault(batch_id, []).append(ref)
        for batch_id, refs in by_batch.items():
            await link_members(
                store, batch_id, refs, self._partitions, self._noted.note, missing="drop"
            )
        if work.old:
            await store.batches.trim(shard, work.old, self.retention_ms)
            for batch_id in work.old:
                self._cursors.pop(batch_id, None)
        for batch_id in work.audits:
            await self.audit(batch_id)
        if max(len(work.expired), len(work.unconfirmed), len(work.old), len(work.audits)) >= _SWEPT:
            return 0  # more may be due: look again at once
        if work.next_ms < 0:
            return -1
        return max(0, work.next_ms - work.now_ms)
