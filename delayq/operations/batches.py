"""A batch's producer side (docs/WORKFLOWS.md, "Batches"): opening one, adding members,
closing it; :class:`Batches` is also what a :class:`~delayq.Batch` handle and the
service's batch calls go through (reads: :mod:`delayq.operations.batch_reads`).

A batch is a *child* of its members (their completions reach it through the relay, as a
parent's reach its children) and a *parent* of its callbacks (they wait for it with
``after=[(BATCH_TYPE, batch id)]``). Every step is one script on one slot, in an order
where a process killed between any two leaves something the sweep
(:mod:`delayq.runtime.batch_sweep`) finishes:

Opening (``async with service.batch(...)``): ``nested-added`` (a nested batch: its parent
batch learns of it, ``batch_add.lua``), ``opened`` (``batch_open.lua``: the batch, live,
its callbacks and parent batch linked as its children), ``callbacks`` (the callbacks
enqueued waiting for it: the dependencies' route). The block then holds an open lease,
renewed in the background; the block's end closes the batch (``batch_close.lua``). A
producer that dies leaves an open batch whose lease runs out: the sweep closes it.

Adding (``batch.enqueue_*``): ``added`` (``batch_add.lua``: new members pending and not
confirmed), ``prelinked`` (``dep_prelink.lua`` in the shard each member is enqueued to:
the batch becomes its child before it exists, so that a member done before the add's
link still hands its completion to the batch; a member an earlier add of it enqueued,
pending or done since, is not enqueued again), ``enqueued`` (the usual enqueue route,
every option of it), ``linked`` (``dep_link.lua`` in each shard of the members not
enqueued now: linked, or the member is done already and answers its record; those
enqueued now are linked already), ``applied`` (those records, ``batch_apply.lua``),
``confirmed`` (``batch_confirm.lua``). An add not confirmed within its grace is settled
by the sweep with the same linking (:func:`link_members`: linked again, idempotent;
pending: confirmed; done: applied; never enqueued ("missing", or "vanished": linked
before an enqueue that never came): dropped from the batch).

(Over 400 lines: one job, the producer's steps. Opening, adding and closing are one
sequence under one open lease, each step written with its kill-safe order and its
undoing after a failure (the callbacks cancelled after a failed open, an add's members
settled after a failed step); the engine's reads and the consumer's handles add a few
lines each.)
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from types import TracebackType
from typing import Any

from ..batches import Batch, BatchCounts, BatchInfo, BatchMember, BatchState
from ..codec import add_to_context, check_context
from ..context import BATCH_KEY, BATCH_NAME_KEY, current_delivery
from ..errors import BatchClosedError, DecodeError
from ..events import Event, EventTypes, check_event
from ..flow.priorities import check_priority
from ..keyspace.shards import BATCH_TYPE, batch_shard, shard_for
from ..storage.store import Store
from .batch_reads import (
    member_ref,
    read_counts,
    read_info,
    read_listing,
    read_members,
    split_ref,
)
from .dependencies import Dependencies, NotedShards, chunked, merge_answers, parent_shards
from .enqueueing import Enqueuer, timed_envelopes, with_timeout

__all__ = [
    "AUDIT_MS",
    "GRACE_MS",
    "LEASE_MS",
    "STEP_HOOK",
    "Batches",
    "link_members",
]

log = logging.getLogger("delayq.batches")

LEASE_MS = 30_000
"""An open batch's lease: its block renews it every third of it; once it runs out (the
producer died) the relay's sweep closes the batch."""

GRACE_MS = 30_000
"""How long an add may stay unconfirmed before the sweep settles it."""

AUDIT_MS = 60_000
"""The sweep links a closed batch's pending members again once no member has finished for
this long (ms), then again as long after as none has, up to an hour: a member gone without
a completion (deleted by hand, its last delivery group removed) counts as vanished, so no
batch waits for ever."""

_NAME_MAX = 200

STEP_HOOK: Callable[[str], None] | None = None
"""Tests only: called with each step's name (``"nested-added"``, ``"opened"``,
``"callbacks"``, ``"added"``, ``"prelinked"``, ``"enqueued"``, ``"linked"``,
``"applied"``, ``"confirmed"``, ``"closed"``) after it, so a test can kill the process
there."""


