"""Shard names and routing by id: kept importable here; they live in :mod:`delayq.keyspace.shards`
(shards and hash tags are part of the key layout)."""

from __future__ import annotations

from ..keyspace.shards import (
    MAX_PARTITIONS,
    check_partitions,
    layout_member,
    parse_member,
    parse_shard,
    partition_of,
    partition_tag,
    shard_for,
    shard_name,
    shards,
    type_of,
)

__all__ = [
    "MAX_PARTITIONS",
    "check_partitions",
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
