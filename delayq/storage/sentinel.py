"""Following Redis Sentinel failovers without writing to a master that is being replaced.

Sentinel promotes a replica with ``REPLICAOF NO ONE`` and announces ``+switch-master``
only a second or so later; the old master stays a master for seconds more, until a
sentinel turns it into a replica, which drops every write it took meanwhile. A client that
keeps writing to the old master in that window loses those writes without an error. So the
master pool here is *fenced* while a failover runs, and the fence follows that failover:

* :class:`SentinelWatch` listens to every sentinel's events. When one starts a failover
  (``+try-failover``: "replacing ``old``") it fences the pool for it: connections in use
  are closed and no connection is handed out or opened; ``+selected-slave`` then names
  the replica being promoted (``new``).
* Only the end of *that* failover lifts the fence: a ``+switch-master`` naming its ``new``
  as master, once ``ROLE`` on ``new`` confirms it leads (or its abort, or ``FENCE_TIMEOUT``).
  Sentinels that learn of a switch late announce it late, even after the next failover has
  started: a switch to any other server is stale and ignored, as is a switch to a server
  that a failover seen since was replacing. Back-to-back failovers A→B→C thus never
  let the client back to B once B's replacement has started.
* :class:`CheckedSentinelPool` also asks the sentinels who the master is at most once a
  second before handing out a connection, so a client never keeps writing to an old master
  that came back (after a freeze or a partition) before the sentinels demoted it.

The watch starts with the first command and is closed by the service's ``aclose()``; it
lives in :mod:`~delayq.storage.sentinel_watch` (importable from here too).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import anyio
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from .sentinel_watch import SentinelWatch

__all__ = ["CheckedSentinelPool", "Failover", "SentinelWatch"]

log = logging.getLogger("delayq.sentinel")

Address = tuple[str, int]


@dataclass(frozen=True)
class Failover:
    """A failover under way: the sentinels are promoting ``new`` to replace ``old``."""

    old: Address
    new: Address | None
    """None until the sentinels picked the replica."""
    started: float
    """``time.monotonic()`` when the watch heard of it."""


class _FencedConnection(SentinelManagedConnection):
    """Connects (first time, or again after an error) only while its pool is not fenced,
    and only to the master the pool names then."""

    _addressed = False  # inside connect_to(): the address was just looked up

    async def connect_to(self, address: Address) -> None:
        """Connect to ``address`` (looked up by :meth:`_connect_retry`)."""
        self._addressed = True
        try:
            await super().connect_to(address)  # type: ignore[no-untyped-call]
        finally:
            self._addressed = False

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        """Every connect goes through :meth:`connect` (the fence, then the master's address).

        redis-py's command retry sends the command again on the same connection, which
        reconnects here to the address it last had: the old master during a failover,
        past the fence (writes the old master takes then are lost when it is demoted, and
        a BRPOP there waits for nothing).
        """
        if self._addressed or self.is_connected:
            await super().connect_check_health(check_health, retry_socket_connect)
        else:
            await self.connect()  # type: ignore[no-untyped-call]

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """Send ``command``; a connection closed under it raises ``ConnectionError`` (retried).

        The fence closes connections in use. redis-py writes in a task of its own (the
        socket timeout's ``wait_for``) that starts a loop turn after it checked the
        connection: a close in between left it no writer, and the ``AttributeError`` that
        raised was not retried (a schedule firing, a claim failed with it during failovers).
        Nothing was written then, so the command can be sent again.
        """
        try:
            await super().send_packed_command(command, check_health)
        except AttributeError as exc:
            if self.is_connected:
                raise
            raise RedisConnectionError(
                f"connection to {self.host}:{self.port} closed while sending (failover fence)"
            ) from exc

    async def _connect_retry(self) -> None:
        pool = self.connection_pool
        if not isinstance(pool, CheckedSentinelPool):
            await super()._connect_retry()  # type: ignore[no-untyped-call]
            return
        while True:
            generation = await pool.wait_unfenced()
            await super()._connect_retry()  # type: ignore[no-untyped-call]
            if pool.fences == generation:
                return
            # a failover started while this connection was being made: it may point at the
            # master being replaced, and the fence's disconnect did not see it yet
            await self.disconnect()


class _FencedSSLConnection(_FencedConnection, SentinelManagedSSLConnection):
    """The same over TLS."""


class CheckedSentinelPool(SentinelConnectionPool):
    """A master pool that hands out connections only to the master the sentinels name now.

    redis-py's pool learns the master's address only when it opens a connection,
    and gives a returned connection out again wherever it points. Here the
    sentinels are asked at most once a second, connections pointing elsewhere are
    reconnected, and none is handed out while :class:`SentinelWatch` fences the
    pool during a failover (see the module's docstring for when the fence lifts).
    """

    CHECK_EVERY = 1.0
    FENCE_TIMEOUT = 10.0
    # Sentinels learn of a switch from each other over a second or two; for this long
    # after +switch-master the announced master wins over a sentinel that lags.
    PIN_FOR = 10.0
    # ROLE on an announced master must answer within this.
    VERIFY_TIMEOUT = 2.0

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any):
        kwargs.setdefault(
            "connection_class",
            _FencedSSLConnection if kwargs.pop("ssl", False) else _FencedConnection,
        )
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self._checked_at = -float("inf")
        self._open = asyncio.Event()
        self._open.set()
        self._pinned: tuple[Address, float] | None = None
        self.failover: Failover | None = None
        """The failover the pool is fenced for, if any."""
        self.fences = 0
        """How many times the pool was fenced (a connection made across a fence is dropped)."""
        # servers that a failover was replacing: a late switch to one of them is stale
        self._replaced: set[Address] = set()
        self.watch = SentinelWatch(sentinel_manager, service_name, self)

    def fence(self, old: Address, new: Address | None) -> bool:
        """A failover replacing ``old`` (by ``new``, once known) started: hand out no
        connection until it ends. False if the pool was already fenced for it.

        Only the sentinel leading a failover sends these events, as it goes: the latest one
        names the failover under way (one fenced for earlier is over or overtaken).
        """
        current = self.failover
        if new is None and old != self.master_address and old in self._replaced:
            return False  # a sentinel that has not heard of an earlier switch yet
        if current is not None and current.old == old:
            if new is None or new == current.new:
                return False
            if current.new is None:  # the replica of the failover fenced for is known now
                self._replaced.discard(new)
                self.failover = Failover(old, new, current.started)
                return False
        self._replaced.add(old)
        if new is not None:
            self._replaced.discard(new)
        self.failover = Failover(old, new, time.monotonic())
        self.fences += 1
        self._open.clear()
        return True

    async def wait_unfenced(self) -> int:
        """Return once the pool is not fenced (dropping a fence older than
        ``FENCE_TIMEOUT``); returns :attr:`fences` then."""
        self.watch.start()
        while not self._open.is_set():
            failover = self.failover
            left = self.FENCE_TIMEOUT
            if failover is not None:
                left = failover.started + self.FENCE_TIMEOUT - time.monotonic()
            with anyio.move_on_after(max(0.0, left)):
                await self._open.wait()
            if not self._open.is_set() and self.failover is failover:
                log.warning(
                    "sentinel: no switch %.0fs after %s started; asking the sentinels",
                    self.FENCE_TIMEOUT,
                    _describe(failover),
                )
                self.unfence()
        return self.fences

    def unfence(self) -> None:
        """Hand out connections again (asking the sentinels first)."""
        self.failover = None
        self._checked_at = -float("inf")
        self._open.set()

    def aborted(self, old: Address) -> bool:
        """The failover replacing ``old`` was aborted; True if the pool was fenced for it."""
        if self.failover is None or self.failover.old != old:
            return False
        self._replaced.discard(old)
        self.unfence()
        return True

    async def switched(self, old: Address, new: Address) -> bool:
        """A sentinel announced ``new`` as the master (replacing ``old``); True if the pool
        follows it now.

        While fenced, only a switch to the fenced failover's ``new`` counts; otherwise a
        switch to the current master is old news, and one to a server a failover was
        replacing is stale. ``ROLE`` on ``new`` must say ``master`` before anything
        changes. Connections to any other address are then closed, in use or not.
        """
        failover = self.failover
        if failover is not None:
            if new != failover.new and (failover.new is not None or old != failover.old):
                log.debug(
                    "sentinel: ignoring a switch to %s:%s while %s", *new, _describe(failover)
                )
                return False
        elif new == self.master_address:
            self._pinned = (new, time.monotonic() + self.PIN_FOR)
            return False
        elif new in self._replaced:
            log.debug("sentinel: ignoring a stale switch %s:%s -> %s:%s", *old, *new)
            return False
        role = await self._role(new)
        if self.failover is not failover:  # another failover started meanwhile
            return False
        if role != b"master":
            log.warning(
                "sentinel: %s:%s was announced as master but says it is %s; waiting",
                *new,
                role.decode("utf-8", "replace") if role else "unreachable",
            )
            return False
        self._replaced.discard(new)
        self._pinned = (new, time.monotonic() + self.PIN_FOR)
        self.master_address = new
        self.failover = None  # the same switch from another sentinel is old news now
        generation = self.fences
        await self.disconnect(inuse_connections=True)
        if self.fences == generation:  # (no next failover started meanwhile)
            self.unfence()
        return True

    async def _role(self, address: Address) -> bytes | None:
        """The first word of ``ROLE`` on ``address`` (None if it did not answer)."""
        kwargs = {
            k: v
            for k, v in self.connection_kwargs.items()
            if k not in ("connection_pool", "host", "port")
        }
        kwargs.update(
            socket_timeout=self.VERIFY_TIMEOUT,
            socket_connect_timeout=self.VERIFY_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
        )
        cls = SSLConnection if issubclass(self.connection_class, SSLConnection) else Connection
        connection = cls(host=address[0], port=address[1], **kwargs)
        try:
            await connection.connect()  # type: ignore[no-untyped-call]
            await connection.send_command("ROLE")
            reply = await connection.read_response()
            return reply[0] if isinstance(reply, list) and reply else None
        except (RedisError, OSError) as exc:
            log.debug("sentinel: ROLE on %s:%s failed: %s", *address, exc)
            return None
        finally:
            await connection.disconnect()

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


def _describe(failover: Failover | None) -> str:
    if failover is None:
        return "a failover"
    new = "{}:{}".format(*failover.new) if failover.new else "?"
    return "the failover {}:{} -> {}".format(*failover.old, new)
