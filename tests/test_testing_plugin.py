"""The pytest plugin (delayq.testing.pytest_plugin, entry point ``delayq``): its fixtures
under pytest-asyncio (strict and auto modes) and under anyio's plugin, in a pytest run of
its own, as a user's suite would have them."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "delayq.testing.pytest_plugin"

USER_TESTS = """
from datetime import timedelta

import pytest

from delayq import Event
from delayq.testing import advance, assert_enqueued, drain

seen = []


class Ping(Event):
    pass


@pytest.fixture
def delayq_options():
    return {"retry_attempts": 0}


@MARK
async def test_a_handler_runs_after_advance(delayq_service):
    async def handle(event):
        seen.append(event.id)

    delayq_service.add_handler(Ping, handle)
    await delayq_service.enqueue_with_delay(Ping(id="p1"), timedelta(hours=1))
    await assert_enqueued(delayq_service, Ping, id="p1", due_in=timedelta(hours=1))
    await advance(delayq_service, timedelta(hours=1))
    assert [r.outcome for r in await drain(delayq_service)] == ["success"]
    assert seen == ["p1"]
    assert delayq_service.options.retry_attempts == 0
    seen.append(delayq_service.options.prefix)


@MARK
async def test_the_last_tests_keys_are_gone(delayq_service, delayq_redis):
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(delayq_redis)
    try:
        assert await client.keys("{" + seen[-1] + "*") == []
    finally:
        await client.aclose()
    assert delayq_service.options.prefix != seen[-1]
"""


def plugin_args() -> list[str]:
    """``-p`` the plugin unless its entry point is installed (then it loads by itself, and
    naming it again would register it twice)."""
    installed = any(ep.value == PLUGIN for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", PLUGIN]


def run(folder: Path, *args: str, url: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DELAYQ_TEST"))}
    env["PYTHONPATH"] = str(ROOT)
    env["REDIS_URL"] = "redis://127.0.0.1:1/0"  # never read by the kit: nothing listens there
    if url is not None:
        env["DELAYQ_TEST_REDIS_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin_args(), *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


ANYIO_BACKEND = """

@pytest.fixture
def anyio_backend():
    return "asyncio"
"""


@pytest.mark.parametrize(
    ("mode", "mark", "args", "private"),
    [
        # pytest-asyncio's default mode: tests marked asyncio; DELAYQ_TEST_REDIS_URL's server
        ("strict", "pytest.mark.asyncio", (), False),
        # auto mode, and a private server started for the session
        ("auto", "pytest.mark.asyncio", (), True),
        # anyio's plugin alone (pytest-asyncio off), its backend asyncio
        ("strict", "pytest.mark.anyio", ("-p", "no:asyncio"), False),
    ],
)
def test_the_fixtures_run_under_each_async_plugin(
    tmp_path: Path, redis_url: str, mode: str, mark: str, args: tuple[str, ...], private: bool
) -> None:
    ini = f"[pytest]\nasyncio_mode = {mode}\nasyncio_default_fixture_loop_scope = function\n"
    (tmp_path / "pytest.ini").write_text(ini if "no:asyncio" not in args else "[pytest]\n")
    tests = USER_TESTS.replace("@MARK", "@" + mark)
    if "anyio" in mark:
        tests += ANYIO_BACKEND
    if private:
        tests += PRIVATE
    (tmp_path / "test_user.py").write_text(tests)
    done = run(tmp_path, *args, url=None if private else redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{3 if private else 2} passed" in done.stdout, done.stdout


PRIVATE = """

def test_the_server_is_a_private_one(delayq_redis):
    assert delayq_redis.startswith("redis://127.0.0.1:") and not delayq_redis.endswith(":1/0")
"""
