"""Fixtures of the fault-injection suite: a recorder Redis and pools of worker processes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis.asyncio as aioredis
from faultkit import WorkerPool

from delayq.testing import RedisServer


@pytest.fixture
def recorder_server(redis_server_factory) -> RedisServer:
    """A private Redis that only holds what workers record (never killed by a test)."""
    return redis_server_factory()


@pytest.fixture
async def rec(recorder_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """An async client on the recorder Redis."""
    client = aioredis.Redis.from_url(recorder_server.url, protocol=2)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def run_id() -> str:
    """A unique name for this test's records."""
    return uuid.uuid4().hex[:8]


@pytest.fixture
def pools(
    recorder_server: RedisServer, prefix: str, run_id: str
) -> Iterator[Callable[..., WorkerPool]]:
    """``pools(url)`` makes a :class:`WorkerPool` against the queue Redis at ``url``.

    Every worker process is stopped when the test ends.
    """
    made: list[WorkerPool] = []

    def make(url: str) -> WorkerPool:
        pool = WorkerPool(url=url, rec_url=recorder_server.url, prefix=prefix, run=run_id)
        made.append(pool)
        return pool

    try:
        yield make
    finally:
        for pool in made:
            pool.stop_all()
