"""The outbox and inbox tables: the migration SQL shipped in the package, and applying it.

The SQL lives in ``delayq/postgres/sql/NNN_*.sql``, one file per schema version, with
``{schema}`` and ``{channel}`` placeholders. :func:`migrate` applies the versions a database
lacks, in one transaction under an advisory lock (so app processes starting together do not
race), and records them in ``<schema>.schema_version``. Teams with their own migration tool
can take the rendered SQL from :func:`schema_sql` instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = ["Migration", "channel_name", "migrate", "migrations", "schema_sql", "validate_schema"]

_SCHEMA_RE = r"[a-z_][a-z0-9_]{0,49}"
_FILE_RE = r"(\d{3})_[a-z0-9_]+\.sql"


def validate_schema(schema: object) -> str:
    """Return ``schema`` if it is a plain lower-case identifier (``[a-z_][a-z0-9_]*``, ≤ 50).

    Only such names are accepted, so they can be put into SQL and channel names as they are.
    """
    if not isinstance(schema, str):
        raise TypeError(f"schema must be a str, not {type(schema).__name__}")
    if not re.fullmatch(_SCHEMA_RE, schema) or schema.startswith("pg_"):
        raise ValueError(
            f"schema must match [a-z_][a-z0-9_]* (at most 50 characters, not pg_...): {schema!r}"
        )
    return schema


def channel_name(schema: str) -> str:
    """The LISTEN/NOTIFY channel the outbox of ``schema`` notifies on commit."""
    return f"{validate_schema(schema)}_outbox"


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema version: its number, file name and SQL rendered for a schema."""

    version: int
    name: str
    sql: str


def migrations(schema: str = "delayq") -> list[Migration]:
    """Every shipped migration, in order, rendered for ``schema``."""
    schema = validate_schema(schema)
    found = []
    for entry in resources.files("delayq.postgres").joinpath("sql").iterdir():
        match = re.fullmatch(_FILE_RE, entry.name)
        if match is None:
            continue
        text = entry.read_text(encoding="utf-8")
        sql = text.replace("{schema}", f'"{schema}"').replace("{channel}", channel_name(schema))
        found.append(Migration(int(match.group(1)), entry.name, sql))
    return sorted(found, key=lambda m: m.version)


def schema_sql(schema: str = "delayq") -> str:
    """All migrations as one SQL script (with ``CREATE SCHEMA IF NOT EXISTS``), for your own tool."""
    parts = [f'CREATE SCHEMA IF NOT EXISTS "{validate_schema(schema)}";\n']
    parts += [f"-- {m.name}\n{m.sql}" for m in migrations(schema)]
    return "\n".join(parts)


async def migrate(conn: Any, schema: str = "delayq") -> list[int]:
    """Create or upgrade the outbox and inbox tables in ``schema``; return the versions applied.

    ``conn`` is an asyncpg connection or a ``postgresql://`` URL (a connection is then opened
    and closed). Safe to call on every start: versions already applied are skipped, and
    concurrent callers wait for each other on an advisory lock. Everything happens in one
    transaction: a failure leaves the database as it was.
    """
    schema = validate_schema(schema)
    if isinstance(conn, str):
        import asyncpg

        own = await asyncpg.connect(conn)
        try:
            return await migrate(own, schema)
        finally:
            await own.close()
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"delayq.migrate.{schema}")
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{schema}".schema_version ('
            "version integer PRIMARY KEY, name text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r[0] for r in await conn.fetch(f'SELECT version FROM "{schema}".schema_version')}
        for migration in migrations(schema):
            if migration.version in done:
                continue
            await conn.execute(migration.sql)
            await conn.execute(
                f'INSERT INTO "{schema}".schema_version (version, name) VALUES ($1, $2)',
                migration.version,
                migration.name,
            )
            applied.append(migration.version)
    return applied
