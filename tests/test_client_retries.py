"""The clients delayq builds retry a command that lost its connection (storage/connect.py).

redis.asyncio needs redis.asyncio's ``Retry``: the synchronous one retries nothing there.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayq.storage.connect import RETRIES, Clients, sentinel_clients, url_clients
from delayq.storage.store import WakeupListener
from delayq.testing import RedisServer
from delayq.testing.sentinel import RedisSentinelSet

pytestmark = pytest.mark.servers  # reconnects and a failover: runs on Valkey 8 and 9 too


async def _close(clients: Clients) -> None:
    for client in clients.owned:
        await client.aclose()


def _retry_of(client: aioredis.Redis) -> AsyncRetry:
    retry = client.connection_pool.connection_kwargs["retry"]
    assert isinstance(retry, AsyncRetry)
    return retry


async def test_a_command_whose_connection_was_killed_is_retried(private_server: RedisServer):
    clients = url_clients(private_server.url, cluster=False, polling=1.0)
    admin = redis.Redis.from_url(private_server.url)
    try:
        commands, blocking = clients.commands, clients.blocking
        assert isinstance(commands, aioredis.Redis) and isinstance(blocking, aioredis.Redis)
        for client in (commands, blocking):
            retry = _retry_of(client)
            assert retry.get_retries() == RETRIES
            # timeouts are not retried: the command already waited its socket timeout
            assert RedisTimeoutError not in retry._supported_errors
        await commands.set("k", "v")
        await blocking.ping()
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 2
        assert await commands.get("k") == b"v"  # raised ConnectionError with the sync Retry
        await blocking.ping()
    finally:
        admin.close()
        await _close(clients)


@pytest.mark.redis_config(appendonly="yes", appendfsync="always")
async def test_a_command_after_a_redis_restart_is_retried(private_server: RedisServer) -> None:
    clients = url_clients(private_server.url, cluster=False, polling=1.0)
    try:
        await clients.commands.set("k", "v")
        private_server.kill()
        private_server.start()  # same port, the AOF reloaded: the pooled connection is dead
        assert await clients.commands.get("k") == b"v"
    finally:
        await _close(clients)


async def test_a_server_that_stays_down_fails_the_command(private_server: RedisServer) -> None:
    clients = url_clients(private_server.url, cluster=False, polling=1.0)
    try:
        await clients.commands.ping()
        private_server.kill()
        with anyio.fail_after(60), pytest.raises(RedisConnectionError):
            await clients.commands.ping()  # a few retries, then the error
    finally:
        await _close(clients)


async def test_the_wakeup_subscription_fails_instead_of_reconnecting(
    private_server: RedisServer,
) -> None:
    """Its owner (the scheduler) must see the loss: it resubscribes and then looks at
    every type, since wake-ups published meanwhile were missed."""
    clients = url_clients(private_server.url, cluster=False, polling=1.0)
    admin = redis.Redis.from_url(private_server.url)

    async def nothing() -> None:
        return None

    assert clients.blocking is not None
    listener = WakeupListener(clients.blocking.pubsub(), "wake", nothing)
    try:
        await listener.subscribe()
        assert await listener.next(timeout=0.01) is None
        connection = listener._pubsub.connection
        assert connection is not None and connection.retry.get_retries() == 0
        assert admin.client_kill_filter(_type="pubsub", skipme=True) == 1
        with anyio.fail_after(30), pytest.raises(RedisConnectionError):
            while True:
                await listener.next(timeout=0.1)
        await listener.aclose()
        # the pooled connection gets its retries back for the commands that use it next
        assert connection.retry.get_retries() == RETRIES
        assert await clients.blocking.ping()
    finally:
        admin.close()
        await listener.aclose()
        await _close(clients)


async def test_sentinel_clients_retry_the_master_but_not_the_sentinels() -> None:
    # nothing connects until the first command
    clients = sentinel_clients([("127.0.0.1", 1), ("127.0.0.1", 2)], "mymaster", polling=1.0)
    try:
        assert isinstance(clients.commands, aioredis.Redis)
        assert _retry_of(clients.commands).get_retries() == RETRIES
        manager = clients.owned[1]
        for sentinel in manager.sentinels:
            # asking for the master moves on to the next sentinel instead
            assert _retry_of(sentinel).get_retries() == 0
    finally:
        await _close(clients)


async def test_a_command_cut_by_a_sentinel_failover_is_retried_on_the_new_master(wait_for):
    """A BLPOP blocked on the master when a planned failover starts: the fence cuts it, the
    client's retry waits in the fence and sends it again to the *new* master (redis-py alone
    reconnects a retried command to the address it had: the old master, past the fence)."""
    with RedisSentinelSet() as sentinels:
        clients = sentinel_clients(
            sentinels.sentinel_addresses, sentinels.service_name, polling=1.0
        )
        master = clients.commands
        assert isinstance(master, aioredis.Redis)
        try:
            assert await master.ping()  # (starts the failover watch)
            old = sentinels.master()
            blpop = asyncio.create_task(master.blpop(["{r}:list"], timeout=60))

            def blocked_on(server: RedisServer) -> bool:
                with redis.Redis(port=server.port) as r:
                    return any(c.get("cmd") == "blpop" for c in r.client_list())

            await wait_for(lambda: blocked_on(old), timeout=10)
            sentinels.failover()
            await wait_for(lambda: sentinels.master() is not old, timeout=20)
            new = sentinels.master()
            await wait_for(
                lambda: blocked_on(new), timeout=20, message="BLPOP re-sent to the new master"
            )
            with redis.Redis(port=new.port) as r:
                r.rpush("{r}:list", "v")
            with anyio.fail_after(20):
                assert list(await blpop) == [b"{r}:list", b"v"]
            assert not blocked_on(old)
        finally:
            await _close(clients)
