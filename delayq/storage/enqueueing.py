"""Producers' writes: enqueue (coalescing concurrent single-event calls), replace and cancel."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..errors import QueueFullError, RedisResponseError, error_code
from ..flow.dedup import Dedup
from ..keyspace.scripts import LEVEL_KEYS
from .base import StoreCore
from .dependencies import nudge_relay
from .groups import DeliveryGroups
from .layouts import Layouts
from .records import Enqueued

# Enqueue sends at most this many events per script call: keeps each call
# well under a millisecond of Redis time.
ENQUEUE_CHUNK = 200

_pack = msgspec.msgpack.Encoder().encode
# Enqueued.FANNED_OUT as a plain int: every call's codes are searched for it (a list's
# compares with an IntEnum member cost twice those with an int)
_FANNED_OUT = int(Enqueued.FANNED_OUT)


@dataclass(slots=True)
class _Batch:
    """Single-event enqueues of one (type, mode) waiting to be sent together."""

    pending: list[tuple[tuple[str, bytes, int], str | None, asyncio.Future[int]]] = field(
        default_factory=list
    )
    task: asyncio.Task[None] | None = None
    # the priority level of a pending event above level 0, by its caller's future: kept
    # aside so that the enqueues of a type without levels do nothing more per event
    levels: dict[asyncio.Future[int], int] = field(default_factory=dict)


class Enqueueing:
    """Adding, replacing and cancelling events (the type registry ``types`` records each
    shard's layout before its first enqueue; ``groups`` reaches every delivery group)."""

    def __init__(self, core: StoreCore, types: Layouts, groups: DeliveryGroups):
        self._core = core
        self._types = types
        self._groups = groups
        # (shard, absolute, mode) -> the single-event enqueues waiting to go together
        self._batches: dict[tuple[str, bool, bool | Dedup], _Batch] = {}

    async def enqueue(
        self,
        shard: str,
        items: Sequence[tuple[str, bytes, int]],
        absolute: bool,
        replace: bool | Dedup,
        keys: Sequence[str | None] | None = None,
        priorities: Sequence[int] | None = None,
    ) -> list[int]:
        """Add ``(id, envelope, ms)`` items of one type; return a code per item.

        ``keys``: a flow key per item (None: none), or None when no item has one.
        ``priorities``: a priority level per item (0..9, checked by the caller), or None
        when all are 0.

        Codes: :class:`~delayq.storage.records.Enqueued` (ADDED, KEPT: the id exists or
        unique_for refused it, REPLACED). ``ms`` is a delay or, with ``absolute``, a unix time in ms.
        ``replace`` may be a :class:`~delayq.flow.dedup.Dedup` mode. Chunks are pipelined.

        Single-event calls made concurrently (say, a hundred request handlers
        each enqueueing one event) are coalesced: events of one type and mode
        that arrive while a script call is on its way go together in the next
        call, one round trip for many. Each caller still gets its own code or
        exception, and the calls of one task keep their order.
        """
        if len(items) != 1:
            return await self._enqueue_now(
                shard, items, absolute=absolute, replace=replace, keys=keys, priorities=priorities
            )
        key = (shard, absolute, replace)
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = _Batch()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        (flow_key,) = keys if keys else (None,)  # the one item's flow key
        batch.pending.append((items[0], flow_key, future))
        if priorities:
            batch.levels[future] = priorities[0]
        if batch.task is None:
            batch.task = asyncio.create_task(self._flush(key, batch))
        return [await future]

    async def aclose(self) -> None:
        """Wait for coalesced enqueues still on their way (their callers are waiting too)."""
        tasks = [b.task for b in self._batches.values() if b.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    async def _flush(self, key: tuple[str, bool, bool | Dedup], batch: _Batch) -> None:
        """Send coalesced single-event enqueues until none are waiting."""
        shard, absolute, replace = key
        sending: list[tuple[tuple[str, bytes, int], str | None, asyncio.Future[int]]] = []
        try:
            await asyncio.sleep(0)  # the callers of this loop iteration join the first call
            while batch.pending:
                chunk = batch.pending[:ENQUEUE_CHUNK]
                del batch.pending[:ENQUEUE_CHUNK]
                # the chunk's levels leave the batch's (a cancelled caller's too: none stays
                # behind while the batch keeps filling); empty unless one is above 0
                aside = batch.levels
                chunk_levels = {f: aside.pop(f, 0) for _, _, f in chunk} if aside else None
                # a caller cancelled before its event was sent does not enqueue it
                sending = [p for p in chunk if not p[2].cancelled()]
                if not sending:
                    continue
                keyed = [key for _, key, _ in sending]
                levels = None if chunk_levels is None else [chunk_levels[f] for _, _, f in sending]
                try:
                    codes = await self._enqueue_now(
                        shard,
                        [item for item, _, _ in sending],
                        absolute=absolute,
                        replace=replace,
                        keys=keyed if any(keyed) else None,
                        priorities=levels if levels and any(levels) else None,
                    )
                except Exception as exc:
                    for _, _, future in sending:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for (_, _, future), code in zip(sending, codes, strict=True):
                        if not future.done():
                            future.set_result(code)
                sending = []
        finally:
            batch.task = None
            # Cancelled (the event loop is closing): no caller may wait forever.
            for _, _, future in sending + batch.pending:
                if not future.done():
                    future.cancel()
            batch.pending.clear()
            batch.levels.clear()

    async def _enqueue_now(
        self,
        shard: str,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool,
        replace: bool | Dedup,
        keys: Sequence[str | None] | None = None,
        priorities: Sequence[int] | None = None,
    ) -> list[int]:
        """Enqueue now (not coalesced); Redis out of memory raises :class:`QueueFullError`."""
        try:
            return await self._send_enqueue(
                shard, items, absolute=absolute, replace=replace, keys=keys, priorities=priorities
            )
        except RedisResponseError as exc:
            if error_code(exc) != "OOM":  # by code: the message differs between servers
                raise
            raise QueueFullError(
                f"Redis is out of memory (used memory > maxmemory, policy noeviction): "
                f"{shard} events were not enqueued"
                + (
                    ""
                    if len(items) <= ENQUEUE_CHUNK
                    else f" (each group of {ENQUEUE_CHUNK} is all-or-nothing; earlier groups of "
                    f"this call may have been enqueued)"
                )
                + ". Handling queued events frees memory; or raise maxmemory."
            ) from exc

    async def _send_enqueue(
        self,
        shard: str,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool,
        replace: bool | Dedup,
        keys: Sequence[str | None] | None = None,
        priorities: Sequence[int] | None = None,
    ) -> list[int]:
        """One script call per chunk of ``ENQUEUE_CHUNK`` items, pipelined."""
        await self._types.register_type(shard)
        # "<replace>:<call id>:<chunk no>": the call id lets the script tell
        # a retried chunk from a new call that encoded identical bytes.
        # a dedup mode ("d<ms>", "u<ms>") needs the dedup key too; the plain modes
        # send the keys they always sent
        dedup = isinstance(replace, Dedup)
        keyed = keys is not None and any(keys)
        # flow keys need fkeys and the lines their events wait in; so does a replace (the
        # replaced event may have had a key); a plain keep-first enqueue sends its keys
        # only up to the group's retries, as it always did
        levelled = priorities is not None and any(priorities)
        # a priority level above 0 needs `prio` and the levels' lists; a replace also
        # `waiting` (a child waiting for parents keeps waiting: the last key)
        last = None if dedup or replace else LEVEL_KEYS[-1] if keyed or levelled else "retries"
        mode_flag = replace.flag if isinstance(replace, Dedup) else "1" if replace else "0"
        flags = f"{mode_flag}:{uuid.uuid4().hex}"
        chunks = [items[i : i + ENQUEUE_CHUNK] for i in range(0, len(items), ENQUEUE_CHUNK)]
        # ":mp": each chunk's events go as two arguments, not three per event
        # (redis-py's packing of many small arguments costs more than the script)
        mode = "at:mp" if absolute else "delay:mp"
        if (keys is not None and keyed) or levelled:
            # ":mpk": a flow key per event as a fourth element ('' for none); ":mpp" (or
            # ":mpkp"): a priority level per event after it
            extras: list[tuple[Any, ...]] = [()] * len(items)
            if keys is not None and keyed:
                mode += "k"
                extras = [(k or "",) for k in keys]
            if priorities is not None and levelled:
                mode += "p"
                extras = [(*e, p) for e, p in zip(extras, priorities, strict=True)]
            packed = [
                _pack(
                    [
                        x
                        for (i, env, ms), extra in zip(
                            chunk, extras[c : c + ENQUEUE_CHUNK], strict=True
                        )
                        for x in (i, ms, len(env), *extra)
                    ]
                )
                for chunk, c in zip(chunks, range(0, len(items), ENQUEUE_CHUNK), strict=True)
            ]
        else:
            packed = [
                _pack([x for i, env, ms in chunk for x in (i, ms, len(env))]) for chunk in chunks
            ]
        calls = [
            [
                mode,
                f"{flags}:{number}",
                self._core.keys.wakeup_channel,
                shard,
                packed[number - 1],
                b"".join([env for _, env, _ in chunk]),
            ]
            for number, chunk in enumerate(chunks, 1)
        ]
        if len(calls) == 1:
            reply = await self._core.run("enqueue", shard, calls[0], last=last, durable=True)
            codes = [int(c) for c in reply]
        else:
            replies = await self._core.pipelined("enqueue", shard, calls, wait=True, last=last)
            codes = [int(c) for reply in replies for c in reply]
        if _FANNED_OUT in codes:  # replaces of events already fanned out to groups
            for i, code in enumerate(codes):
                if code == _FANNED_OUT:
                    level = priorities[i] if priorities else 0
                    codes[i] = await self._replace_fanned(shard, items[i], absolute, level)
        return codes

    async def _replace_fanned(
        self, shard: str, item: tuple[str, bytes, int], absolute: bool, level: int = 0
    ) -> int:
        """Replace one event for every group that still holds it, at priority ``level``:
        REPLACED or ADDED."""
        event_id, envelope, ms = item
        args = [
            event_id,
            envelope,
            ms,
            "at" if absolute else "delay",
            self._core.keys.wakeup_channel,
            shard,
            level,
        ]
        reply = await self._groups.every_group("group_replace", shard, args)
        if reply is None:  # the groups were all removed meanwhile: an ordinary replace
            (code,) = await self._enqueue_now(
                shard,
                [item],
                absolute=absolute,
                replace=True,
                priorities=[level] if level else None,
            )
            return code
        return int(reply)

    async def cancel(self, shard: str, event_id: str, group: str | None = None) -> bool:
        """Remove a pending event for every delivery group (``group`` None) or for one
        (``"default"`` the default group); True when one was removed.

        For one group of several, an event not fanned out yet is fanned out now to the
        others, due at its time (see ``lua/group_cancel.lua``). Dead letters stay (see
        :meth:`purge_dead`).
        """
        args = [event_id, group or ""]
        code = await self._groups.every_group("group_cancel", shard, args, ("cancel", args))
        if code == 2:  # a parent: its "cancelled" waits for the relay
            await nudge_relay(self._core, shard)
        return bool(code)
