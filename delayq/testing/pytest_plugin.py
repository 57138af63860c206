"""The delayq pytest plugin (entry point ``pytest11``: ``delayq``): fixtures for testing code
that uses delayq, on a real server (docs/TESTING.md).

- ``delayq_redis`` (session): the URL of a private ``redis-server`` started for the
  session (the one on ``PATH``, ``DELAYQ_SERVER``'s, or the bundled one), or the server
  ``DELAYQ_TEST_REDIS_URL`` names. ``REDIS_URL`` is never read: it names an application's
  server, which a test run must not touch.
- ``delayq_options``: ``EventService`` options for ``delayq_service`` (override it).
- ``delayq_service``: a started service on its own prefix (handlers a test adds start at
  once), closed and its keys removed after the test. It runs under pytest-asyncio (auto
  mode, or tests marked ``asyncio``) and under anyio's plugin (tests marked ``anyio``,
  backend ``asyncio``).

The plugin adds no options and no autouse fixture: a suite that does not ask for these
fixtures runs as before (``-p no:delayq`` turns it off).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from ..service import EventService
from .private import TEST_REDIS_URL_ENV
from .server import RedisServer
from .services import isolated_service

__all__ = ["delayq_options", "delayq_redis", "delayq_service"]

# the servers this plugin started: their script caches are its own to flush
_STARTED: set[str] = set()


@pytest.fixture(scope="session")
def delayq_redis() -> Iterator[str]:
    """The URL of the session's Redis: ``DELAYQ_TEST_REDIS_URL``, or a private server."""
    url = os.environ.get(TEST_REDIS_URL_ENV)
    if url:
        yield url
        return
    with RedisServer() as server:
        _STARTED.add(server.url)
        try:
            yield server.url
        finally:
            _STARTED.discard(server.url)


@pytest.fixture
def delayq_options() -> dict[str, Any]:
    """Options for ``delayq_service`` (override this fixture: ``return {"retry_attempts": 2}``)."""
    return {}


@pytest.fixture
def delayq_service(request: pytest.FixtureRequest) -> EventService:
    """A started ``EventService`` on its own prefix of ``delayq_redis`` for one test."""
    if "anyio_backend" in request.fixturenames:
        backend = request.getfixturevalue("anyio_backend")
        name = backend if isinstance(backend, str) else backend[0]
        if name != "asyncio":
            pytest.fail(f"delayq runs on asyncio, not {name!r}: set anyio_backend to 'asyncio'")
        service: EventService = request.getfixturevalue("_delayq_service_anyio")
        return service
    if not _HAS_PYTEST_ASYNCIO:
        pytest.fail("delayq_service needs pytest-asyncio, or anyio's plugin (tests marked anyio)")
    service = request.getfixturevalue("_delayq_service_asyncio")
    return service


async def _service(url: str, options: dict[str, Any]) -> AsyncIterator[EventService]:
    async with isolated_service(url, **options) as service:
        yield service
    if service.store.clock_offset_ms and url in _STARTED:
        # each advance loaded new copies of the scripts that read the clock
        client = aioredis.Redis.from_url(url, protocol=2)
        try:
            await client.script_flush()
        finally:
            await client.aclose()


@pytest.fixture
async def _delayq_service_anyio(
    delayq_redis: str, delayq_options: dict[str, Any]
) -> AsyncIterator[EventService]:
    """``delayq_service`` as anyio's plugin runs it."""
    async for service in _service(delayq_redis, delayq_options):
        yield service


try:
    import pytest_asyncio
except ImportError:  # anyio's plugin alone
    _HAS_PYTEST_ASYNCIO = False
else:
    _HAS_PYTEST_ASYNCIO = True

    @pytest_asyncio.fixture
    async def _delayq_service_asyncio(
        delayq_redis: str, delayq_options: dict[str, Any]
    ) -> AsyncIterator[EventService]:
        """``delayq_service`` as pytest-asyncio runs it."""
        async for service in _service(delayq_redis, delayq_options):
            yield service
