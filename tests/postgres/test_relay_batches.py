"""The relay's batch stays a batch whatever PostgreSQL's statistics say (issue 26, part 1).

An outbox spends most of its life drained: one live row over many pages of dead ones. When
autovacuum analyzes it then, the planner believes the table holds about one row, and a batch
query that leaves it free to pick its plan can pick one whose cost grows with the backlog
(once it re-ran the ``LIMIT`` subquery per row and deleted the whole backlog in one
transaction, ignoring ``batch_size``). Each test here first gives the table exactly those
statistics, with autovacuum off on it so that nothing else analyzes it meanwhile.
"""

from __future__ import annotations

import asyncpg
import pytest

from delayq import Event, EventService
from delayq.postgres import Outbox, OutboxRelay


class Job(Event, event_name="pg-batch-job"):
    n: int = 0


@pytest.fixture
async def service(redis_url: str, prefix: str):
    svc = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    try:
        yield svc
    finally:
        await svc.aclose()


async def add_rows(pg: asyncpg.Connection, schema: str, n: int, tag: str) -> None:
    """Commit ``n`` outbox rows (real envelopes), 10,000 per transaction."""
    outbox = Outbox(schema)
    for start in range(0, n, 10_000):
        async with pg.transaction():
            await outbox.enqueue_many(
                pg, [Job(id=f"{tag}{i}", n=i) for i in range(start, min(n, start + 10_000))], 3600
            )


async def drained_and_analyzed(
    pg: asyncpg.Connection, schema: str, relay: OutboxRelay
) -> None:
    """The table's normal drained state, analyzed: 1 live row after 3,000 relayed ones."""
    await pg.execute(f'ALTER TABLE "{schema}".outbox SET (autovacuum_enabled = false)')
    await add_rows(pg, schema, 3000, "old")
    while await relay.relay_once():
        pass
    await add_rows(pg, schema, 1, "last")
    await pg.execute(f'ANALYZE "{schema}".outbox')
    stats = await pg.fetchval(
        "SELECT reltuples FROM pg_class WHERE oid = $1::regclass", f'"{schema}".outbox'
    )
    assert stats <= 1


async def test_batch_size_is_respected_after_analyze_of_a_drained_table(
    pg, schema, service, postgres_url
):
    relay = OutboxRelay(service, postgres_url, schema=schema, batch_size=100)
    try:
        await drained_and_analyzed(pg, schema, relay)
        await add_rows(pg, schema, 201, "new")
        assert await relay.relay_once() == 100
        assert await relay.relay_once() == 100
        assert await relay.relay_once() == 2
        assert await relay.relay_once() == 0
    finally:
        await relay.aclose()
    assert relay.relayed == 3000 + 202 and relay.kept == 0
