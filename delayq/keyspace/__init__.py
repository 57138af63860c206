"""The Redis key layout, owned in one place: names, shards and hash tags, keys, each script's KEYS.

- ``names``: what a prefix, type, sink or schedule name may hold (it becomes part of keys).
- ``shards``: partitions of a type, shard names (``T#k/N``), hash tags, layouts.
- ``groups``: the default delivery group's two names (``None``, ``"default"``).
- ``layout``: :class:`PrefixKeys` and :class:`TypeKeys`, every key by name.
- ``scripts``: each Lua script's KEYS as an ordered list of names, from which the store
  builds a call and the Lua loader names the keys (``local K_READY = KEYS[i]``).

The key table of docs/ARCHITECTURE.md is checked against this package by a test.
"""

from __future__ import annotations

from .groups import DEFAULT_GROUP, group_name, labelled, stored_group
from .layout import KeyView, PrefixKeys, TypeKeys
from .names import validate_name

__all__ = [
    "DEFAULT_GROUP",
    "KeyView",
    "PrefixKeys",
    "TypeKeys",
    "group_name",
    "labelled",
    "stored_group",
    "validate_name",
]
