"""The web framework examples, run for real: a server process, HTTP requests, a real Redis.

Each app runs in its own process (as a user would start it), pointed at the test Redis with
a unique prefix. The test enqueues through the HTTP API, waits for the handler to have run
(seen through the app's own GET endpoint), checks that the request's ``X-Request-ID`` reached
the handler as event context, and stops the server with SIGTERM, expecting a clean exit.

Separate processes also keep the examples' ``PaymentCheck`` classes out of the test process,
where they could clash with other tests' event types of the same name.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from delayq.testing import free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

WaitFor = Callable[..., Awaitable[Any]]

# What each example needs installed, and how to start it on a port (see examples/README.md).
NEEDS = {"fastapi": ("fastapi", "uvicorn"), "aiohttp": ("aiohttp",)}
COMMANDS: dict[str, Callable[[int], tuple[list[str], dict[str, str]]]] = {
    "fastapi": lambda port: (
        [sys.executable, "-m", "uvicorn", "fastapi_app:app", "--app-dir", str(EXAMPLES),
         "--host", "127.0.0.1", "--port", str(port)],
        {},
    ),
    "aiohttp": lambda port: (
        [sys.executable, str(EXAMPLES / "aiohttp_app.py")],
        {"HOST": "127.0.0.1", "PORT": str(port)},
    ),
}  # fmt: skip

STARTUP_TIMEOUT = 60.0  # imports and startup on a busy 2-core machine
SHUTDOWN_TIMEOUT = 30.0  # shutdown_grace is 10 s by default; nothing runs at shutdown here


def _read(path: Path) -> str:
    return path.read_text(errors="replace")


@asynccontextmanager
async def serve(
    app: str, env: dict[str, str], log_path: Path, wait_for: WaitFor
) -> AsyncIterator[httpx.AsyncClient]:
    """Start the example ``app``; yield an httpx client on it once it answers; stop it."""
    for _ in range(3):  # free_port() can race with another process grabbing the port
        port = free_port()
        argv, extra_env = COMMANDS[app](port)
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=ROOT,
                env={**os.environ, **env, **extra_env, "PYTHONUNBUFFERED": "1"},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

                async def ready(
                    client: httpx.AsyncClient = client, proc: asyncio.subprocess.Process = proc
                ) -> bool:
                    if proc.returncode is not None:
                        return True  # exited: reported below
                    try:
                        return (await client.get("/stats")).status_code == httpx.codes.OK
                    except httpx.TransportError:
                        return False

                message = f"{app} example answering on port {port}"
                await wait_for(ready, timeout=STARTUP_TIMEOUT, interval=0.05, message=message)
                if proc.returncode is not None:
                    output = _read(log_path)
                    if "address already in use" in output.lower():
                        continue
                    pytest.fail(f"{app} example exited with {proc.returncode}:\n{output}")

                yield client

            proc.send_signal(signal.SIGTERM)  # what a process manager sends
            try:
                code = await asyncio.wait_for(proc.wait(), SHUTDOWN_TIMEOUT)
            except asyncio.TimeoutError:
                pytest.fail(f"{app} example did not exit after SIGTERM:\n{_read(log_path)}")
            # uvicorn re-raises the signal once it has shut down cleanly; aiohttp exits with 0.
            assert code in (0, -signal.SIGTERM), _read(log_path)
            return
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    pytest.fail(f"{app} example could not get a free port:\n{_read(log_path)}")


@pytest.mark.parametrize("app", ["fastapi", "aiohttp"])
async def test_example_app(
    app: str,
    redis_url: str,
    prefix: str,
    tmp_path: Path,
    wait_for: WaitFor,
    redis_client: aioredis.Redis,
) -> None:
    """POST an order, see its delayed check handled with the request's id; then /stats."""
    for module in NEEDS[app]:
        pytest.importorskip(module)
    try:
        await _exercise(app, {"REDIS_URL": redis_url, "DELAYQ_PREFIX": prefix}, tmp_path, wait_for)
    finally:
        # Drop the hour-long event (and everything else under the prefix) in case the
        # tests run on a longer-lived Redis (DELAYQ_TEST_REDIS_URL); keys start with "{<prefix>".
        keys = [key async for key in redis_client.scan_iter(match=f"{{{prefix}*", count=1000)]
        if keys:
            await redis_client.delete(*keys)


