"""delayq.testing.FaultProxy against a real redis-server: forwarding, latency, blackhole,
reset and bandwidth caps.

Durations are only checked from below (a fault makes a call take at least so long); a
"nothing happens" check waits a short, fixed time for what must not come.
"""

from __future__ import annotations

import ast
import asyncio
import re
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayq.testing import FaultProxy, RedisServer


def _client(url: str, **kw: object) -> aioredis.Redis:
    # no retries: a broken connection must show, not be re-made behind the test's back
    return aioredis.Redis.from_url(url, protocol=2, retry=Retry(NoBackoff(), 0), **kw)


async def test_forwards_both_ways_and_keeps_the_url(private_server: RedisServer) -> None:
    url = f"redis://{private_server.host}:{private_server.port}/3?socket_timeout=5"
    async with FaultProxy(url) as proxy:
        assert proxy.url == f"redis://127.0.0.1:{proxy.port}/3?socket_timeout=5"
        client = _client(proxy.url)
        async with client.pipeline(transaction=False) as pipe:
            for i in range(500):
                pipe.set(f"k{i}", "v" * i)
            pipe.get("k499")
            replies = await pipe.execute()
        assert replies[-1] == b"v" * 499
        assert (await client.client_info())["db"] == 3
        assert proxy.connections == 1 and proxy.accepted == 1
        assert proxy.to_server.bytes > 500 * 20 and proxy.to_client.bytes >= 500 * 5
        await client.aclose()
    assert proxy.connections == 0
    assert FaultProxy(("127.0.0.1", 1)).upstream == ("127.0.0.1", 1)


async def test_latency_each_way(private_server: RedisServer) -> None:
    async with FaultProxy(private_server.url) as proxy:
        client = _client(proxy.url)
        await client.ping()
        proxy.set_latency(to_server=0.15, to_client=0.1)
        start = time.monotonic()
        await client.ping()
        assert time.monotonic() - start >= 0.25
        # pipelined or concurrent commands share the delay: the link is slow, not serial
        start = time.monotonic()
        await asyncio.gather(*(client.incr("n") for _ in range(20)))
        took = time.monotonic() - start
        assert took >= 0.25
        assert await client.get("n") == b"20"
        proxy.clear()
        await client.aclose()
    assert took < 20 * 0.25  # (a sanity bound far from the figure, not a timing check)


async def test_a_blackhole_holds_everything_and_closes_nothing(
    private_server: RedisServer, wait_for
) -> None:
    direct = _client(private_server.url)
    async with FaultProxy(private_server.url) as proxy:
        client = _client(proxy.url)
        await client.ping()
        proxy.blackhole()
        assert proxy.blackholed
        pending = asyncio.ensure_future(client.set("held", "1"))
        fresh = _client(proxy.url)
        connecting = asyncio.ensure_future(fresh.ping())
        done, _ = await asyncio.wait({pending, connecting}, timeout=0.3)
        assert not done  # neither the command nor a new connection got through...
        assert await direct.get("held") is None  # ...nor reached the server
        assert proxy.connections == 2  # and nothing was closed
        proxy.heal()
        assert await pending is True  # delivered once healed, in order
        assert await connecting is True
        assert await direct.get("held") == b"1"
        await client.aclose()
        await fresh.aclose()
    await direct.aclose()


async def test_a_client_timing_out_in_a_blackhole_sees_its_own_timeout(
    private_server: RedisServer,
) -> None:
    async with FaultProxy(private_server.url) as proxy:
        client = _client(proxy.url, socket_timeout=0.3)
        await client.ping()
        proxy.blackhole()
        with pytest.raises(RedisTimeoutError):
            await client.ping()
        proxy.heal()
        assert await client.ping() is True  # a new connection
        await client.aclose()


async def test_reset_closes_every_connection_on_both_sides(
    private_server: RedisServer, wait_for
) -> None:
    direct = _client(private_server.url)

    async def through_proxy() -> int:
        clients = await direct.client_list()
        return sum(1 for c in clients if c.get("name") == "via-proxy")

    async with FaultProxy(private_server.url) as proxy:
        clients = [_client(proxy.url, client_name="via-proxy") for _ in range(3)]
        for c in clients:
            await c.ping()
        await wait_for(lambda: through_proxy(), timeout=5)
        assert await through_proxy() == 3
        blocked = asyncio.ensure_future(clients[0].blpop(["nothing"], timeout=0))
        await wait_for(lambda: _blocked(direct), timeout=5)
        proxy.blackhole()  # a reset also ends connections a blackhole holds
        assert proxy.reset() == 3
        proxy.heal()
        with pytest.raises(RedisConnectionError):
            await blocked
        with pytest.raises(RedisConnectionError):
            await clients[1].ping()
        await wait_for(lambda: proxy.connections == 0, timeout=5)
        await wait_for(lambda: _none_via_proxy(direct), timeout=5)  # the server saw it too
        with pytest.raises(RedisConnectionError):  # its pooled connection is gone too
            await clients[2].ping()
        assert await clients[2].ping() is True  # a new one: the proxy still accepts
        for c in clients:
            await c.aclose()
    await direct.aclose()


async def _blocked(client: aioredis.Redis) -> bool:
    return any(c.get("cmd") == "blpop" for c in await client.client_list())


async def _none_via_proxy(client: aioredis.Redis) -> bool:
    return not any(c.get("name") == "via-proxy" for c in await client.client_list())


async def test_bandwidth_cap(private_server: RedisServer) -> None:
    direct = _client(private_server.url)
    await direct.set("big", b"x" * 200_000)
    async with FaultProxy(private_server.url) as proxy:
        client = _client(proxy.url)
        await client.ping()
        proxy.set_bandwidth(to_client=1_000_000)
        start = time.monotonic()
        assert len(await client.get("big")) == 200_000
        assert time.monotonic() - start >= 0.15  # 200 kB at 1 MB/s: 0.2 s, less one slice
        proxy.set_bandwidth(to_server=100_000)
        start = time.monotonic()
        await client.set("up", b"y" * 30_000)
        assert time.monotonic() - start >= 0.25
        with pytest.raises(ValueError):
            proxy.set_bandwidth(to_client=0)
        await client.aclose()
    await direct.aclose()


DOCS = Path(__file__).resolve().parent.parent / "docs" / "SERVERS.md"


def _docs_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(encoding="utf-8"), flags=re.S)
    (block,) = [b for b in blocks if "FaultProxy(server.url)" in b]
    return block


async def test_the_docs_example_runs_as_written() -> None:
    code = compile(_docs_example(), str(DOCS), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    await eval(code, {"__name__": "docs_example"})  # our own docs, never a payload