def _step(name: str) -> None:
    if STEP_HOOK is not None:
        STEP_HOOK(name)


async def link_members(
    store: Store,
    batch_id: str,
    refs: Sequence[str],
    partitions: Callable[[str], int],
    note: Callable[[Sequence[str]], Awaitable[None]],
    *,
    missing: str,
    linked: Sequence[str] = (),
) -> None:
    """Link members to their batch in their shards (``dep_link.lua``), then apply the
    records of those done already and confirm those linked. ``linked``: members linked
    already (an add's members enqueued now, linked before their enqueue), confirmed first
    without a look, unless one of them was settled meanwhile (the sweep dropped it: an
    add slower than its grace; or its completion reached the batch): then they are
    linked again with ``refs``. A member that does not exist and never linked the batch
    (``dep_link.lua`` answers "missing"): ``missing="done"`` (an add's own step, right
    after the enqueue) it was done before its link, and counts as done; ``"drop"`` (the
    sweep's look at adds left unconfirmed) it was never enqueued, and is dropped from the
    batch (so is one linked by its add before an enqueue that never came: "vanished");
    ``"ignore"`` (the audit of confirmed pending members) its completion has reached the
    batch already. ``note`` records the members' shards as dependency shards (the
    relay's).

    Each step goes in chunks of :data:`~delayq.operations.dependencies.CHUNK` members,
    one script call each, and a chunk is a complete step for its members: until its
    confirm a member is unconfirmed, so whatever a process killed between two chunks
    leaves (some members linked, applied or confirmed, the others not yet) the sweep
    settles by linking again, and linking, applying and confirming are idempotent."""
    if not refs and not linked:
        return
    refs = list(refs)
    if linked:
        confirmed = 0
        for part in chunked(linked):
            confirmed += await store.batches.confirm(batch_id, part)
        if confirmed < len(linked):
            refs += linked
    bshard = batch_shard(batch_id)
    by_shard: dict[str, list[str]] = {}
    for ref in refs:
        kind, member_id = split_ref(ref)
        for shard in parent_shards(store, kind, member_id, partitions(kind)):
            by_shard.setdefault(shard, []).append(ref)
    await note(list(by_shard))  # the relay looks at the members' shards for completions
    said: dict[str, list[bytes]] = {}
    for shard, group in by_shard.items():
        for part in chunked(group):
            links = [(split_ref(ref)[1], bshard, batch_id) for ref in part]
            answers = await store.dependencies.dep_link(shard, links)
            for ref, answer in zip(part, answers, strict=True):
                said.setdefault(ref, []).append(answer)
    _step("linked")
    records: list[tuple[str, bytes]] = []
    pending: list[str] = []
    for ref, answers in said.items():
        answer = merge_answers(answers)
        outcome = answer.partition(b":")[2][:1]
        if answer == b"p":
            pending.append(ref)
        elif missing == "drop" and outcome in (b"m", b"v"):
            records.append((ref, b""))  # never enqueued: dropped (if still unconfirmed)
        elif missing != "ignore" or outcome != b"m":
            records.append((ref, answer))
    for done in chunked(records):
        await store.batches.apply(bshard, {batch_id: list(done)})
    _step("applied")
    for part in chunked(pending):
        await store.batches.confirm(batch_id, part)
    _step("confirmed")


class _Open(AbstractAsyncContextManager[Batch]):
    """``async with service.batch(...)``: opens the batch, keeps its lease, closes it."""

    def __init__(
        self,
        engine: Batches,
        on_complete: Event | None,
        on_success: Event | None,
        name: str | None,
        parent: Batch | None,
    ):
        self._engine = engine
        self._args = (on_complete, on_success, name, parent)
        self._batch: Batch | None = None
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Batch:
        if self._batch is not None:
            raise RuntimeError("a batch's `async with` cannot be entered twice")
        batch = await self._engine.open(*self._args)
        self._batch = batch
        self._renewer = asyncio.create_task(self._engine.keep_open(batch.id))
        return batch

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        renewer, batch = self._renewer, self._batch
        if renewer is not None:
            renewer.cancel()
            await asyncio.wait([renewer])  # (a cancel of ours still reaches us here)
        if batch is None:
            return
        try:
            await self._engine.close(batch.id)
        except Exception as failure:
            if exc is None:
                raise
            # the block's own exception goes on; the sweep closes the batch (its lease ends)
            log.warning("batch %s: closing it failed (%s)", batch.id, failure)


