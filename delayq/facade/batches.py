"""``EventService``'s batches (:mod:`~delayq.operations.batches`, the reads
:mod:`~delayq.operations.batch_reads`; docs/WORKFLOWS.md, "Batches")."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import timedelta

from ..batches import Batch, BatchCounts, BatchInfo, BatchState
from ..durations import delay_seconds
from ..events import Event
from ..views.records import check_page
from .parts import ServiceParts

_STATES = ("open", "waiting", "done", "stuck")

__all__ = ["BatchesMixin"]


class BatchesMixin(ServiceParts):
    """Batches: many events, then one callback when every one is done."""

    def batch(
        self,
        *,
        on_complete: Event | None = None,
        on_success: Event | None = None,
        name: str | None = None,
    ) -> AbstractAsyncContextManager[Batch]:
        """Open a batch: ``async with service.batch(...) as batch:`` then add members with
        ``await batch.enqueue_with_delay(...)`` (``enqueue_at``, ``enqueue_many``,
        ``enqueue_envelopes``).

        When every member has finished, ``on_complete`` is enqueued exactly once, whatever
        the members' outcomes, and ``on_success`` exactly once if every member succeeded
        (else it is skipped: it never runs). Both are optional events (their ids must be
        unused: one enqueued already is kept and does not wait for the batch); their
        handlers read ``current_delivery().batch`` (its ``info``: counts, failed ids) and
        ``await current_delivery().batch.members()`` (outcomes and results). ``name`` is
        shown by ``batch_info``/``batches`` (at most 200 characters).

        The batch stays open while the block runs (a lease renewed in the background) and
        is closed when the block ends, whether or not it raised: the members added so far
        make the batch. Opened inside a member's handler, the batch is nested: a member
        of that member's batch, which waits for it as for any member. Members added by a
        running member (``current_delivery().batch.enqueue_*``) belong to its batch too.
        See docs/WORKFLOWS.md, "Batches".
        """
        return self._batches.opener(on_complete, on_success, name)

    async def batch_info(self, batch_id: str, *, members: int = 20) -> BatchInfo:
        """All Redis holds about one batch, read in one step: state, counts, times,
        callbacks, the failed members' ids and, with ``members`` > 0, up to that many of
        the members it still waits for (:attr:`BatchInfo.waiting_on`). Raises
        ``LookupError`` for an id with no batch (never opened, or removed after its
        retention)."""
        if not isinstance(members, int) or isinstance(members, bool) or not 0 <= members <= 1000:
            raise ValueError(f"members must be an int from 0 to 1000, not {members!r}")
        return await self._batches.info(batch_id, members)

    async def batches(
        self,
        state: BatchState | None = None,
        *,
        limit: int = 100,
        stuck_after: float | timedelta = timedelta(hours=1),
    ) -> list[BatchInfo]:
        """The batches of the prefix, newest first, at most ``limit`` (1 to 1000): every
        batch (``state=None``), or those ``"open"``, ``"waiting"``, ``"done"`` (kept for a
        day after done) or ``"stuck"``. A batch is stuck when its open lease ran out and
        the sweep has not closed it yet, when it has an add not confirmed past its grace,
        or when it is waiting and no member has finished for ``stuck_after`` (a timedelta
        or seconds); its :attr:`BatchInfo.stuck_reason` says which.

        A listing stays light: each :class:`BatchInfo` carries at most
        :data:`~delayq.batches.FAILED_LISTED` (10) of its failed ids (``failed`` counts
        all; ``batch_info()`` reads up to 1,000) and no ``waiting_on``. Cost: one
        ``SMEMBERS`` (the batch shards in use; a prefix that never opened a batch stops
        there), then a read-only script per batch shard in use and one per batch listed,
        each set pipelined. To count batches, :meth:`batch_counts` reads none of them."""
        if state is not None and state not in _STATES:
            raise ValueError(f"state must be None or one of {_STATES}, not {state!r}")
        check_page(limit, 1)
        idle = delay_seconds(stuck_after, "stuck_after")
        return await self._batches.listing(state, limit, max(1, round(idle * 1000)))

    async def batch_counts(
        self, *, stuck_after: float | timedelta = timedelta(hours=1)
    ) -> BatchCounts:
        """How many batches of the prefix are open, waiting, stuck and done, and the
        relay's work due in the batch shards (:class:`BatchCounts`), counted in Redis
        whatever their number (no batch is read).

        ``stuck`` takes the batches open past their lease, those waiting with no member
        finished for ``stuck_after`` (a timedelta or seconds), and those holding an add
        that no sweep has settled for twice its grace and a minute (a relay that does
        not run; up to 2,000 such adds are looked at per batch shard, a batch beyond
        them counts as open or waiting); ``open`` and ``waiting`` are the others.
        ``batches("stuck")`` lists them and ``batch_info()`` says why each is stuck; for
        an unconfirmed add both may call a batch stuck sooner than this count does (once
        the add is past its grace, or from the batch's record).

        Cost: one ``SMEMBERS`` (the batch shards in use; a prefix that never opened a
        batch stops there, all counts 0), then one read-only script per batch shard in
        use (``ZCARD``/``ZCOUNT`` of its sorted sets), pipelined."""
        idle = delay_seconds(stuck_after, "stuck_after")
        return await self._batches.counts(max(1, round(idle * 1000)))
