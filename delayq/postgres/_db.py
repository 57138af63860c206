"""Running a statement on the caller's connection: asyncpg, or SQLAlchemy's async API.

The outbox and the inbox write inside the caller's own transaction, so they take whatever
connection the application uses: an asyncpg ``Connection`` (or a pool's connection proxy), or
a SQLAlchemy ``AsyncConnection`` / ``AsyncSession``. With SQLAlchemy the statement goes
through SQLAlchemy itself (not the raw driver connection), so it joins the transaction
SQLAlchemy has begun, or begins it, exactly as the application's own statements do.

SQL is written once with ``$1``-style parameters and ``CAST(... AS ...)`` (never ``::``, which
SQLAlchemy's ``text()`` would misread); for SQLAlchemy ``$n`` becomes ``:pn``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

__all__ = ["fetch", "in_transaction", "is_sqlalchemy", "transaction"]

_PARAM = r"\$(\d+)"  # a pattern string: re caches it


def is_sqlalchemy(conn: Any) -> bool:
    """True for SQLAlchemy objects (an ``AsyncConnection`` or ``AsyncSession``)."""
    return type(conn).__module__.startswith("sqlalchemy.")


def _check(conn: Any) -> None:
    if is_sqlalchemy(conn):
        if not hasattr(conn, "in_transaction"):
            raise TypeError(
                f"pass a SQLAlchemy AsyncConnection or AsyncSession, not {type(conn).__name__}"
            )
    elif not (hasattr(conn, "fetch") and hasattr(conn, "is_in_transaction")):
        raise TypeError(
            "pass an asyncpg connection or a SQLAlchemy AsyncConnection/AsyncSession, "
            f"not {type(conn).__name__}"
        )


async def fetch(conn: Any, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run ``sql`` with ``args`` on ``conn``; return the rows as tuples (none for a write)."""
    _check(conn)
    if is_sqlalchemy(conn):
        from sqlalchemy import text

        statement = text(re.sub(_PARAM, lambda m: f":p{m.group(1)}", sql))
        result = await conn.execute(statement, {f"p{i}": v for i, v in enumerate(args, 1)})
        return [tuple(row) for row in result.fetchall()] if result.returns_rows else []
    return [tuple(row) for row in await conn.fetch(sql, *args)]


def in_transaction(conn: Any) -> bool:
    """True when ``conn`` has a transaction open."""
    _check(conn)
    if is_sqlalchemy(conn):
        return bool(conn.in_transaction())
    return bool(conn.is_in_transaction())


def transaction(conn: Any) -> AbstractAsyncContextManager[Any]:
    """A new transaction on ``conn``: committed when the block ends, rolled back if it raises."""
    _check(conn)
    if is_sqlalchemy(conn):
        return _sqlalchemy_begin(conn)
    tx: AbstractAsyncContextManager[Any] = conn.transaction()
    return tx


@asynccontextmanager
async def _sqlalchemy_begin(conn: Any) -> AsyncIterator[None]:
    async with conn.begin():
        yield
