"""Building the redis.asyncio clients a service owns: one Redis, a Cluster, or Sentinel.

Every client speaks RESP2 and retries connection errors with backoff (a retried
script is safe: every script is safe to run twice). The service needs a client
for commands and scripts and one for blocking calls (BRPOP, pub/sub) whose
socket timeout is above the block time.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

__all__ = [
    "CheckedSentinelPool",
    "Clients",
    "SentinelAddress",
    "SentinelWatch",
    "parse_sentinel_url",
    "sentinel_clients",
    "url_clients",
]

log = logging.getLogger("delayq.connect")

SentinelAddress = tuple[str, int]
"""``(host, port)`` of one sentinel."""

# A command (not a blocking one) that takes longer than this is treated as a lost connection.
COMMAND_TIMEOUT = 10.0
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")


def _common() -> dict[str, Any]:
    return {
        "protocol": 2,
        "decode_responses": False,
        "socket_connect_timeout": 5,
        "socket_keepalive": True,
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.02), retries=3),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError, ConnectionResetError],
    }


@dataclass
class Clients:
    """The clients a service owns, and what else must be closed with them."""

    commands: Redis | RedisCluster
    blocking: Redis | RedisCluster | None
    owned: list[Any] = field(default_factory=list)
    watch: SentinelWatch | None = None


def url_clients(url: str, *, cluster: bool, polling: float) -> Clients:
    """Two clients on ``url`` (a single Redis, or any node of a Cluster)."""
    factory: Any = RedisCluster.from_url if cluster else Redis.from_url
    commands = factory(url, socket_timeout=COMMAND_TIMEOUT, **_common())
    blocking = factory(url, socket_timeout=polling + COMMAND_TIMEOUT, **_common())
    return Clients(commands, blocking, [commands, blocking])


def sentinel_clients(
    sentinels: list[SentinelAddress],
    service_name: str,
    *,
    polling: float,
    sentinel_kwargs: dict[str, Any] | None = None,
    **connection_kwargs: Any,
) -> Clients:
    """One client for the master named ``service_name``, found through ``sentinels``.

    Commands, scripts, BRPOP and pub/sub share one master connection pool: its
    socket timeout is above the block time. When the sentinels promote another
    server, connections to the old master fail (Sentinel kills them, or the
    server answers READONLY) and new ones are made to the new master.
    """
    if not sentinels:
        raise ValueError("from_sentinel needs at least one (host, port) sentinel address")
    for address in sentinels:
        if (
            not isinstance(address, tuple)
            or len(address) != 2
            or not isinstance(address[0], str)
            or not isinstance(address[1], int)
        ):
            raise TypeError(f"a sentinel address is a (host, port) tuple, not {address!r}")
    if not isinstance(service_name, str) or not service_name:
        raise ValueError(f"service_name must be a non-empty str, not {service_name!r}")
    manager = Sentinel(  # type: ignore[no-untyped-call]
        sentinels,
        sentinel_kwargs={"socket_timeout": 2.0, "socket_connect_timeout": 2.0,
                         **(sentinel_kwargs or {})},
    )  # fmt: skip
    options = {**_common(), "socket_timeout": polling + COMMAND_TIMEOUT, **connection_kwargs}
    master = manager.master_for(service_name, connection_pool_class=CheckedSentinelPool, **options)
    return Clients(master, None, [master, manager], SentinelWatch(manager, service_name, master))


def parse_sentinel_url(url: str) -> tuple[list[SentinelAddress], str, dict[str, Any]]:
    """Split ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``.

    Returns the sentinel addresses, the service name and the master's connection
    options (``password``, ``username``, ``db``, ``ssl`` for ``rediss+sentinel``);
    ``?sentinel_password=...`` is the sentinels' own password.
    """
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        raise ValueError(f"not a redis+sentinel:// URL: {url!r}")
    netloc = parts.netloc
    kwargs: dict[str, Any] = {}
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        user, _, password = auth.partition(":")
        if user:
            kwargs["username"] = unquote(user)
        if password:
            kwargs["password"] = unquote(password)
    addresses: list[SentinelAddress] = []
    for item in netloc.split(","):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"sentinel addresses are host:port, not {item!r} in {url!r}")
        addresses.append((host.strip("[]"), int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError(f"expected /<service name>[/<db>] in {url!r}")
    if len(path) == 2:
        if not path[1].isdigit():
            raise ValueError(f"the database number must be an integer in {url!r}")
        kwargs["db"] = int(path[1])
    if parts.scheme == "rediss+sentinel":
        kwargs["ssl"] = True
    sentinel_password = parse_qs(parts.query).get("sentinel_password")
    if sentinel_password:
        kwargs["sentinel_kwargs"] = {"password": sentinel_password[-1]}
    return addresses, unquote(path[0]), kwargs


class CheckedSentinelPool(SentinelConnectionPool):
    """A master pool that asks the sentinels who the master is, at most once a second.

    redis-py's pool learns the master's address only when it opens a connection,
    and gives a returned connection out again wherever it points. After a
    failover in which the old master stays reachable (it was frozen, or cut off
    by a partition, and came back before the sentinels demoted it), a producer
    would keep writing to it, and those writes vanish when it becomes a replica.
    Here a connection is only handed out if it points at the master the
    sentinels name now (checked once per second while commands flow).
    """

    CHECK_EVERY = 1.0

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._checked_at = -float("inf")

    async def ensure_connection(self, connection: AbstractConnection) -> None:
        """Connect ``connection`` to the current master (reconnecting it if it moved)."""
        now = time.monotonic()
        if now - self._checked_at >= self.CHECK_EVERY:
            self._checked_at = now
            try:
                await self.get_master_address()  # type: ignore[no-untyped-call]  # closes idle ones if it moved
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
    """Drops the connections to the old master as soon as the sentinels switch masters.

    Without it, commands on connections to a master that froze (SIGSTOP, a
    paused VM, a network partition) wait for their socket timeout before
    reconnecting through Sentinel. Listening to ``+switch-master`` on one
    sentinel at a time (another when it fails), the watch closes the master
    pool's connections, in use or not, and the commands waiting on them are
    retried on the new master. Run it with :meth:`run`, end it with :meth:`stop`.
    """

    def __init__(self, manager: Sentinel, service_name: str, master: Redis):
        self._manager = manager
        self._service_name = service_name
        self._master = master
        self._stopping = False
        self._scope: anyio.CancelScope | None = None
        self.switches = 0

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` has been called."""
        return self._stopping

    def stop(self) -> None:
        """End :meth:`run`."""
        self._stopping = True
        if self._scope is not None:
            self._scope.cancel()

    async def run(self) -> None:
        """Listen for master switches until :meth:`stop`."""
        backoff = 0.1
        with anyio.CancelScope() as self._scope:
            while not self._stopping:
                sentinel = random.choice(self._manager.sentinels)
                pubsub = sentinel.pubsub()
                try:
                    await pubsub.subscribe("+switch-master")
                    backoff = 0.1
                    while True:
                        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        if msg is not None and msg.get("type") == "message":
                            await self._switched(msg["data"])
                except Exception as exc:  # a sentinel went away: listen to another
                    log.debug("sentinel watch: %s; trying another sentinel", exc)
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                finally:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def _switched(self, data: bytes | str) -> None:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        parts = text.split()  # <name> <old ip> <old port> <new ip> <new port>
        if len(parts) != 5 or parts[0] != self._service_name:
            return
        self.switches += 1
        log.warning("sentinel: the master of %s moved from %s:%s to %s:%s; reconnecting", *parts)
        await self._master.connection_pool.disconnect(inuse_connections=True)
