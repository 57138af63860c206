"""``delayq worker`` and ``delayq check`` as real processes with real signals on a real Redis:
drain on SIGTERM, an immediate stop on a second SIGINT, --burst, --processes with a
SIGKILLed child, the health endpoints (and /readyz while Redis is stopped), JSON logs,
and the errors of a bad MODULE:ATTR."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
import redis.asyncio as aioredis
from cli_app import CliJob

from delayq import EventService
from delayq.cli.health import http_get
from delayq.testing import free_port

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

HERE = Path(__file__).parent


def env_for(url: str, prefix: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(REDIS_URL=url, DELAYQ_PREFIX=prefix, PYTHONPATH=str(HERE), **extra)
    return env


def spawn(url: str, prefix: str, *args: str, **extra: str) -> subprocess.Popen[str]:
    # stderr goes to a file: a pipe nobody reads while the test runs could fill and
    # block the worker's logging
    log = tempfile.NamedTemporaryFile("w+", prefix="delayq-cli-worker-", suffix=".log")
    proc = subprocess.Popen(
        [sys.executable, "-m", "delayq", "worker", "cli_app:service", *args],
        env=env_for(url, prefix, **extra),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
    )
    proc.log = log  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str]:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(
            f"the worker did not exit within {timeout}s:\n{read_log(proc)[-3000:]}"
        ) from None
    return proc.returncode, read_log(proc)


def read_log(proc: subprocess.Popen[str]) -> str:
    proc.log.seek(0)  # type: ignore[attr-defined]
    return proc.log.read()  # type: ignore[attr-defined]


@pytest.fixture
async def producer(redis_url, prefix):
    service = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    yield service
    await service.aclose()


async def done_ids(client: aioredis.Redis, prefix: str) -> dict[str, int]:
    raw = await client.hgetall(f"{prefix}-done")
    return {k.decode(): int(v) for k, v in raw.items()}


async def test_sigterm_drains_and_acks(redis_url, prefix, producer, redis_client, wait_for):
    proc = spawn(redis_url, prefix, "--no-uvloop")
    try:
        ids = [f"s{i}" for i in range(20)]
        await producer.enqueue_many([CliJob(id=i, sleep_ms=700) for i in ids])

        async def all_in_flight() -> bool:
            return (await producer.stats_for(CliJob)).in_flight == 20

        await wait_for(all_in_flight, timeout=20)
        proc.send_signal(signal.SIGTERM)
        code, err = await asyncio.to_thread(finish, proc)
        assert code == 0, err[-2000:]
        assert "drained" in err
        assert await done_ids(redis_client, prefix) == dict.fromkeys(ids, 1)
        counts = await producer.stats_for(CliJob)
        assert (counts.scheduled, counts.ready, counts.in_flight, counts.dead) == (0, 0, 0, 0)
    finally:
        proc.kill()


async def test_second_sigint_stops_at_once(redis_url, prefix, producer, wait_for):
    proc = spawn(redis_url, prefix, CLI_GRACE="60")
    try:
        await producer.enqueue_with_delay(CliJob(id="long", sleep_ms=60_000), 0)

        async def running() -> bool:
            return (await producer.stats_for(CliJob)).in_flight == 1

        await wait_for(running, timeout=20)
        proc.send_signal(signal.SIGINT)
        await asyncio.sleep(0.5)  # let the first one start the drain
        assert proc.poll() is None  # still draining: the handler has a 60 s grace
        proc.send_signal(signal.SIGINT)
        code, err = await asyncio.to_thread(finish, proc, 10)
        assert code == 130, err[-2000:]
        # the lease brings the event back later: it is still in flight, not lost
        assert (await producer.inspect(CliJob, "long")).state == "in_flight"
    finally:
        proc.kill()


async def test_burst_handles_what_is_due_and_exits(redis_url, prefix, producer, redis_client):
    ids = [f"b{i}" for i in range(50)]
    await producer.enqueue_many([CliJob(id=i) for i in ids])
    await producer.enqueue_with_delay(CliJob(id="bad", fail=True), 0)
    await producer.enqueue_with_delay(CliJob(id="later"), 3600)
    proc = spawn(redis_url, prefix, "--burst", "--log-format", "json")
    code, err = await asyncio.to_thread(finish, proc)
    assert code == 0, err[-2000:]
    assert await done_ids(redis_client, prefix) == dict.fromkeys(ids, 1)
    # a handler failure is logged with its delivery as fields
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    failed = [r for r in records if r.get("event_id") == "bad"]
    assert failed and failed[0]["event_type"] == "cli-job" and failed[0]["attempt"] == 1
    assert (await producer.inspect(CliJob, "later")).state == "scheduled"


def alive(c: psutil.Process) -> bool:
    """``c`` runs (neither a zombie nor gone: a child may exit between listing and reading)."""
    try:
        return c.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_processes_restart_a_killed_child(
    redis_url, prefix, producer, redis_client, wait_for
):
    proc = spawn(redis_url, prefix, "--processes", "2", "--no-uvloop")
    try:
        parent = psutil.Process(proc.pid)

        def children() -> list[psutil.Process]:
            return [c for c in parent.children() if alive(c)]

        first = await wait_for(lambda: children() if len(children()) == 2 else None, timeout=20)
        ids = [f"p{i}" for i in range(200)]
        await producer.enqueue_many([CliJob(id=i, sleep_ms=300) for i in ids[:100]])

        async def busy() -> bool:
            return (await producer.stats_for(CliJob)).in_flight >= 10

        await wait_for(busy, timeout=20)
        victim = first[0]
        victim.kill()
        await producer.enqueue_many([CliJob(id=i, sleep_ms=20) for i in ids[100:]])

        def restarted():
            now = children()
            return now if len(now) == 2 and victim.pid not in {c.pid for c in now} else None

        await wait_for(restarted, timeout=20)

        async def all_done() -> bool:
            return set(await done_ids(redis_client, prefix)) == set(ids)

        # events the killed child held come back when their leases run out (15 s)
        try:
            await wait_for(all_done, timeout=60)
        except AssertionError:
            missing = set(ids) - set(await done_ids(redis_client, prefix))
            raise AssertionError(
                f"not handled: {sorted(missing)[:20]}\n{read_log(proc)[-4000:]}"
            ) from None
        proc.send_signal(signal.SIGTERM)
        code, err = await asyncio.to_thread(finish, proc)
        assert code == 0, err[-2000:]
        assert "restarting in" in err
    finally:
        proc.kill()


async def test_health_endpoints(redis_server_factory, prefix, wait_for):
    server = redis_server_factory()
    port = free_port()
    proc = spawn(server.url, prefix, "--health-port", str(port), "--health-host", "127.0.0.1")
    try:

        async def answers(path: str, want: int):
            status, body = await http_get("127.0.0.1", port, path)
            return body if status == want else None

        ready = await wait_for(lambda: answers("/readyz", 200), timeout=20)
        assert ready["redis_ok"] and ready["loops"] == {"scheduler": True, "consumer:cli-job": True}
        assert await answers("/healthz", 200)
        assert await answers("/nope", 404) is not None
        server.stop()
        down = await wait_for(lambda: answers("/readyz", 503), timeout=20)
        assert not down["redis_ok"]
        assert await answers("/healthz", 200)  # alive: the loops wait for Redis
        server.start()
        await wait_for(lambda: answers("/readyz", 200), timeout=30)
        proc.send_signal(signal.SIGTERM)
        code, err = await asyncio.to_thread(finish, proc)
        assert code == 0, err[-2000:]
    finally:
        proc.kill()


async def test_supervisor_health(redis_url, prefix, wait_for):
    port = free_port()
    proc = spawn(
        redis_url,
        prefix,
        "--processes",
        "2",
        "--health-port",
        str(port),
        "--health-host",
        "127.0.0.1",
    )
    try:

        async def ready():
            status, body = await http_get("127.0.0.1", port, "/readyz")
            return body if status == 200 else None

        body = await wait_for(ready, timeout=30)
        assert len(body["workers"]) == 2
        assert all(w["ready"] for w in body["workers"].values())
        proc.send_signal(signal.SIGTERM)
        code, err = await asyncio.to_thread(finish, proc)
        assert code == 0, err[-2000:]
    finally:
        proc.kill()


@pytest.mark.parametrize(
    ("target", "args", "message"),
    [
        ("no_such_module:service", [], "cannot import 'no_such_module'"),
        ("cli_app:missing", [], "has no attribute 'missing'"),
        (
            "cli_app:not_a_service",
            [],
            "is an int object, not a delayq.EventService; the module has cli_app:service",
        ),
        (
            "cli_app:make_service",
            [],
            "is a function, not a delayq.EventService; if it returns the service, add --factory",
        ),
        # an event class is callable, but --factory would not help: say what fits
        (
            "cli_app:CliJob",
            [],
            "is an event class ('cli-job'), not a delayq.EventService; the module has cli_app:service",
        ),
        (
            "cli_app:CliJob",
            ["--factory"],
            "is an event class ('cli-job'), not a function returning",
        ),
        ("cli_app", [], "must look like"),
        ("cli_app:not_a_service", ["--factory"], "is not callable"),
    ],
)
def test_bad_targets(redis_url, prefix, target, args, message):
    result = subprocess.run(
        [sys.executable, "-m", "delayq", "worker", target, *args],
        env=env_for(redis_url, prefix),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("factory", ["cli_app:make_service", "cli_app:make_service_async"])
def test_factory_and_check(redis_url, prefix, factory):
    result = subprocess.run(
        [sys.executable, "-m", "delayq", "check", factory, "--factory", "--json"],
        env=env_for(redis_url, prefix),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] and checks["redis"]["status"] == "ok" and checks["lua"]["status"] == "ok"
    assert checks["acl"]["status"] in ("ok", "warn")
    assert checks["handlers"]["detail"] == "cli-job"


def test_check_fails_without_redis(prefix):
    result = subprocess.run(
        [sys.executable, "-m", "delayq", "check", "cli_app:service", "--json"],
        env=env_for(f"redis://127.0.0.1:{free_port()}/0", prefix),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert json.loads(result.stdout)["checks"][0]["status"] == "fail"


def test_python_m_delayq_demo_still_parses():
    result = subprocess.run(
        [sys.executable, "-m", "delayq", "demo", "--events", "2"], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "--events must be at least 4" in result.stderr


async def test_reload_restarts_on_change(redis_url, prefix, tmp_path, wait_for):
    proc = spawn(redis_url, prefix, "--reload", "--reload-dir", str(tmp_path))
    try:
        parent = psutil.Process(proc.pid)

        def child():
            now = [c for c in parent.children() if alive(c)]
            return now[0] if len(now) == 1 else None

        first = await wait_for(child, timeout=20)
        await asyncio.sleep(1.0)  # let the watcher start
        (tmp_path / "handlers.py").write_text("x = 1\n")

        def replaced():
            now = child()
            return now if now is not None and now.pid != first.pid else None

        await wait_for(replaced, timeout=30)
        proc.send_signal(signal.SIGTERM)
        code, err = await asyncio.to_thread(finish, proc)
        assert code == 0, err[-2000:]
        assert "files changed" in err
    finally:
        proc.kill()


def test_importing_delayq_imports_no_cli_dependencies():
    code = "import sys, delayq; print(sorted(m for m in sys.modules if m.split('.')[0] in {'typer', 'rich', 'click', 'watchfiles', 'uvloop'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_metrics_port_serves_prometheus(redis_url, prefix, producer, wait_for):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    proc = spawn(redis_url, prefix, "--metrics-port", str(port), "--metrics-host", "127.0.0.1")
    try:
        assert await producer.enqueue_with_delay(CliJob(id="later"), 3600)

        async def scrape() -> dict[str, float] | None:
            try:
                async with httpx.AsyncClient() as client:
                    reply = await client.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            except httpx.HTTPError:
                return None
            if reply.status_code != 200:
                return None
            return {
                f"{sample.name}{sorted(sample.labels.items())}": sample.value
                for family in text_string_to_metric_families(reply.text)
                for sample in family.samples
            }

        samples = await wait_for(scrape, timeout=20)
        scheduled = [v for k, v in samples.items() if "cli-job" in k and "scheduled" in k]
        assert scheduled == [1.0], samples
        proc.send_signal(signal.SIGTERM)
        code, err = await asyncio.to_thread(finish, proc)
        assert code == 0, err[-2000:]
    finally:
        proc.kill()
