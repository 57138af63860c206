"""A cluster client that stops knocking on a dead node for a moment (a per-node breaker).

redis-py's cluster client answers a lost connection by reloading its whole slot map
(``CLUSTER SLOTS`` and a Python pass over 16,384 slots, about 25 ms of CPU on a loaded
2-core host) under a lock that every other command of the client then waits on, and
then retries. While a killed master waits for its replica's promotion (seconds), every
command routed to it fails that way, and a process whose loops, fetchers, acks and
renewals meet it spends most of its time reloading: the commands to the healthy
masters, on time otherwise, waited 0.5-3 s behind (issue 37).

:class:`BreakingCluster` remembers, per node, a connection failure for
:data:`PAUSE` seconds and fails the commands for that node at once meanwhile (the
same ``ConnectionError``, without a reload or a connection attempt); the first
command after the pause tries the node again. After a promotion that command's
failure reloads the slot map, which now names the replica, and its retry goes there:
the failed node's shards resume within about :data:`PAUSE` of the promotion. Commands
for other nodes never wait for any of it. A success clears the node's mark.

The reload itself is trimmed to what a failover changes. redis-py's reload also asks
the *default node* for its command table (``COMMAND``), and the default node is the
first master of the map: when that is the killed one, every reload failed, closing
every connection of the client (commands under way to the healthy masters included)
and leaving the map unreloaded, so the whole client stalled until the promotion
(2-4 s, in a third of the kills). A reload after the first one reads the slot map
only (the command table does not change with a failover) and makes a live master the
default node.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["PAUSE", "BreakingCluster"]

PAUSE = 0.2
"""Seconds a node that refused or dropped a connection is not tried again."""


class BreakingCluster(RedisCluster):
    """A :class:`redis.asyncio.cluster.RedisCluster` with a per-node breaker (see the module)."""

    __slots__ = ("_down_until",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._down_until: dict[str, float] = {}
        super().__init__(*args, **kwargs)

    async def initialize(self, *args: Any, **kwargs: Any) -> BreakingCluster:
        """Load the slot map (and, the first time, the command table) if needed."""
        if not self._initialize or not getattr(self.commands_parser, "commands", None):
            await super().initialize(*args, **kwargs)
            return self
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._initialize:
                await self.nodes_manager.initialize(*args, **kwargs)
                self._initialize = False
                self._keep_default_alive()
        return self

    def _keep_default_alive(self) -> None:
        default = self.nodes_manager.default_node
        now = time.monotonic()
        if default is None or self._down_until.get(default.name, 0.0) <= now:
            return
        for node in self.get_primaries():
            if self._down_until.get(node.name, 0.0) <= now:
                self.nodes_manager.default_node = node
                return

    async def _execute_command(self, target_node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        name = target_node.name
        until = self._down_until.get(name)
        if until is not None and time.monotonic() < until:
            raise RedisConnectionError(f"{name} failed less than {PAUSE:g}s ago; not tried yet")
        try:
            reply = await super()._execute_command(target_node, *args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError):
            self._down_until[name] = time.monotonic() + PAUSE
            raise
        if until is not None:
            self._down_until.pop(name, None)
        return reply
