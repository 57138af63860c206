"""Delivery groups: several independent subscribers of one event type.

Each event that becomes due is delivered once to every group registered for
its type, and each group has its own ready list, leases, retries and dead
letters: a failure in one group never re-runs another group's handler.
Handlers added without a ``group`` form the default group, which uses the
type's own keys; a type whose handlers never name a group works (and costs)
exactly as without this module. The fan-out happens in the scheduler's move
(``lua/group_move.lua``), so enqueueing costs the same whatever the number of
groups. See docs/ARCHITECTURE.md, "Delivery groups".

This module holds what the service needs beyond the store's group scripts:
the group names as the public API takes them (:func:`check_group`,
:func:`check_view`, called once by the facade; inside, ``None`` is the
default group) and the group-level operations behind
``EventService.register_group`` and friends.
"""

from __future__ import annotations

import logging

from ..events import validate_name
from ..keyspace.groups import DEFAULT_GROUP, group_name, stored_group
from ..storage.store import QueueCounts, Store, sum_counts

__all__ = ["DEFAULT_GROUP", "Groups", "PendingGroups", "check_group", "check_view"]

log = logging.getLogger("delayq.groups")


def check_group(group: object) -> str | None:
    """Validate a group name; return None for the default group (``None`` or ``"default"``)."""
    if isinstance(group, str | None) and stored_group(group) is None:
        return None
    return validate_name(group, "group name")


def check_view(group: object) -> str | None:
    """Validate the ``group`` of a view (``scheduled``, ``due_histogram``, ``run_now``...).

    There ``None`` means the type as a whole (its schedule; every group for
    ``run_now``) and ``"default"`` the default group alone (with its retries),
    so the name is kept as given.
    """
    return None if group is None else validate_name(group, "group name")


class PendingGroups:
    """Named groups of a running service's handlers not known yet to be registered in Redis.

    A consumer registers its group as it starts, in a task of its own; until then
    the scheduler's fan-out would not deliver to the group. So the service's next
    enqueue and the next scheduler pass in this process register what is pending
    first: what ``add_handler(..., group=...)`` did is in effect before anything
    else this process does can observe it. With nothing pending (no named groups,
    or all registered) the cost is one attribute check.
    """

    __slots__ = ("_groups", "_store", "any")

    def __init__(self, store: Store):
        self._store = store
        self._groups: dict[tuple[str, str], int] = {}
        self.any = False
        """True while a registration is pending (checked on every enqueue: keep it cheap)."""

    def add(self, name: str, group: str, max_deliveries: int) -> None:
        """Note a group to register before the next enqueue or fan-out."""
        self._groups[name, group] = max_deliveries
        self.any = True

    def discard(self, name: str, group: str) -> None:
        """The group is registered (its consumer did it), or its handler was removed."""
        self._groups.pop((name, group), None)
        self.any = bool(self._groups)

    async def flush(self) -> None:
        """Register every pending group; a Redis error propagates (nothing is dropped)."""
        for (name, group), max_deliveries in list(self._groups.items()):
            for shard in self._store.types.shards(name):  # as the consumer does (idempotent)
                await self._store.types.register_type(shard)
                await self._store.groups.register_group(shard, group, max_deliveries)
            if self._groups.get((name, group)) == max_deliveries:
                self.discard(name, group)


class Groups:
    """Group-level operations of one service (the store does the Redis side)."""

    def __init__(self, store: Store, default_max_deliveries: int):
        self._store = store
        self._max = default_max_deliveries

    async def register(
        self, type_name: str, group: str | None, retry_attempts: int | None = None
    ) -> bool:
        """Register ``group`` (None: the default group) for ``type_name`` (in every
        partition); True when it is new."""
        group = group_name(group)  # the registry names the default group
        max_deliveries = self._max if retry_attempts is None else 1 + retry_attempts
        new = False
        for shard in self._store.types.shards(type_name):
            await self._store.types.register_type(shard)
            new = await self._store.groups.register_group(shard, group, max_deliveries) or new
        return new

    async def remove(self, type_name: str, group: str | None) -> bool:
        """Drop ``group`` (None: the default group) and its pending deliveries; False when
        it was not registered."""
        group = group_name(group)
        code = 0
        for shard in self._store.types.shards(type_name):
            # groups are registered in every partition together: the last group of
            # the first partition is the last of all, refused before anything changed
            got = await self._store.groups.remove_group(shard, group)
            if got < 0:
                code = got
                break
            code = max(code, got)
        if code < 0:
            raise ValueError(
                f"{group!r} is the last delivery group of {type_name!r}; a type always has one"
            )
        if code:
            log.info("%s: removed delivery group %r", type_name, group)
        return code > 0

    async def names(self, type_name: str) -> list[str]:
        """The registered groups (``["default"]`` while no group has been named)."""
        groups = await self._store.groups.groups(self._store.types.shards(type_name)[0])
        return sorted(groups) if groups else [DEFAULT_GROUP]

    async def counts(self, type_name: str) -> dict[str, QueueCounts]:
        """Counts per registered group (summed over the type's partitions)."""
        shards = self._store.types.shards(type_name)
        groups = await self._store.groups.groups(shards[0])
        if not groups:
            return {DEFAULT_GROUP: (await self._store.browsing.counts([type_name]))[type_name]}
        parts: dict[str, list[QueueCounts]] = {}
        for shard in shards:
            for name, c in (await self._store.browsing.group_counts(shard, groups)).items():
                parts.setdefault(name, []).append(c)
        return {name: sum_counts(p) for name, p in parts.items()}
