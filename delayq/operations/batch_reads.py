"""Reading batches (docs/WORKFLOWS.md, "Batches"): one batch (``service.batch_info``,
``Batch.refresh``), its members with their outcomes (``Batch.members``), the listing
(``service.batches()``) and the counts per state (``service.batch_counts()``), and what
a batch's record means: its state (a ``stuck`` one, and why), its times, its members'
refs.

Read-only (store side ``storage/batches.py``): a batch is read by one script call in
its batch shard (``batch_info.lua``), its members a page of ``HSCAN`` at a time; a
listing or the counts read the batch shards in use (one ``SMEMBERS``), then pipeline a
script per shard (``batch_list.lua``, ``batch_counts.lua``). The producer's side
(opening, adding, closing) is :mod:`delayq.operations.batches`, the sweep of the batch
shards :mod:`delayq.runtime.batch_sweep`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import cast

from ..batches import (
    FAILED_LISTED,
    FAILED_SHOWN,
    BatchCounts,
    BatchInfo,
    BatchMember,
    BatchState,
    MemberStatus,
)
from ..results import decode_parent
from ..storage.batches import BatchRead
from ..storage.store import Store

__all__ = [
    "RETENTION_MS",
    "STUCK_MS",
    "check_batch_id",
    "member_ref",
    "read_counts",
    "read_info",
    "read_listing",
    "read_members",
    "split_ref",
    "utc",
]

RETENTION_MS = 86_400_000
"""How long a done batch is kept (``batch_info``, ``batches("done")``): a day."""

STUCK_MS = 3_600_000
"""A closed batch with no member finished for this long is stuck (``batches()``'s
default ``stuck_after``)."""

_STALE_ADDS = 2000  # stale unconfirmed adds batch_counts.lua looks at per shard


def member_ref(type_name: str, event_id: str) -> str:
    """A member's ref in its batch: ``"<type> NUL <id>"`` (what the relay hands on)."""
    return f"{type_name}\0{event_id}"


def split_ref(ref: str) -> tuple[str, str]:
    """A member's ref as ``(type name, id)`` (see :func:`member_ref`)."""
    kind, _, member_id = ref.partition("\0")
    return kind, member_id


def check_batch_id(batch_id: object) -> str:
    """A batch id as ``batch_info`` takes it: a non-empty str of letters, digits, ``-``, ``_``."""
    if not isinstance(batch_id, str):
        raise TypeError(f"a batch id is a str, not {type(batch_id).__name__}")
    if not batch_id or len(batch_id) > 100 or not all(c.isalnum() or c in "-_" for c in batch_id):
        raise ValueError(f"not a batch id: {batch_id!r}")
    return batch_id


async def read_info(store: Store, batch_id: str, members: int, *, grace_ms: int) -> BatchInfo:
    """One batch (``service.batch_info``), with up to ``members`` of those it waits for;
    ``LookupError`` when there is none. ``grace_ms``: an add's grace (one left unconfirmed
    much longer makes the batch stuck)."""
    read = await store.batches.info(check_batch_id(batch_id), failed=FAILED_SHOWN, waiting=members)
    if not read.record:
        raise LookupError(f"no batch {batch_id!r} (never opened, or removed after a day)")
    return _info(batch_id, read, STUCK_MS, grace_ms)


async def read_members(
    store: Store, batch_id: str, status: str | None, limit: int
) -> list[BatchMember]:
    """A batch's members with their outcomes (at most ``limit``; only ``status``)."""
    check_batch_id(batch_id)
    out: list[BatchMember] = []
    cursor = 0
    while len(out) < limit:
        cursor, page = await store.batches.members(batch_id, cursor, 500)
        for ref, record in page:
            member = _member(ref, record)
            if status is None or member.status == status:
                out.append(member)
        if cursor == 0:
            break
    return out[:limit]


