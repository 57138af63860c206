"""Building the redis.asyncio clients a service owns: one Redis, a Cluster, or Sentinel.

Every client speaks RESP2 and retries a command that lost its connection a few times, with
a short backoff (a retried script is safe: every script is safe to run twice; see
:func:`command_retry` for which errors and why so few). The service needs a client
for commands and scripts and one for blocking calls (BRPOP, pub/sub) whose
socket timeout is above the block time. A client the application built itself
is checked here too (:func:`check_client`, :func:`block_time`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import EqualJitterBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from ..durations import delay_seconds
from .breaker import BreakingCluster
from .sentinel import CheckedSentinelPool, SentinelWatch

__all__ = [
    "Client",
    "Clients",
    "SentinelAddress",
    "block_time",
    "check_client",
    "command_retry",
    "master_kwargs",
    "no_retry",
    "parse_sentinel_url",
    "polling_of",
    "sentinel_clients",
    "url_clients",
]

Client = Redis | RedisCluster
"""The redis.asyncio clients delayq works with: a single Redis or a Redis Cluster."""

log = logging.getLogger("delayq.connect")

SentinelAddress = tuple[str, int]
"""``(host, port)`` of one sentinel."""

# A command (not a blocking one) that takes longer than this is treated as a lost connection.
COMMAND_TIMEOUT = 10.0
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
# Retries of a command whose connection failed (see command_retry).
RETRIES = 4


def command_retry() -> Retry:
    """The retry policy of the clients built here: up to :data:`RETRIES` retries of
    ``redis.exceptions.ConnectionError``, after 50-100, 100-200, 200-400, 250-500 ms.

    It must be redis.asyncio's ``Retry``: redis.asyncio awaits what
    ``call_with_retry`` returns, so the synchronous ``redis.retry.Retry`` hands back the
    first attempt's coroutine and retries nothing.

    - *Which errors*: a lost or refused connection (a server restart, ``CLIENT KILL``,
      an idle timeout, a Sentinel fence closing connections, a demoted master's
      READONLY, which redis-py's Sentinel connection turns into a ConnectionError;
      LOADING too, a ConnectionError in redis-py). Not timeouts: a command that timed
      out already waited its socket timeout (10 s, or the block time + 10 s), and a
      retry would multiply that wait.
    - *Few, short*: a command gives up after about 0.6-1.2 s of refused connections
      (0.9-1.0 s measured; up to about 7 s computed when its connection broke mid-command,
      since redis-py then applies the policy to the command and to the reconnect under
      it): enough for a dropped connection or a quick restart, short of stretching a
      failover. Past that the command raises and the service's loops back off (up to
      5 s) as before. With Sentinel, a reconnect during a failover waits in the pool's
      fence (which no retry counts or delays) and goes to the new master once the
      switch is confirmed; a command cut by the fence thus carries on there (the
      pool's connections route every reconnect through the fence: redis-py's own would
      go back to the old master, see ``sentinel._FencedConnection``).
    """
    return Retry(
        EqualJitterBackoff(cap=0.5, base=0.05), RETRIES, supported_errors=(RedisConnectionError,)
    )


def no_retry() -> Retry:
    """For a connection that must fail at once: one to a sentinel (the next sentinel is
    asked instead), a pub/sub subscription whose owner resubscribes by itself."""
    return Retry(NoBackoff(), 0)


def _common() -> dict[str, Any]:
    return {
        "protocol": 2,
        "decode_responses": False,
        "socket_connect_timeout": 5,
        "socket_keepalive": True,
        # redis-py's default of 100 is below what a few consumers with high concurrency
        # use at once (each failure record, claim and ack takes a connection): past it
        # commands raise MaxConnectionsError instead of waiting
        "max_connections": 1000,
        "retry": command_retry(),
    }


def _connection_kwargs(client: Client) -> dict[str, Any]:
    if isinstance(client, RedisCluster):
        return client.connection_kwargs
    return client.connection_pool.connection_kwargs


def check_client(redis: object) -> None:
    """Raise unless ``redis`` is a redis.asyncio client with ``decode_responses=False``."""
    if not isinstance(redis, (Redis, RedisCluster)):
        raise TypeError(
            f"redis must be a redis.asyncio Redis or RedisCluster, not {type(redis).__name__}"
        )
    if _connection_kwargs(redis).get("decode_responses"):
        raise ValueError("delayq needs a Redis client with decode_responses=False")


def block_time(polling_timeout: float, client: Client) -> float:
    """How long a BRPOP on ``client`` may block: ``polling_timeout``, or less."""
    # BRPOP must return before the client's socket timeout fires, or every
    # idle wait would look like a broken connection.
    block = polling_timeout
    socket_timeout = _connection_kwargs(client).get("socket_timeout")
    if socket_timeout:
        block = min(block, max(0.05, socket_timeout - 1, socket_timeout / 2))
    return block


def polling_of(options: dict[str, Any]) -> float:
    """The ``polling_timeout`` among a service's keyword options (validated; default 5 s)."""
    return delay_seconds(options.get("polling_timeout") or 5.0, "polling_timeout")


def master_kwargs(
    *, password: str | None, username: str | None, db: int, ssl: bool
) -> dict[str, Any]:
    """The data servers' connection options of ``EventService.from_sentinel``."""
    kwargs: dict[str, Any] = {"db": db}
    if password is not None:
        kwargs["password"] = password
    if username is not None:
        kwargs["username"] = username
    if ssl:
        kwargs["ssl"] = True
    return kwargs


@dataclass
class Clients:
    """A service's clients, and what it must close with them."""

    commands: Client
    """Commands and scripts."""
    blocking: Client | None
    """BRPOP and pub/sub (None: ``commands``)."""
    owned: list[Any] = field(default_factory=list)
    """What the service made and closes last (none for a client the application passed)."""
    watch: SentinelWatch | None = None
    """The Sentinel failover watch, closed with the service."""


def url_clients(url: str, *, cluster: bool, polling: float) -> Clients:
    """The clients of ``EventService.from_url``: two on ``url`` (a single Redis, or any
    node of a Cluster), or for a ``redis+sentinel://`` URL :func:`sentinel_clients`."""
    if url.split("://", 1)[0] in SENTINEL_SCHEMES:
        if cluster:
            raise ValueError("a redis+sentinel:// URL cannot be used with cluster=True")
        sentinels, name, kwargs = parse_sentinel_url(url)
        return sentinel_clients(sentinels, name, polling=polling, **kwargs)
    # a cluster's clients stop knocking on a failed node for a moment (.breaker)
    factory: Any = BreakingCluster.from_url if cluster else Redis.from_url
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
        # no retries on a sentinel (redis-py's default is 10, up to seconds on one that is
        # down): asking for the master moves on to the next sentinel at once, and the
        # failover watch resubscribes by itself
        sentinel_kwargs={
            "socket_timeout": 2.0,
            "socket_connect_timeout": 2.0,
            "retry": no_retry(),
            **(sentinel_kwargs or {}),
        },
    )
    # the same retries as on one Redis: a command cut by the failover fence reconnects
    # through the fence, which holds it until the new master is confirmed (not a retry)
    options = {
        **_common(),
        "socket_timeout": polling + COMMAND_TIMEOUT,
        **connection_kwargs,
    }
    master = manager.master_for(service_name, connection_pool_class=CheckedSentinelPool, **options)
    pool = master.connection_pool
    assert isinstance(pool, CheckedSentinelPool)
    return Clients(master, None, [master, manager], pool.watch)


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