class Batches:
    """The batch engine of one service: the operations behind :class:`delayq.Batch` and
    ``service.batch()`` (see the module docstring), and the reads behind
    ``batch_info()``, ``batches()`` and ``batch_counts()`` (with this engine's grace)."""

    def __init__(
        self,
        store: Store,
        types: EventTypes,
        enqueuer: Enqueuer,
        dependencies: Dependencies,
    ):
        self._store = store
        self._types = types
        self._enqueuer = enqueuer
        self._dependencies = dependencies
        self._noted = NotedShards(store)
        self.lease_ms = LEASE_MS
        self.grace_ms = GRACE_MS
        self.audit_ms = AUDIT_MS

    def partitions(self, name: str) -> int:
        """The partition count of a type known by name (its class's, else Redis's)."""
        return self._dependencies.partitions(name)

    # -- the producer's side ----------------------------------------------------------

    def opener(
        self, on_complete: Event | None, on_success: Event | None, name: str | None
    ) -> AbstractAsyncContextManager[Batch]:
        """``service.batch(...)``'s context manager (checked now; opened on entry)."""
        for label, callback in (("on_complete", on_complete), ("on_success", on_success)):
            if callback is not None and not isinstance(callback, Event):
                raise TypeError(f"{label} is an Event (or None), not {callback!r}")
        if on_complete is not None and on_success is not None:
            same = type(on_complete) is type(on_success) and on_complete.id == on_success.id
            if same:
                raise ValueError("on_complete and on_success must be different events")
        if name is not None:
            if not isinstance(name, str):
                raise TypeError(f"a batch's name is a str, not {type(name).__name__}")
            if len(name) > _NAME_MAX or "\0" in name:
                raise ValueError(f"a batch's name has at most {_NAME_MAX} characters, no NUL")
        delivery = current_delivery()
        parent = None if delivery is None else delivery.batch
        if parent is not None and parent._member is None:  # a callback's: the batch is done
            parent = None
        return _Open(self, on_complete, on_success, name, parent)

    async def open(
        self,
        on_complete: Event | None,
        on_success: Event | None,
        name: str | None,
        parent: Batch | None,
    ) -> Batch:
        """Open a batch (the steps in the module docstring); its handle."""
        store = self._store
        batch_id = uuid.uuid4().hex
        bshard = batch_shard(batch_id)
        callbacks: list[tuple[Event, str, str, str]] = []  # event, policy, its shard, ref
        for callback, policy in ((on_complete, "run"), (on_success, "skip")):
            if callback is not None:
                cname = self._types.name(type(callback))
                cshard = shard_for(cname, callback.id, self.partitions(cname))
                callbacks.append((callback, policy, cshard, member_ref(cname, callback.id)))
        children = [(c[2], c[0].id) for c in callbacks]
        own_ref = member_ref(BATCH_TYPE, batch_id)
        if parent is not None:
            children.append((batch_shard(parent.id), parent.id))
            await self._noted.note([bshard, batch_shard(parent.id)])
            code, _ = await store.batches.add(
                parent.id, [own_ref], grace_ms=self.grace_ms, adder=parent._member
            )
            self._check_open(parent.id, code)
            _step("nested-added")
        else:
            await self._noted.note([bshard])
        refs = {policy: ref for _, policy, _, ref in callbacks}
        enqueued: list[tuple[str, str]] = []  # callbacks enqueued (cancelled if the open fails)
        try:
            await store.batches.open(
                batch_id,
                name=name,
                lease_ms=self.lease_ms,
                parent=None if parent is None else parent.id,
                complete=refs.get("run"),
                success=refs.get("skip"),
                children=children,
            )
            _step("opened")
            for callback, policy, _, ref in callbacks:
                (added,) = await self._enqueuer.children(
                    [callback],
                    0,
                    absolute=False,
                    context=None,
                    parents=[(BATCH_TYPE, batch_id)],
                    policy=policy,
                    dependencies=self._dependencies,
                )
                kind, callback_id = split_ref(ref)
                if added:
                    enqueued.append((kind, callback_id))
                else:  # kept as it was: it would not wait for this batch
                    raise ValueError(
                        f"{'on_complete' if policy == 'run' else 'on_success'} {kind} "
                        f"{callback_id!r}: an event with that id exists; a callback needs an "
                        "unused id (say, one made of the batch's name)"
                    )
            _step("callbacks")
            if parent is not None:
                await store.batches.confirm(parent.id, [own_ref])
        except Exception:
            # the callbacks enqueued go, and the batch (if written) closes: it completes
            # with what it has (nothing); a failed close is the sweep's (its lease runs out)
            try:
                for kind, callback_id in enqueued:
                    await self._enqueuer.cancel(kind, callback_id)
                await store.batches.close(batch_id, audit_ms=self.audit_ms)
            except Exception as exc:
                log.warning("batch %s: closing it after a failed open failed (%s)", batch_id, exc)
            raise
        return Batch(self, batch_id, name, parent=None if parent is None else parent.id)

    async def keep_open(self, batch_id: str) -> None:
        """Renew an open batch's lease every third of it until cancelled (the block's
        background task); stops when the batch is not open any more."""
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                if not await self._store.batches.renew(batch_id, self.lease_ms):
                    log.warning(
                        "batch %s was closed while its block ran (its open lease ran out: "
                        "the event loop or Redis stalled for %.0f s); adds now fail",
                        batch_id,
                        self.lease_ms / 1000,
                    )
                    return
            except Exception as exc:  # the lease is long: the next try may well do
                log.warning("batch %s: renewing its open lease failed (%s)", batch_id, exc)

    async def close(self, batch_id: str) -> None:
        """Close a batch (its block ended): done at once when nothing is pending."""
        code = await self._store.batches.close(batch_id, audit_ms=self.audit_ms)
        _step("closed")
        if code == 0:
            log.warning("batch %s was closed already (its open lease ran out)", batch_id)

    @staticmethod
    def _check_open(batch_id: str, code: str) -> None:
        if code == "x":
            raise LookupError(f"no batch {batch_id!r} (never opened, or removed)")
        if code == "d":
            raise BatchClosedError(f"batch {batch_id!r} is done: it takes no more members")
        if code == "c":
            raise BatchClosedError(
                f"batch {batch_id!r} is closed: only its running members may add to it"
            )

    def _context(
        self,
        batch: Batch,
        context: Mapping[str, str] | None,
        timeout: float | timedelta | None,
    ) -> dict[str, str]:
        extra = {BATCH_KEY: batch.id}
        if batch.name:
            extra[BATCH_NAME_KEY] = batch.name
        return {**(with_timeout(check_context(context), timeout) or {}), **extra}

    async def _added(self, batch: Batch, refs: list[str]) -> dict[int, str]:
        """The first step of an add: the indexes of ``refs`` to enqueue and link, each with
        ``batch_add.lua``'s answer (``"n"`` new, ``"u"`` added before, not confirmed).

        In chunks, one ``batch_add.lua`` call each; a chunk is a complete step for its
        members (pending and unconfirmed): a process killed before the next chunk leaves
        adds the sweep drops after their grace (they were never enqueued), and a later
        chunk that fails has the earlier chunks' members settled now."""
        if not refs:
            return {}
        todo: dict[int, str] = {}
        at = 0  # where the chunk starts in refs
        try:
            for part in chunked(refs):
                code, answers = await self._store.batches.add(
                    batch.id, part, grace_ms=self.grace_ms, adder=batch._member
                )
                self._check_open(batch.id, code)
                todo.update(
                    (at + i, answer) for i, answer in enumerate(answers) if answer in ("n", "u")
                )
                at += len(part)
        except Exception:
            await self._settle(batch.id, [refs[i] for i in todo])
            raise
        _step("added")
        return todo

    async def add(
        self,
        batch: Batch,
        events: Sequence[tuple[Event, int]],
        absolute: bool,
        context: Mapping[str, str] | None,
        key: str | None,
        timeout: float | timedelta | None,
        priority: int | None,
    ) -> list[bool]:
        """Add events (``(event, ms)``: a delay, or with ``absolute`` a unix time) to a
        batch; True for each one enqueued now."""
        if priority is not None:
            check_priority(priority)
        ctx = self._context(batch, context, timeout)
        refs = []
        for event, _ in events:
            check_event(event)  # (as the service's enqueue checks it) before anything is written
            refs.append(member_ref(self._types.name(type(event)), event.id))
        todo = await self._added(batch, refs)
        done = [False] * len(events)

        async def enqueue(chosen: list[int]) -> list[bool]:
            if len(chosen) == 1 or absolute:
                for i in chosen:
                    event, ms = events[i]
                    done[i] = await self._enqueuer.one(
                        event, ms, absolute, ctx, False, key, priority
                    )
            elif chosen:
                items: list[Any] = [
                    (events[i][0], timedelta(milliseconds=events[i][1])) for i in chosen
                ]
                got = await self._enqueuer.many(items, 0, ctx, False, key, priority)
                for i, added in zip(chosen, got, strict=True):
                    done[i] = added
            return [done[i] for i in chosen]

        await self._enqueue_and_link(batch, refs, todo, enqueue)
        return done

    async def add_envelopes(
        self,
        batch: Batch,
        event_type: str,
        items: Sequence[tuple[str, bytes, int]],
        absolute: bool,
        keys: Sequence[str | None] | None,
        timeout: float | timedelta | None,
        priority: int | Sequence[int] | None,
    ) -> list[int]:
        """Add encoded events of one type to a batch; a code per item (1 added, 0 not)."""
        name = self._types.name(event_type)
        extra = self._context(batch, None, None)
        marked: list[tuple[str, bytes, int]] = []
        for item in timed_envelopes(items, timeout):
            try:
                marked.append((item[0], add_to_context(item[1], extra), item[2]))
            except DecodeError as exc:
                raise ValueError(f"{item[0]!r}: {exc}") from exc
        if keys is not None and len(keys) != len(marked):
            raise ValueError(f"{len(keys)} flow keys for {len(marked)} items")
        if isinstance(priority, (list, tuple)) and len(priority) != len(marked):
            raise ValueError(f"{len(priority)} priorities for {len(marked)} items")
        refs = [member_ref(name, item[0]) for item in marked]
        todo = await self._added(batch, refs)
        codes = [0] * len(marked)

        async def enqueue(chosen: list[int]) -> list[bool]:
            if not chosen:
                return []
            levels: int | Sequence[int] | None = (
                [priority[i] for i in chosen] if isinstance(priority, (list, tuple)) else priority
            )
            got = await self._enqueuer.envelopes(
                name,
                [marked[i] for i in chosen],
                absolute=absolute,
                replace=False,
                keys=None if keys is None else [keys[i] for i in chosen],
                priorities=levels,
            )
            for i, code in zip(chosen, got, strict=True):
                codes[i] = code
            return [code == 1 for code in got]

        await self._enqueue_and_link(batch, refs, todo, enqueue)
        return codes

    async def _enqueue_and_link(
        self,
        batch: Batch,
        refs: list[str],
        todo: dict[int, str],
        enqueue: Callable[[list[int]], Awaitable[list[bool]]],
    ) -> None:
        """An add's steps after ``added`` for the members it chose (``todo``: indexes of
        ``refs`` and ``batch_add.lua``'s answers; none: nothing to do): ``prelinked``,
        ``enqueue(indexes)`` (the usual route; what it enqueued now) of those an earlier
        add did not enqueue, then :func:`link_members` (those enqueued now are linked: only
        confirmed). An add failing between its steps is settled now (as the sweep would
        after its grace), when Redis lets us."""
        if not todo:
            return
        chosen = [refs[i] for i in todo]
        try:
            go = await self._prelink(batch, {refs[i]: answer for i, answer in todo.items()})
            _step("prelinked")
            wanted = [i for i in todo if refs[i] in go]
            fresh = {
                refs[i] for i, added in zip(wanted, await enqueue(wanted), strict=True) if added
            }
            _step("enqueued")
            await link_members(
                self._store,
                batch.id,
                [ref for ref in chosen if ref not in fresh],
                self.partitions,
                self._noted.note,
                missing="done",
                linked=sorted(fresh),
            )
        except Exception:
            await self._settle(batch.id, chosen)
            raise

    async def _prelink(self, batch: Batch, answers: dict[str, str]) -> set[str]:
        """Link the batch to members about to be enqueued, in the shard each is enqueued to
        (``dep_prelink.lua``, in chunks); the refs to enqueue: not those an earlier add of
        them (``batch_add.lua`` answered "u") enqueued, pending or done since. A "u" member
        its earlier add did not link is asked about again (``batch_add.lua``): done since
        (its completion reached the batch), or confirmed, it is not enqueued."""
        bshard = batch_shard(batch.id)

        async def link(wanted: dict[str, str]) -> dict[str, bytes]:
            by_shard: dict[str, list[str]] = {}
            for ref in wanted:
                kind, member_id = split_ref(ref)
                # the shard the enqueue writes it to (the enqueue's own partition count)
                shard = shard_for(kind, member_id, await self._enqueuer.partitions_of(kind))
                by_shard.setdefault(shard, []).append(ref)
            await self._noted.note(list(by_shard))  # the relay looks there for completions
            said: dict[str, bytes] = {}
            for shard, group in by_shard.items():
                for part in chunked(group):
                    pairs = [(split_ref(ref)[1], wanted[ref]) for ref in part]
                    got = await self._store.dependencies.dep_prelink(shard, bshard, batch.id, pairs)
                    said.update(zip(part, got, strict=True))
            return said

        said = await link(answers)
        again = [ref for ref, answer in said.items() if answer == b"x"]
        renewed: dict[str, str] = {}
        for part in chunked(again):
            code, now = await self._store.batches.add(
                batch.id, part, grace_ms=self.grace_ms, adder=batch._member
            )
            self._check_open(batch.id, code)
            renewed.update((ref, "n") for ref, a in zip(part, now, strict=True) if a in ("n", "u"))
        if renewed:
            said.update(await link(renewed))
        return {ref for ref, answer in said.items() if answer == b"e"}

    async def _settle(self, batch_id: str, refs: list[str]) -> None:
        """Settle the members ``refs`` of an add that failed between its steps now, as the
        sweep would after their grace (enqueued: linked; never enqueued: dropped), when
        Redis lets us (else the sweep will)."""
        if not refs:
            return
        try:
            await link_members(
                self._store, batch_id, refs, self.partitions, self._noted.note, missing="drop"
            )
        except Exception as exc:
            log.warning(
                "batch %s: settling a failed add failed too (%s); the sweep will", batch_id, exc
            )

    # -- reading (operations/batch_reads.py) -----------------------------------------

    async def info(self, batch_id: str, members: int = 20) -> BatchInfo:
        """One batch (``service.batch_info``); ``LookupError`` when there is none."""
        return await read_info(self._store, batch_id, members, grace_ms=self.grace_ms)

    async def members(self, batch_id: str, status: str | None, limit: int) -> list[BatchMember]:
        """A batch's members with their outcomes (at most ``limit``; only ``status``)."""
        return await read_members(self._store, batch_id, status, limit)

    async def listing(
        self, state: BatchState | None, limit: int, stuck_after_ms: int
    ) -> list[BatchInfo]:
        """``service.batches()``: newest first (:func:`~delayq.operations.batch_reads.read_listing`)."""
        return await read_listing(self._store, state, limit, stuck_after_ms, grace_ms=self.grace_ms)

    async def counts(self, stuck_after_ms: int) -> BatchCounts:
        """``service.batch_counts()`` (:func:`~delayq.operations.batch_reads.read_counts`)."""
        return await read_counts(self._store, stuck_after_ms, grace_ms=self.grace_ms)

    # -- the consumer's handles ---------------------------------------------------------

    def member_handle(self, context: Mapping[str, str], type_name: str, event_id: str) -> Batch:
        """``current_delivery().batch`` of a member (no Redis read)."""
        return Batch(
            self,
            context[BATCH_KEY],
            context.get(BATCH_NAME_KEY),
            member=member_ref(type_name, event_id),
        )

    async def callback_handle(self, batch_id: str) -> Batch:
        """``current_delivery().batch`` of a callback: the batch read once (``info``
        None if it cannot be read: gone, or Redis failed)."""
        try:
            info = await self.info(batch_id, 0)
        except (LookupError, ValueError):
            return Batch(self, batch_id)
        return Batch(self, batch_id, info.name, parent=info.parent, info=info)
