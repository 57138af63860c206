"""Following Redis Sentinel failovers without writing to a master that is being replaced.

Sentinel promotes a replica with ``REPLICAOF NO ONE`` and only then, a second or two
later, announces ``+switch-master`` and turns the old master into a replica, which
drops every write it took meanwhile. A client that keeps writing to the old master
in that window loses those writes without an error. So the master pool here is
*fenced* while a failover runs:

* :class:`SentinelWatch` listens to every sentinel's events. When one starts
  promoting a replica (``+selected-slave``, ``+failover-state-send-slaveof-noone``)
  it fences the pool: connections in use are closed (their commands are retried)
  and no connection is handed out until ``+switch-master`` names the new master
  (or ``FENCE_TIMEOUT`` passes, or the failover is aborted).
* :class:`CheckedSentinelPool` also asks the sentinels who the master is at most
  once a second before handing out a connection, so a client never keeps writing
  to an old master that came back (after a freeze or a partition) before the
  sentinels demoted it.

The watch starts with the first command and is closed by the service's ``aclose()``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import anyio
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.sentinel import (
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["CheckedSentinelPool", "SentinelWatch"]

log = logging.getLogger("delayq.sentinel")

# Events with which the sentinel leading a failover starts promoting a replica.
_PROMOTING = ("+selected-slave", "+failover-state-send-slaveof-noone")
# Events that end a failover without a switch.
_ABORTED = ("-failover-abort-not-elected", "-failover-abort-no-good-slave",
            "-failover-abort-slave-timeout", "+failover-end-for-timeout")  # fmt: skip
_CHANNELS = ("+switch-master", *_PROMOTING, *_ABORTED)


class _FencedConnection(SentinelManagedConnection):
    """Connects (first time, or again after an error) only while its pool is not fenced."""

    async def _connect_retry(self) -> None:
        pool = self.connection_pool
        if isinstance(pool, CheckedSentinelPool):
            await pool.wait_unfenced()
        await super()._connect_retry()  # type: ignore[no-untyped-call]


class _FencedSSLConnection(_FencedConnection, SentinelManagedSSLConnection):
    """The same over TLS."""


class CheckedSentinelPool(SentinelConnectionPool):
    """A master pool that hands out connections only to the master the sentinels name now.

    redis-py's pool learns the master's address only when it opens a connection,
    and gives a returned connection out again wherever it points. Here the
    sentinels are asked at most once a second, connections pointing elsewhere are
    reconnected, and none is handed out while :class:`SentinelWatch` fences the
    pool during a failover.
    """

    CHECK_EVERY = 1.0
    FENCE_TIMEOUT = 10.0
    # Sentinels learn of a switch from each other over a second or two; for this long
    # after +switch-master the announced master wins over a sentinel that lags.
    PIN_FOR = 10.0

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any):
        kwargs.setdefault(
            "connection_class",
            _FencedSSLConnection if kwargs.pop("ssl", False) else _FencedConnection,
        )
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self._checked_at = -float("inf")
        self._open = asyncio.Event()
        self._open.set()
        self._pinned: tuple[tuple[str, int], float] | None = None
        self.watch = SentinelWatch(sentinel_manager, service_name, self)

    def fence(self) -> None:
        """Hand out no connection until :meth:`unfence` (a failover is under way)."""
        self._open.clear()

    async def wait_unfenced(self) -> None:
        """Return once the pool is not fenced (or after ``FENCE_TIMEOUT``)."""
        self.watch.start()
        if not self._open.is_set():
            with anyio.move_on_after(self.FENCE_TIMEOUT):
                await self._open.wait()

    def unfence(self) -> None:
        """Hand out connections again (asking the sentinels first)."""
        self._checked_at = -float("inf")
        self._open.set()

    async def switched(self, address: tuple[str, int]) -> bool:
        """A sentinel announced ``address`` as the new master; True if that is news.

        Connections to any other address are closed, in use or not.
        """
        self._pinned = (address, time.monotonic() + self.PIN_FOR)
        news = self.master_address != address
        if news:
            self.master_address = address
            await self.disconnect(inuse_connections=True)
        self.unfence()
        return news

    async def get_master_address(self) -> tuple[str, int]:
        """The master's address: the sentinels' answer, unless a switch was announced lately."""
        address: tuple[str, int] = await self.sentinel_manager.discover_master(self.service_name)
        if self._pinned is not None:
            pinned, until = self._pinned
            if time.monotonic() < until:
                address = pinned
            else:
                self._pinned = None
        if self.master_address != address:
            self.master_address = address
            # idle connections reconnect to the new master the next time they are used
            await self.disconnect(inuse_connections=False)
        return address

    async def ensure_connection(self, connection: AbstractConnection) -> None:
        """Connect ``connection`` to the current master (reconnecting it if it moved)."""
        await self.wait_unfenced()
        now = time.monotonic()
        if now - self._checked_at >= self.CHECK_EVERY:
            self._checked_at = now
            try:
                await self.get_master_address()  # closes idle connections if it moved
            except RedisConnectionError as exc:  # no sentinel answered: the next check will
                log.debug("asking the sentinels for the master failed: %s", exc)
        address = self.master_address
        if (
            connection.is_connected
            and address is not None
            and (getattr(connection, "host", None), getattr(connection, "port", None))
            != tuple(address)
        ):
            await connection.disconnect()
        await super().ensure_connection(connection)


class SentinelWatch:
    """Listens to every sentinel for the events of a failover of ``service_name``.

    Owned by the service: :meth:`start` (idempotent, called with the first
    command) starts one listener task per sentinel, :meth:`aclose` cancels and
    awaits them.
    """

    def __init__(self, manager: Sentinel, service_name: str, pool: CheckedSentinelPool):
        self._manager = manager
        self._service_name = service_name
        self._pool = pool
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.switches = 0

    def start(self) -> None:
        """Start listening (once; never after :meth:`aclose`)."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="delayq-sentinel-watch"
            )

    async def aclose(self) -> None:
        """Stop listening and wait until the listeners have ended."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await asyncio.wait([task])

    async def _run(self) -> None:
        async with anyio.create_task_group() as tg:
            for sentinel in self._manager.sentinels:
                tg.start_soon(self._listen, sentinel)

    async def _listen(self, sentinel: Any) -> None:
        backoff = 0.1
        while True:
            pubsub = sentinel.pubsub()
            try:
                await pubsub.subscribe(*_CHANNELS)
                backoff = 0.1
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        await self._event(msg["channel"], msg["data"])
            except Exception as exc:  # that sentinel went away: the others still listen
                log.debug("sentinel watch: %s; resubscribing in %.1fs", exc, backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    await pubsub.aclose()

    async def _event(self, channel: bytes | str, data: bytes | str) -> None:
        name = channel.decode() if isinstance(channel, bytes) else channel
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        parts = text.split()
        if name == "+switch-master":
            # <name> <old ip> <old port> <new ip> <new port>; every sentinel sends it
            if len(parts) != 5 or parts[0] != self._service_name:
                return
            if await self._pool.switched((parts[3], int(parts[4]))):
                self.switches += 1
                log.warning(
                    "sentinel: the master of %s moved from %s:%s to %s:%s; reconnecting",
                    *parts,
                )
            return
        # "<type> <name> <ip> <port> @ <master name> <ip> <port>", or for the master itself
        # "master <name> <ip> <port>"
        if "@" in parts:
            master = parts[parts.index("@") + 1] if parts.index("@") + 1 < len(parts) else ""
        else:
            master = parts[1] if len(parts) > 1 and parts[0] == "master" else ""
        if master != self._service_name:
            return
        if name in _PROMOTING:
            log.warning(
                "sentinel: promoting %s for %s; holding commands until the switch",
                parts[1],
                self._service_name,
            )
            self._pool.fence()
            await self._pool.disconnect(inuse_connections=True)
        else:
            log.warning("sentinel: failover of %s ended without a switch (%s)", parts, name)
            self._pool.unfence()