async def _exercise(app: str, env: dict[str, str], tmp_path: Path, wait_for: WaitFor) -> None:
    log_path = tmp_path / f"{app}.log"
    async with serve(app, env, log_path, wait_for) as client:
        response = await client.post(
            "/orders/42", params={"delay": 0.2}, headers={"X-Request-ID": "req-42"}
        )
        assert response.status_code == 202, response.text
        assert response.json() == {
            "order_id": 42, "scheduled": True, "delay": 0.2, "request_id": "req-42",
        }  # fmt: skip

        # An order checked only in an hour, posted twice: the second POST keeps the first
        # check (same event id). Without X-Request-ID the app makes up a request id.
        first = (await client.post("/orders/7", params={"delay": 3600})).json()
        assert first["scheduled"] is True and first["request_id"]
        again = (await client.post("/orders/7", params={"delay": 3600})).json()
        assert again["scheduled"] is False

        assert (await client.post("/orders/8", params={"delay": -1})).status_code in (400, 422)

        async def checks() -> list[dict[str, Any]]:
            done: list[dict[str, Any]] = (await client.get("/checks")).json()
            return done

        done = await wait_for(checks, timeout=15, interval=0.05, message="order 42 checked")
        assert len(done) == 1, done
        check = done[0]
        assert check["order_id"] == 42
        assert check["request_id"] == "req-42"  # the header travelled as event context
        assert check["attempt"] == 1
        assert check["lateness_ms"] >= 0  # never before its due time (Redis's clock)

        # Once acked, only order 7 is left, still scheduled.
        expected = {"PaymentCheck": {"scheduled": 1, "ready": 0, "in_flight": 0, "dead": 0}}

        async def stats_settled() -> bool:
            return bool((await client.get("/stats")).json() == expected)

        await wait_for(stats_settled, timeout=15, interval=0.05, message=f"/stats == {expected}")

        assert await checks() == done  # order 7 is not due for an hour

    output = _read(log_path)
    assert "checked payment of order 42 (request req-42)" in output
    assert "delayq service closed" in output  # the lifespan / cleanup_ctx ran to the end


SPLIT = EXAMPLES / "fastapi_worker"


async def _start(
    argv: list[str], cwd: Path, env: dict[str, str], log: Path
) -> asyncio.subprocess.Process:
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip


async def _stop(proc: asyncio.subprocess.Process, log: Path) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return await asyncio.wait_for(proc.wait(), SHUTDOWN_TIMEOUT)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"{proc} did not exit after SIGTERM:\n{_read(log)}")