async def read_listing(
    store: Store, state: BatchState | None, limit: int, stuck_after_ms: int, *, grace_ms: int
) -> list[BatchInfo]:
    """``service.batches()``: newest first. One ``SMEMBERS`` (the batch shards in use: a
    prefix that never opened a batch stops there), one pipeline of ``batch_list.lua`` over
    those shards, one of ``batch_info.lua`` over the batches listed (each with at most
    :data:`~delayq.batches.FAILED_LISTED` failed ids)."""
    shards_ = await store.batches.shards_in_use()
    if not shards_:
        return []
    wanted = "all" if state is None else state
    pairs = await store.batches.list_ids(shards_, wanted, limit, stuck_after_ms)
    found = sorted(((created, batch_id) for batch_id, created in pairs), reverse=True)
    ids = [batch_id for _, batch_id in found[:limit]]
    reads = await store.batches.infos(ids, failed=FAILED_LISTED, waiting=0)
    out = []
    for batch_id, read in zip(ids, reads, strict=True):
        if not read.record:
            continue  # removed since it was listed
        info = _info(batch_id, read, stuck_after_ms, grace_ms)
        if state == "stuck" and info.state != "stuck":
            info = replace(info, state="stuck", stuck_reason="an add not confirmed past its grace")
        out.append(info)
    return out


async def read_counts(store: Store, stuck_after_ms: int, *, grace_ms: int) -> BatchCounts:
    """``service.batch_counts()``: one ``SMEMBERS`` (the batch shards in use), then one
    pipeline of ``batch_counts.lua`` over them (none for a prefix without batches)."""
    shards_ = await store.batches.shards_in_use()
    got = await store.batches.counts(
        shards_, idle_ms=stuck_after_ms, stale_ms=grace_ms + 60_000, most=_STALE_ADDS
    )
    return BatchCounts(
        open=sum(c.open for c in got),
        waiting=sum(c.waiting for c in got),
        stuck=sum(c.stuck for c in got),
        done=sum(c.done for c in got),
        relay_backlog=sum(c.relay_due for c in got),
        relay_lag=max((c.relay_age_ms for c in got), default=0) / 1000,
        shards=len(shards_),
    )


def utc(ms: int | None) -> datetime | None:
    """A time in ms on Redis's clock as a UTC datetime (None stays None)."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, timezone.utc)


def _int(record: dict[str, str], name: str) -> int | None:
    raw = record.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(float(raw))
    except ValueError:
        return None


def _ref(raw: str | None) -> tuple[str, str] | None:
    if not raw:
        return None
    return split_ref(raw)


def _info(batch_id: str, read: BatchRead, stuck_ms: int, grace_ms: int) -> BatchInfo:
    """A :class:`BatchInfo` from what ``batch_info.lua`` read."""
    rec, now = read.record, read.now_ms
    created = _int(rec, "created") or 0
    closed, done, last = _int(rec, "closed"), _int(rec, "done"), _int(rec, "last")
    lease = _int(rec, "lease")
    unconfirmed = _int(rec, "unconf") or 0
    state: BatchState
    reason = None
    if done is not None:
        state = "done"
    elif closed is None:
        state = "open"
        if lease is not None and lease < now:
            state, reason = "stuck", "open past its lease (its producer died?): the sweep closes it"
    else:
        state = "waiting"
        idle = now - max(closed, last or 0)
        if idle >= stuck_ms:
            state = "stuck"
            reason = f"no member finished for {idle // 1000} s"
    if state != "done" and reason is None and unconfirmed:
        if now - max(created, last or 0) > 2 * grace_ms + 60_000:
            state, reason = "stuck", "an add not confirmed past its grace"
    return BatchInfo(
        id=batch_id,
        name=rec.get("name"),
        state=state,
        total=_int(rec, "total") or 0,
        pending=_int(rec, "pending") or 0,
        succeeded=_int(rec, "ok") or 0,
        failed=_int(rec, "failed") or 0,
        failed_ids=tuple(split_ref(ref) for ref in read.failed),
        created_at=datetime.fromtimestamp(created / 1000, timezone.utc),
        closed_at=utc(closed),
        done_at=utc(done),
        last_done_at=utc(last),
        lease_until=utc(lease) if closed is None else None,
        expires_at=None if done is None else utc(done + RETENTION_MS),
        on_complete=_ref(rec.get("complete")),
        on_success=_ref(rec.get("success")),
        parent=rec.get("parent") or None,
        unconfirmed=unconfirmed,
        waiting_on=tuple(split_ref(ref) for ref in read.waiting),
        stuck_reason=reason,
    )


def _member(ref: str, record: bytes) -> BatchMember:
    kind, member_id = split_ref(ref)
    p = decode_parent(kind, member_id, record)
    status = cast("MemberStatus", p.status)
    return BatchMember(kind, member_id, status, p.value, p.error, p.done_ms)
