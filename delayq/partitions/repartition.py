"""Changing a type's partition count without losing events (``EventService.repartition``).

The procedure (README, "Partitions for hot types"):

1. Deploy the new count (``partitions=N``) to every process. Each process
   enqueues to the new layout and records it in ``{prefix}:types``; consumers
   and schedulers serve every layout they know of (old and new), so events
   of either layout are delivered meanwhile.
2. Once no process runs the old count, call ``repartition``. For each old
   layout it copies every scheduled event to the partition its id routes to
   in the new layout (same envelope, same due time, same priority level; an id
   already there is kept), then removes the old copy with ``migrate_out.lua`` only if it is
   still the version that was copied. Ready and running events of the old
   layout are left to the consumers; their retries come back to its schedule
   and are moved by the next pass. When the old layout holds nothing it is
   dropped from ``{prefix}:types``.

Each event moves in two scripts on two slots (no script can span two), copy
first: a crash in between leaves the event in both layouts, so it may run
twice (at-least-once), never zero times. Running ``repartition`` again
finishes the job. Dead letters stay in their old partition (listed, requeued
and purged with the type's as usual) and keep that layout registered until
they are requeued (a requeued event is moved by the next pass) or purged.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import anyio

from ..storage.store import Store
from .shards import partition_of, shards

__all__ = ["RepartitionResult", "repartition"]

log = logging.getLogger("delayq.repartition")

_BATCH = 200


@dataclass(frozen=True, slots=True)
class RepartitionResult:
    """What :func:`repartition` did."""

    moved: int
    """Scheduled events copied to the new layout and removed from the old one."""
    retired: tuple[int, ...]
    """Old partition counts that are now empty and no longer registered."""
    remaining: dict[int, int]
    """Old partition counts still holding events (ready, running, dead, or waiting for their
    parents) when it returned."""


async def repartition(
    store: Store, type_name: str, partitions: int, *, wait: float = 30.0
) -> RepartitionResult:
    """Move the type's scheduled events from every other layout into ``partitions``.

    Passes repeat (every 0.2 s) while old layouts still hold ready or running
    events, for at most ``wait`` seconds.
    """
    await store.types.known_types()
    old = [n for n in store.types.layouts(type_name) if n != partitions]
    for n in old:
        if await store.scheduling.has_groups(shards(type_name, n)[0]):
            raise ValueError(
                f"{type_name} has delivery groups: repartitioning it is not supported yet"
            )
    await store.types.register_type(shards(type_name, partitions)[0])
    moved = 0
    deadline = time.monotonic() + wait
    retired: list[int] = []
    remaining: dict[int, int] = {}
    while True:
        remaining = {}
        for n in old:
            if n in retired:
                continue
            for shard in shards(type_name, n):
                moved += await _move_scheduled(store, type_name, shard, partitions)
            counts = await _counts(store, type_name, n)
            if counts == 0:
                await store.types.forget_layout(type_name, n)
                retired.append(n)
                log.info("%s: the %d-partition layout is empty and retired", type_name, n)
            else:
                remaining[n] = counts
        if not remaining or time.monotonic() >= deadline:
            return RepartitionResult(moved, tuple(retired), remaining)
        await anyio.sleep(0.2)


async def _move_scheduled(store: Store, type_name: str, shard: str, partitions: int) -> int:
    moved = 0
    while page := await store.scheduling.peek_scheduled(shard, _BATCH):
        by_target: dict[str, tuple[list[tuple[str, bytes, int]], list[int]]] = {}
        for raw_id, envelope, due, level in page:
            event_id = raw_id.decode("utf-8", "replace")
            target = shards(type_name, partitions)[partition_of(event_id, partitions)]
            items, levels = by_target.setdefault(target, ([], []))
            items.append((event_id, envelope, due))
            levels.append(level)
        for target, (items, levels) in by_target.items():
            # copy first (absolute due time, an id already there is kept) ...
            await store.enqueueing.enqueue(
                target,
                items,
                absolute=True,
                replace=False,
                priorities=levels if any(levels) else None,
            )
        # ... then remove the copied version from the old layout
        done = 0
        for raw_id, envelope, _, _ in page:
            done += await store.scheduling.migrate_out(shard, raw_id, envelope)
        moved += done
        if done == 0:
            break  # every one changed under us (replaced or moved): next pass
    return moved


async def _counts(store: Store, type_name: str, partitions: int) -> int:
    counts = await store.browsing.shard_counts(shards(type_name, partitions))
    # children waiting for their parents count: a layout is not retired under them
    return sum(c.scheduled + c.ready + c.in_flight + c.dead + c.waiting for c in counts)
