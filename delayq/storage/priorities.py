"""Priority levels on the consumer side: which ready lists a BRPOP takes, and which
(shard, group) views have shown a level above 0 (their claims, acks and failures then send
the level keys; see ``lua/_levels.lua`` and docs/guides/priorities.md)."""

from __future__ import annotations

from .base import StoreCore

__all__ = ["Levels"]


class Levels:
    """The ready lists of a view by level, and the views known to use levels (a part of
    :class:`~delayq.storage.delivery.Deliveries`)."""

    def __init__(self, core: StoreCore):
        self._core = core
        # (shard, group) whose BRPOP has returned an entry of a level above 0: their claims
        # take every level's list, most urgent first, and their acks and failures send `prio`
        self._levelled: set[tuple[str, str | None]] = set()
        # (shard, group) -> its ready lists, level 0 first, and each list's level by name
        self._lists: dict[tuple[str, str | None], tuple[tuple[str, ...], dict[bytes, int]]] = {}

    def ready_lists(self, shard: str, group: str | None = None) -> tuple[str, ...]:
        """A group's ready lists of levels 0..9 (level 0's is the one a type without levels
        has): a BRPOP over them, in order, pops the most urgent non-empty level's entry."""
        return self._level_lists(shard, group)[0]

    def _level_lists(
        self, shard: str, group: str | None
    ) -> tuple[tuple[str, ...], dict[bytes, int]]:
        found = self._lists.get((shard, group))
        if found is None:
            lists = (
                self._core.view(shard, group).ready,
                *self._core.keys.for_shard(shard).level_lists(group),
            )
            found = (lists, {key.encode(): n for n, key in enumerate(lists)})
            self._lists[shard, group] = found
        return found

    def levelled(self, shard: str, group: str | None = None) -> bool:
        """Whether this process has seen a ready entry above level 0 in the group's lists."""
        return (shard, group) in self._levelled

    def mark_levelled(self, shard: str, group: str | None = None) -> None:
        """Send the level keys with the group's claims, acks and failures from now on (the
        claim script asked for them: the group ages its levels)."""
        self._levelled.add((shard, group))

    def level_of_list(self, shard: str, group: str | None, key: bytes) -> int:
        """The level of the ready list named ``key`` (as a BRPOP reply names it); a level
        above 0 marks the view as levelled."""
        level = self._level_lists(shard, group)[1].get(key, 0)
        if level:
            self._levelled.add((shard, group))
        return level
