"""Partitions of hot event types: routing by id, shard names, layouts.

A type declared with ``class PaymentCheck(Event, partitions=16)`` keeps its
events in 16 partitions, each with the full set of a type's keys under its own
hash tag ``{prefix:PaymentCheck#k/16}``, so the partitions spread over the
nodes of a Redis Cluster. An event's partition is ``crc32(id) % N``: every
state change of one event (enqueue, replace, dedup, cancel, claim, ack, fail,
dead letters) stays one script on one slot.

The store, the scheduler and the consumers work on *shards*: a shard is one
key space, named ``"T"`` for an unpartitioned type (today's keys, unchanged)
or ``"T#k/N"`` for partition ``k`` of ``N``. Type names may not contain
``#``, so a shard name never collides with a type name.

A *layout* is a partition count a type has events in. ``{prefix}:types``
holds ``"T"`` for layout 1 and ``"T#N"`` for layout N, so one ``SMEMBERS``
(which the scheduler already sends) tells every process every layout in use.
A type has two layouts only while its partition count is being changed (see
:mod:`delayq.partitions.repartition`).
"""

from __future__ import annotations

import binascii
import zlib
from functools import lru_cache

__all__ = [
    "BATCH_SHARDS",
    "BATCH_TYPE",
    "MAX_PARTITIONS",
    "batch_shard",
    "batch_tag",
    "is_batch_shard",
    "layout_member",
    "parse_member",
    "parse_shard",
    "partition_of",
    "partition_tag",
    "shard_for",
    "shard_name",
    "shards",
    "type_of",
]

MAX_PARTITIONS = 1024
"""The most partitions a type may have."""

_SLOTS = 16384
# Partition k's hash tag is placed in slot range k % _BUCKETS of _BUCKETS equal ranges
_BUCKETS = 64


def _salted(base: str, partition: int, partitions: int) -> str:
    """``base`` plus the first salt ``.s`` that puts its slot in the ``partition``-th of
    ``min(partitions, 64)`` equal ranges of the 16384 cluster slots."""
    buckets = min(partitions, _BUCKETS)
    bucket = partition % buckets
    low, high = bucket * _SLOTS // buckets, (bucket + 1) * _SLOTS // buckets
    for salt in range(1 << 20):
        tag = f"{base}.{salt}"
        # Redis Cluster's key slot: CRC16-XMODEM of the tag, mod 16384
        if low <= binascii.crc_hqx(tag.encode(), 0) % _SLOTS < high:
            return tag
    return base  # unreachable in practice: ~64 tries are expected


@lru_cache(maxsize=4096)
def partition_tag(prefix: str, type_name: str, partition: int, partitions: int) -> str:
    """The hash tag (without braces) of one partition: ``prefix:T#k/N`` plus a salt.

    The salt (``.s``, the first that works) puts partition ``k`` in the ``k``-th
    of ``min(N, 64)`` equal ranges of the 16384 cluster slots. A cluster whose
    masters hold equal contiguous slot ranges (what ``redis-cli --cluster
    create`` makes) thus gets the partitions evenly: with 3 masters and 6
    partitions, two on each. A pure function of its arguments, so every
    process (and Spark executor) names the same keys.
    """
    return _salted(f"{prefix}:{type_name}#{partition}/{partitions}", partition, partitions)


BATCH_TYPE = "delayq:batch"
"""The pseudo-type of batches (docs/WORKFLOWS.md, "Batches"): batch ``B`` lives in the
shard ``"delayq:batch#k/16"`` (``k = partition_of(B, 16)``), and is the parent ``(BATCH_TYPE,
B)`` of its callbacks. No event type has this name (type names hold no ``:``)."""

BATCH_SHARDS = 16
"""How many shards batches are spread over (each under its own hash tag)."""


@lru_cache(maxsize=64)
def batch_tag(prefix: str, partition: int) -> str:
    """The hash tag (without braces) of batch shard ``partition``: ``prefix:#batches/k``
    plus a salt (as :func:`partition_tag`'s, so the shards spread over a cluster). Its last
    ``:``-part starts with ``#``, which no type's tag can: type names are not empty and hold
    no ``:`` or ``#``."""
    return _salted(f"{prefix}:#batches/{partition}", partition, BATCH_SHARDS)


def batch_shard(batch_id: str) -> str:
    """The shard that holds batch ``batch_id``."""
    return shard_name(BATCH_TYPE, partition_of(batch_id, BATCH_SHARDS), BATCH_SHARDS)


def is_batch_shard(shard: str) -> bool:
    """Whether ``shard`` is a batch shard (not an event type's)."""
    return shard.startswith("delayq:batch#")


def partition_of(event_id: str | bytes, partitions: int) -> int:
    """The partition (``0 .. partitions-1``) of an event id: CRC-32 of its UTF-8 bytes, mod N.

    The same function routes events in the service and in ``delayq.spark``,
    so every writer agrees on where an id lives.
    """
    if partitions == 1:
        return 0
    raw = event_id if isinstance(event_id, bytes) else event_id.encode("utf-8", "surrogatepass")
    return zlib.crc32(raw) % partitions


def shard_name(type_name: str, partition: int, partitions: int) -> str:
    """The shard of partition ``partition`` of ``partitions`` (the type name when 1)."""
    return type_name if partitions == 1 else f"{type_name}#{partition}/{partitions}"


def shard_for(type_name: str, event_id: str | bytes, partitions: int) -> str:
    """The shard holding event ``event_id`` of a type with ``partitions`` partitions."""
    return shard_name(type_name, partition_of(event_id, partitions), partitions)


def shards(type_name: str, partitions: int) -> list[str]:
    """Every shard of one layout, partition 0 first."""
    return [shard_name(type_name, k, partitions) for k in range(partitions)]


def parse_shard(shard: str) -> tuple[str, int, int]:
    """``(type name, partition, partitions)`` of a shard name; raises ``ValueError``."""
    type_name, sep, part = shard.partition("#")
    if not sep:
        return shard, 0, 1
    k, slash, n = part.partition("/")
    if not (slash and k.isdigit() and n.isdigit()):
        raise ValueError(f"not a shard name: {shard!r}")
    partition, partitions = int(k), int(n)
    if not (2 <= partitions <= MAX_PARTITIONS and partition < partitions) or k != str(partition):
        raise ValueError(f"not a shard name: {shard!r}")
    return type_name, partition, partitions


def type_of(shard: str) -> str:
    """The event type name of a shard."""
    return shard.partition("#")[0]


def layout_member(type_name: str, partitions: int) -> str:
    """The member of ``{prefix}:types`` recording that a type has events in this layout."""
    return type_name if partitions == 1 else f"{type_name}#{partitions}"


def parse_member(member: str) -> tuple[str, int]:
    """``(type name, partitions)`` of a ``{prefix}:types`` member; raises ``ValueError``."""
    type_name, sep, n = member.partition("#")
    if not sep:
        return member, 1
    if not n.isdigit() or n != str(int(n)) or not 2 <= int(n) <= MAX_PARTITIONS:
        raise ValueError(f"not a layout: {member!r}")
    return type_name, int(n)


def check_partitions(value: object) -> int:
    """Validate a partition count (an int from 1 to :data:`MAX_PARTITIONS`)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"partitions must be an int, not {value!r}")
    if not 1 <= value <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be from 1 to {MAX_PARTITIONS}, not {value!r}")
    return value
