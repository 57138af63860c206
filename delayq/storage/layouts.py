"""The prefix's type set: which types (and partition layouts) have events, and their shards."""

from __future__ import annotations

from ..keyspace.names import validate_name
from ..keyspace.shards import layout_member, parse_member, parse_shard, shards
from .base import StoreCore, log
from .flow import FlowLimitsStore


class Layouts:
    """Registering types in ``{prefix}:types`` and knowing each type's layouts.

    A layout new to Redis, or one forgotten, splits the type's flow limits again over
    the shards of the layouts left (``limits``: see :mod:`delayq.storage.flow`).
    """

    def __init__(self, core: StoreCore, limits: FlowLimitsStore):
        self._core = core
        self._limits = limits
        # the type set's members this process has registered or seen added
        self._known_types: set[str] = set()
        # type -> partition counts it has events in (its layouts), as last read from
        # {prefix}:types or declared by this process's event classes
        self._layouts: dict[str, set[int]] = {}

    async def register_type(self, type_name: str) -> None:
        """Record the type (layout) of shard ``type_name`` in the prefix's type set, once
        per process: ``T`` for an unpartitioned type, ``T#N`` for N partitions.

        A layout new to Redis gets the type's limits (split again over the shards of
        every layout, see :mod:`delayq.storage.flow`)."""
        name, _, partitions = parse_shard(type_name)
        member = layout_member(name, partitions)
        if member in self._known_types:
            return
        added = bool(await self._core.redis.sadd(self._core.keys.types, member))
        self._known_types.add(member)
        self.declare(name, partitions)
        if not added:
            return
        await self.known_types()  # the type's other layouts, if any (once per new layout)
        others = [n for n in self.layouts(name) if n != partitions]
        if others:
            await self._limits.layout_added(name, shards(name, others[0])[0], self.shards(name))

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
        """Drop a layout from the prefix's type set (after it has been emptied); the
        type's limits move to the remaining shards."""
        fields = await self._limits.read_limits(shards(type_name, partitions)[0])
        member = layout_member(type_name, partitions)
        await self._core.redis.srem(self._core.keys.types, member)
        self._known_types.discard(member)
        known = self._layouts.get(type_name)
        if known is not None:
            known.discard(partitions)
        if fields:
            await self._limits.spread_limits(type_name, self.shards(type_name), fields)

    async def known_types(self) -> set[str]:
        """Every type name used under the prefix (a partitioned type once).

        Also refreshes the layouts (partition counts) of every type, see :meth:`layouts`.
        """
        members = await self._core.redis.smembers(self._core.keys.types)
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
                log.warning(
                    "ignoring invalid event type name %r in %s", member, self._core.keys.types
                )
                continue
            names.add(name)
            found.setdefault(name, set()).add(partitions)
        for name, layouts in found.items():
            self._layouts.setdefault(name, set()).update(layouts)
        return names
