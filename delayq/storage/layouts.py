"""The prefix's type set: which types (and partition layouts) have events, and their shards."""

from __future__ import annotations

from ..keyspace.names import validate_name
from ..keyspace.shards import layout_member, parse_member, parse_shard, shards
from .base import StoreBase, log


class Layouts(StoreBase):
    """Registering types in ``{prefix}:types`` and knowing each type's layouts."""

    _known_types: set[str]
    # type -> partition counts it has events in (its layouts), as last read from
    # {prefix}:types or declared by this process's event classes
    _layouts: dict[str, set[int]]

    async def register_type(self, type_name: str) -> None:
        """Record the type (layout) of shard ``type_name`` in the prefix's type set, once
        per process: ``T`` for an unpartitioned type, ``T#N`` for N partitions."""
        await self._register_member(type_name)

    async def _register_member(self, type_name: str) -> tuple[str, bool]:
        """:meth:`register_type`; returns the type name and whether this call added the
        layout to Redis (the first process to use it)."""
        name, _, partitions = parse_shard(type_name)
        member = layout_member(name, partitions)
        added = False
        if member not in self._known_types:
            added = bool(await self.redis.sadd(self.keys.types, member))
            self._known_types.add(member)
            self.declare(name, partitions)
        return name, added

    def declare(self, type_name: str, partitions: int) -> None:
        """Note that ``type_name`` has (or may have) events in ``partitions`` partitions."""
        self._layouts.setdefault(type_name, set()).add(partitions)

    def layouts(self, type_name: str) -> tuple[int, ...]:
        """The partition counts the type is known to have events in (largest first)."""
        return tuple(sorted(self._layouts.get(type_name) or {1}, reverse=True))

    def shards(self, type_name: str) -> list[str]:
        """Every shard of every known layout of the type."""
        return [s for n in self.layouts(type_name) for s in shards(type_name, n)]

    async def forget_layout(self, type_name: str, partitions: int) -> None:
        """Drop a layout from the prefix's type set (after it has been emptied)."""
        member = layout_member(type_name, partitions)
        await self.redis.srem(self.keys.types, member)
        self._known_types.discard(member)
        known = self._layouts.get(type_name)
        if known is not None:
            known.discard(partitions)

    async def known_types(self) -> set[str]:
        """Every type name used under the prefix (a partitioned type once).

        Also refreshes the layouts (partition counts) of every type, see :meth:`layouts`.
        """
        members = await self.redis.smembers(self.keys.types)
        names = set()
        found: dict[str, set[int]] = {}
        for member in members:
            try:
                # strict: a name that is not UTF-8 was not written by delayq, and
                # a replaced character would name other keys than the member's
                text = member.decode() if isinstance(member, bytes) else member
                name, partitions = parse_member(text)
                validate_name(name)
            except (TypeError, ValueError):  # UnicodeDecodeError is a ValueError
                log.warning("ignoring invalid event type name %r in %s", member, self.keys.types)
                continue
            names.add(name)
            found.setdefault(name, set()).add(partitions)
        for name, layouts in found.items():
            self._layouts.setdefault(name, set()).update(layouts)
        return names
