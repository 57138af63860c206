"""Shard names and routing by id: kept importable here; they live in :mod:`delayq.keyspace.shards`
(shards and hash tags are part of the key layout)."""

from __future__ import annotations

from ..keyspace.shards import *  # noqa: F403
from ..keyspace.shards import __all__ as __all__
