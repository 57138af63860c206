"""The state every part of the store shares, the keys of a shard, and one script call.

The mixins in this package build on :class:`StoreBase`; ``delayq.store.Store``
sets the state up and provides what needs redis itself (pipelines, errors).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..keys import PrefixKeys

if TYPE_CHECKING:
    from ..connect import Client, LuaScript

# the logger of delayq.store, whichever part of the store logs
log = logging.getLogger("delayq.store")

# How many keys of a group's view (keys.TypeKeys.view) each script takes:
# only what it uses, so a type without groups sends what it always sent.
_NKEYS = {
    "claim": 10, "renew": 10, "dead_list": 10, "migrate_out": 10, "move_due": 11, "cancel": 11,
    "group_register": 11, "ack": 12, "dead_purge": 12,
    # a group's reads pass its read view (keys.TypeKeys.read_view) instead
    "counts": 10, "scheduled_list": 10, "due_histogram": 10,
}  # fmt: skip


class StoreBase(ABC):
    """What the parts of :class:`delayq.store.Store` share (set up by its ``__init__``)."""

    redis: Client
    blocking: Client
    min_replicas: int
    replica_timeout_ms: int
    keys: PrefixKeys
    _type_keys: dict[tuple[str, str | None], tuple[str, ...]]
    _scripts: dict[str, LuaScript]

    def _k(self, type_name: str, group: str | None = None) -> tuple[str, ...]:
        """The 13 keys of a group's view (``TypeKeys.view``); the default group's by default."""
        keys = self._type_keys.get((type_name, group))
        if keys is None:
            keys = self.keys.for_shard(type_name).view(group)
            self._type_keys[type_name, group] = keys
        return keys

    def _read_keys(self, type_name: str, group: str | None) -> tuple[str, ...]:
        """The keys of a read-only script: the type's (its default group's lists, no
        retry schedules) for ``None``, else the group's read view (``TypeKeys.read_view``)."""
        if group is None:
            return self._k(type_name)[:10]
        return self.keys.for_shard(type_name).read_view(group)

    async def _read(
        self, script: str, type_name: str, args: Sequence[Any], group: str | None
    ) -> Any:
        """Run a read-only script on the type, or on one group of it (see :meth:`_read_keys`)."""
        return await self._scripts[script](keys=self._read_keys(type_name, group), args=args)

    async def _run(
        self,
        script: str,
        type_name: str,
        args: Sequence[Any],
        client: Any = None,
        *,
        group: str | None = None,
    ) -> Any:
        keys = self._k(type_name, group)[: _NKEYS.get(script, 13)]
        return await self._scripts[script](keys=keys, args=args, client=client)

    # -- provided by delayq.store.Store (they need redis's own types) ----------------

    @abstractmethod
    async def _pipelined(
        self,
        script: str,
        type_name: str,
        calls: Sequence[Sequence[Any]],
        *,
        wait: bool = False,
        group: str | None = None,
    ) -> list[Any]:
        """Run one script several times in one pipeline; replies in order."""

    @abstractmethod
    async def _run_durable(
        self, script: str, type_name: str, args: Sequence[Any], *, group: str | None = None
    ) -> Any:
        """Run a script; with ``min_replicas``, also wait for that many replicas to have it."""

    @abstractmethod
    async def _per_type(self, script: str, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """Run one script once per ``(type name, args)``, pipelined; replies in order."""

    @abstractmethod
    async def _with_keys(
        self, script: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Run one script once per ``(keys, args)``, pipelined; replies in order."""

    @abstractmethod
    async def _enqueue_now(
        self,
        type_name: str,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool,
        replace: bool,
    ) -> list[int]:
        """Enqueue ``items`` now (not coalesced); Redis out of memory raises QueueFullError."""