async def test_fastapi_web_process_and_workers(
    redis_url: str, prefix: str, tmp_path: Path, wait_for: WaitFor, redis_client: aioredis.Redis
) -> None:
    """examples/README.md's "A FastAPI web process and separate workers": uvicorn runs
    web.py (enqueues only), `delayq worker tasks:create_service --factory --processes 2`
    declares the schedules in each worker (the async factory is where a worker awaits
    before it starts) and runs the handlers; the web process reads their results with
    service.results() / result() (PaymentCheck keeps results)."""
    for module in ("fastapi", "uvicorn", "typer"):
        pytest.importorskip(module)
    from delayq import EventService

    env = {"REDIS_URL": redis_url, "DELAYQ_PREFIX": prefix, "PYTHONPATH": str(ROOT)}
    worker_log, web_log = tmp_path / "worker.log", tmp_path / "web.log"
    worker = await _start(
        [sys.executable, "-m", "delayq", "worker", "tasks:create_service", "--factory",
         "--processes", "2"],
        SPLIT, env, worker_log,
    )  # fmt: skip
    port = free_port()
    web = await _start(
        [sys.executable, "-m", "uvicorn", "web:app", "--app-dir", str(SPLIT),
         "--host", "127.0.0.1", "--port", str(port)],
        ROOT, env, web_log,
    )  # fmt: skip
    observer = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:

            async def answering() -> bool:
                assert web.returncode is None, _read(web_log)
                try:
                    return (await http.get("/orders/0/check")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(answering, timeout=STARTUP_TIMEOUT, interval=0.05, message="web up")
            # the web process is no worker: nothing handles events there
            assert (await http.get("/orders/0/check")).json() == {
                "state": "absent", "result": None, "error": None,
            }  # fmt: skip

            async def two_workers() -> bool:
                assert worker.returncode is None, _read(worker_log)
                found = await observer.workers()
                return len(found) == 2 and all(w.types.get("payment-check") == 8 for w in found)

            await wait_for(two_workers, timeout=STARTUP_TIMEOUT, message="2 worker processes")

            for n in range(1, 7):
                r = await http.post(
                    f"/orders/{n}", params={"delay": 0.2}, headers={"X-Request-ID": f"r-{n}"}
                )
                assert r.status_code == 202 and r.json()["scheduled"] is True, r.text
            # once per order: posting it again while its check waits keeps the first
            assert (await http.post("/orders/99", params={"delay": 3600})).json()["scheduled"]
            assert (await http.post("/orders/99", params={"delay": 5})).json()["scheduled"] is False

            # the schedule both workers declared at start, once (an upsert by name)
            nightly = await observer.schedule_info("nightly-reconcile")
            assert nightly is not None and nightly.timezone == "Europe/Berlin"
            assert [i.name for i in await observer.schedules()] == ["nightly-reconcile"]

            async def all_checked() -> bool:
                got = [(await http.get(f"/orders/{n}/check")).json() for n in range(1, 7)]
                return all(c["result"] is not None for c in got)

            await wait_for(all_checked, timeout=30, message="6 checks handled by the workers")
            check = (await http.get("/orders/3/check")).json()
            assert check["state"] == "absent"  # handled and acked
            assert check["result"]["request_id"] == "r-3" and check["result"]["attempt"] == 1
            assert check["result"]["pid"] not in (web.pid, worker.pid)  # a worker child ran it
            # waiting for a result: the GET returns once the worker acked
            r = await http.post("/orders/7", params={"delay": 0.3})
            assert r.json()["scheduled"] is True
            waited = (await http.get("/orders/7/check", params={"wait": 20})).json()
            assert waited["state"] == "absent" and waited["result"]["attempt"] == 1
            assert (await http.get("/orders/0/check", params={"wait": 1})).status_code == 404
    finally:
        await observer.aclose()
        web_code = await _stop(web, web_log)
        worker_code = await _stop(worker, worker_log)
        keys = [key async for key in redis_client.scan_iter(match=f"{{{prefix}*", count=1000)]
        if keys:
            await redis_client.delete(*keys)
    assert web_code in (0, -signal.SIGTERM), _read(web_log)
    assert worker_code == 0, _read(worker_log)
    assert "checked payment of order" in _read(worker_log)


async def test_the_examples_throw_away_redis_runs_in_the_background(
    tmp_path: Path, wait_for: WaitFor
) -> None:
    """``python examples/private_redis.py &`` (examples/README.md): with no terminal to read
    from (stdin closed) it serves until SIGTERM, which stops its redis-server too. (The
    one-liner it replaces called input() and died with EOFError in the background.)"""
    from redis.exceptions import ConnectionError as RedisConnectionError

    port = free_port()
    log = tmp_path / "private_redis.log"
    argv = [sys.executable, str(EXAMPLES / "private_redis.py"), "--port", str(port)]
    proc = await _start(argv, tmp_path, {"PYTHONPATH": str(ROOT)}, log)
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    try:

        async def answers() -> bool:
            assert proc.returncode is None, _read(log)
            try:
                return bool(await client.ping())
            except RedisConnectionError:
                return False

        await wait_for(answers, timeout=STARTUP_TIMEOUT, interval=0.05, message="Redis up")
        assert f"redis://127.0.0.1:{port}/0" in _read(log)
        assert await _stop(proc, log) == 0, _read(log)
        assert "stopped" in _read(log)
        await client.aclose()
        with pytest.raises(RedisConnectionError):  # its server went with it
            await client.ping()
    finally:
        await _stop(proc, log)
        await client.aclose()
