"""The write pass of :func:`~delayq.spark.enqueue_dataframe`, on the executors: the valid
items to Redis through ``enqueue.lua``, each routed to its partition as the service routes it."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from ..keys import PrefixKeys, TypeKeys
from ..keyspace.scripts import SCRIPT_KEYS, keys_for
from ..partitions.shards import layout_member, partition_of, shard_name
from ..storage.store import ENQUEUE_CHUNK, Enqueued
from .clients import run_enqueue, shared_client
from .validate import Checked, EnqueueJob

__all__ = ["write_partition"]

# the counts' column (kept, added, replaced, skipped) of each answer; a replace of an event
# already fanned out to delivery groups, which this path does not do (EventService.enqueue_*
# does), counts as kept
_COLUMN: dict[int, int] = {
    Enqueued.KEPT: 0,
    Enqueued.ADDED: 1,
    Enqueued.REPLACED: 2,
    Enqueued.IN_LEDGER: 3,
}


def write_partition(
    job: EnqueueJob, checked: Iterable[Checked]
) -> Iterator[tuple[int, int, int, int]]:
    """Write pass over one partition's valid batches; yields one ``(added, kept, replaced,
    skipped)`` (skipped: rows a streaming sink's ledger holds for this batch already)."""
    client = shared_client(job.redis_url, job.cluster)
    # rows are routed by id as the service routes them (crc32(id) % N): each goes
    # to its partition's keys
    partitions = job.event_type.event_partitions
    width = job.width  # 4: each row's priority level after its ms (enqueue.lua's ':p')
    mode = (job.mode if job.mode != "now" else "delay") + (":p" if width == 4 else "")
    channel = PrefixKeys(job.prefix).wakeup_channel
    # "<replace>:<call id>:<chunk no>", as store.enqueueing.enqueue sends: one call per task,
    # so the script tells a retried chunk from a row that repeats an earlier one
    flags = f"{'1' if job.replace else '0'}:{uuid.uuid4().hex}"
    chunk_no = 0
    counts = [0, 0, 0, 0]
    script = "enqueue" if job.sink is None else "sink_enqueue"
    extra = [] if job.sink is None else [str(job.batch_id)]
    registered = False

    def flush(args: list[Any]) -> None:
        nonlocal registered, chunk_no
        if not registered:
            # what store.types.register_type does before the service's first enqueue
            client.sadd(PrefixKeys(job.prefix).types, layout_member(job.type_name, partitions))
            registered = True
        routed: dict[int, list[Any]] = {}
        for i in range(0, len(args), width):
            routed.setdefault(partition_of(args[i], partitions), []).extend(args[i : i + width])
        step = width * ENQUEUE_CHUNK
        for k, part in sorted(routed.items()):
            # the registry keys too: for a type with delivery groups, due-now rows go
            # through the schedule so the scheduler fans them out to every group
            type_keys = TypeKeys(job.prefix, job.type_name, k, partitions)
            keys: tuple[str, ...] = type_keys.view()
            if job.sink is not None:
                keys += (type_keys.sink(job.sink),)
            # levels: every key of the script, `prio` and the levels' lists; a replace too
            # (`waiting`: a child waiting for its parents keeps waiting, see enqueue.lua)
            if width == 4 or job.replace:
                named = type_keys.named()
                if job.sink is not None:
                    named = {**named, "sink": type_keys.sink(job.sink)}
                keys = keys_for(SCRIPT_KEYS[script], named)
            shard = shard_name(job.type_name, k, partitions)
            calls = []
            for i in range(0, len(part), step):
                chunk_no += 1
                calls.append(
                    [mode, f"{flags}:{chunk_no}", channel, shard, *extra, *part[i : i + step]]
                )
            for codes in run_enqueue(client, keys, calls, script):
                for code in codes:
                    counts[_COLUMN.get(code, 0)] += 1

    for ok, _, batch, _ in checked:
        if ok:
            flush(batch)
    yield counts[1], counts[0], counts[2], counts[3]
