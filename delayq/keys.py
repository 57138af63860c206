"""The Redis key layout: kept importable as ``delayq.keys``; it lives in :mod:`delayq.keyspace`."""

from __future__ import annotations

from .keyspace.layout import DEFAULT_GROUP, KeyView, PrefixKeys, TypeKeys

__all__ = ["DEFAULT_GROUP", "KeyView", "PrefixKeys", "TypeKeys"]
