"""Fixtures of the PostgreSQL tests: a private PostgreSQL, a migrated schema per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from pgkit import create_app_tables

from delayq.postgres import migrate
from delayq.testing import PostgresServer


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """``DATABASE_URL`` if set (a disposable database!), else a private PostgresServer."""
    env_url = os.environ.get("DATABASE_URL")
    if env_url:
        yield env_url
        return
    with PostgresServer() as server:
        yield server.url


@pytest.fixture
async def pg(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    """An asyncpg connection, closed after the test."""
    conn = await asyncpg.connect(postgres_url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def schema(pg: asyncpg.Connection) -> AsyncIterator[str]:
    """A fresh schema with the outbox, the inbox and the app's tables; dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    await migrate(pg, name)
    await create_app_tables(pg, name)
    try:
        yield name
    finally:
        await pg.execute(f'DROP SCHEMA "{name}" CASCADE')
