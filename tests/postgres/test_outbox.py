"""The transactional outbox against a real PostgreSQL and a real Redis.

Rolled-back transactions enqueue nothing, committed ones are delivered, a relay SIGKILLed in
the middle of a batch loses and duplicates nothing, several relays share the work, and
SQLAlchemy connections and sessions work like asyncpg ones.
"""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import datetime, timedelta, timezone
from pathlib import Path

import asyncpg
import pytest
from pgkit import OrderCheck, spawn

from delayq import Event, EventService
from delayq.postgres import Outbox, OutboxRelay, channel_name, migrate, migrations, schema_sql


class Ping(Event, event_name="pg-ping"):
    n: int = 0


@pytest.fixture
async def service(redis_url: str, prefix: str):
    svc = EventService.from_url(redis_url, prefix=prefix, scheduling_interval=0.05)
    try:
        yield svc
    finally:
        await svc.aclose()


async def test_migrate_is_idempotent_and_sql_is_rendered(pg, schema):
    assert await migrate(pg, schema) == []  # the fixture applied everything already
    versions = await pg.fetch(f'SELECT version FROM "{schema}".schema_version')
    assert [r[0] for r in versions] == [m.version for m in migrations(schema)]
    sql = schema_sql("shop_events")
    assert 'CREATE TABLE "shop_events".outbox' in sql and "shop_events_outbox" in sql
    assert channel_name("shop_events") == "shop_events_outbox"
    for bad in ("Bad", "a-b", 'x"; drop', "pg_x", ""):
        with pytest.raises(ValueError):
            Outbox(bad)


async def test_concurrent_migrations_wait_for_each_other(postgres_url, pg):
    name = "t_concurrent_migrate"
    await pg.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    try:
        results = await asyncio.gather(*(migrate(postgres_url, name) for _ in range(3)))
        assert sorted(results, key=len) == [[], [], [m.version for m in migrations(name)]]
    finally:
        await pg.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


async def test_rolled_back_transaction_enqueues_nothing(pg, schema, service, postgres_url):
    outbox = Outbox(schema)

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with pg.transaction():
            await pg.execute(f'INSERT INTO "{schema}".orders (id) VALUES (1)')
            await outbox.enqueue_with_delay(pg, OrderCheck(id="o-1", order_id=1), 0)
            assert await outbox.pending(pg) == 1  # visible inside the transaction only
            raise Boom
    assert await outbox.pending(pg) == 0
    relay = OutboxRelay(service, postgres_url, schema=schema)
    try:
        assert await relay.relay_once() == 0
    finally:
        await relay.aclose()
    assert (await service.stats_for(OrderCheck)).scheduled == 0
    assert (await service.stats_for(OrderCheck)).ready == 0


async def test_committed_transaction_is_delivered(pg, schema, service, postgres_url, wait_for):
    outbox = Outbox(schema)
    got: list[tuple[str, dict[str, str]]] = []

    async def handler(event: OrderCheck) -> None:
        from delayq import event_context

        got.append((event.id, dict(event_context())))

    service.add_handler(OrderCheck, handler)
    await service.start()
    async with OutboxRelay(service, postgres_url, schema=schema, poll_interval=30) as relay:
        async with pg.transaction():
            await pg.execute(f'INSERT INTO "{schema}".orders (id) VALUES (2)')
            await outbox.enqueue_with_delay(
                pg, OrderCheck(id="o-2", order_id=2), 0.05, context={"request_id": "r-2"}
            )
        # poll_interval is 30 s: only the commit's notification can wake the relay this fast
        await wait_for(lambda: got, timeout=10)
        assert got == [("o-2", {"request_id": "r-2"})]
        assert relay.relayed == 1 and relay.kept == 0
    assert await outbox.pending(pg) == 0


async def test_enqueue_at_many_and_replace(pg, schema, service, postgres_url):
    outbox = Outbox(schema)
    far = datetime.now(timezone.utc) + timedelta(hours=1)
    async with pg.transaction():
        await outbox.enqueue_at(pg, Ping(id="at", n=1), far)
        n = await outbox.enqueue_many(
            pg, [Ping(id="m1"), (Ping(id="m2"), timedelta(hours=2)), Ping(id="at", n=2)], 3600
        )
        assert n == 3
        await outbox.enqueue_with_delay(pg, Ping(id="m1", n=9), 3600, replace=True)
    relay = OutboxRelay(service, postgres_url, schema=schema, batch_size=2)
    try:
        while await relay.relay_once():
            pass
    finally:
        await relay.aclose()
    assert relay.relayed == 5
    assert relay.kept == 1  # the second "at" found the first and was kept
    assert relay.batches >= 3
    assert (await service.stats_for(Ping)).scheduled == 3
    with pytest.raises(TypeError):
        await outbox.enqueue_with_delay(pg, "not an event", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await outbox.enqueue_at(pg, Ping(id="x"), datetime.now())
    with pytest.raises(ValueError):
        await outbox.enqueue_with_delay(pg, Ping(id=""), 1)


async def test_replace_through_the_outbox_keeps_insertion_order(pg, schema, service, postgres_url):
    outbox = Outbox(schema)
    got: list[int] = []

    async def handler(event: Ping) -> None:
        got.append(event.n)

    for n in range(5):
        await outbox.enqueue_with_delay(pg, Ping(id="same", n=n), 0.3, replace=True)
    # two relays at once: a later row of the same event waits for the earlier one
    relays = [OutboxRelay(service, postgres_url, schema=schema, batch_size=1) for _ in range(2)]
    try:
        while sum(await asyncio.gather(*(r.relay_once() for r in relays))):
            pass
    finally:
        for relay in relays:
            await relay.aclose()
    service.add_handler(Ping, handler)
    await service.start()
    for _ in range(200):
        if got:
            break
        await asyncio.sleep(0.05)
    assert got == [4]


async def test_sqlalchemy_connection_and_session(postgres_url, schema, service):
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(postgres_url.replace("postgresql://", "postgresql+asyncpg://"))
    outbox = Outbox(schema)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f'INSERT INTO "{schema}".orders (id) VALUES (10)'))
            await outbox.enqueue_with_delay(conn, OrderCheck(id="sa-conn", order_id=10), 3600)
        async with engine.connect() as conn:
            await outbox.enqueue_with_delay(conn, OrderCheck(id="sa-rolled", order_id=11), 3600)
            await conn.rollback()
        async with AsyncSession(engine) as session:
            async with session.begin():
                await outbox.enqueue_many(session, [OrderCheck(id="sa-s", order_id=12)], 3600)
            async with session.begin():
                await outbox.enqueue_with_delay(session, OrderCheck(id="sa-x", order_id=13), 1)
                await session.rollback()
            assert await outbox.pending(session) == 2
    finally:
        await engine.dispose()
    relay = OutboxRelay(service, postgres_url, schema=schema)
    try:
        assert await relay.relay_once() == 2
    finally:
        await relay.aclose()
    assert (await service.stats_for(OrderCheck)).scheduled == 2


async def test_two_relays_share_the_work(pg, schema, service, postgres_url, wait_for):
    outbox = Outbox(schema)
    total = 3000
    relays = [
        OutboxRelay(service, postgres_url, schema=schema, batch_size=50, poll_interval=0.1)
        for _ in range(2)
    ]
    # both relays run before the rows come (a relay started after 3000 rows could find
    # them all relayed by the first one on a loaded machine: seen in a CI lane)
    for relay in relays:
        await relay.start()
    try:
        for start in range(0, total, 500):
            async with pg.transaction():
                await outbox.enqueue_many(
                    pg, [Ping(id=f"p{i}", n=i) for i in range(start, start + 500)], 3600
                )
        await wait_for(lambda: sum(r.relayed for r in relays) >= total, timeout=60)
    finally:
        for relay in relays:
            await relay.aclose()
    assert [r.relayed > 0 for r in relays] == [True, True], [r.relayed for r in relays]
    assert sum(r.relayed for r in relays) == total
    assert sum(r.kept for r in relays) == 0
    assert await outbox.pending(pg) == 0
    assert (await service.stats_for(Ping)).scheduled == total


async def test_relay_killed_mid_batch_loses_and_duplicates_nothing(
    pg, schema, service, postgres_url, redis_url, prefix, tmp_path, wait_for
):
    outbox = Outbox(schema)
    total = 250
    async with pg.transaction():
        await outbox.enqueue_many(
            pg, [OrderCheck(id=f"k{i}", order_id=i) for i in range(total)], 3600
        )
    marker = tmp_path / "sent"
    proc = spawn(
        str(tmp_path / "relay.log"), "relay", "--db", postgres_url, "--redis", redis_url,
        "--prefix", prefix, "--schema", schema, "--batch-size", "100",
        "--hang-after-send", str(marker),
    )  # fmt: skip
    try:
        await wait_for(marker.exists, timeout=30, message="the relay's first batch")
        assert marker.read_text() == "100"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # the batch reached Redis, but its transaction never committed: every row is still there
    assert (await service.stats_for(OrderCheck)).scheduled == 100
    assert await outbox.pending(pg) == total
    # (its locks go when PostgreSQL sees the connection drop: the relay waits for that)
    async with OutboxRelay(
        service, postgres_url, schema=schema, batch_size=100, poll_interval=0.05
    ) as relay:
        await wait_for(lambda: relay.relayed >= total, timeout=30)
    assert relay.relayed == total
    assert relay.kept == 100  # the re-sent rows found their events and were absorbed
    assert await outbox.pending(pg) == 0
    counts = await service.stats_for(OrderCheck)
    assert counts.scheduled == total and counts.ready == 0
    ids = await service.store.redis.zrange(f"{{{prefix}:pg-order-check}}:scheduled", 0, -1)
    assert sorted(i.decode() for i in ids) == sorted(f"k{i}" for i in range(total))


async def test_relay_survives_postgres_restart(redis_url, prefix, wait_for):
    from delayq.testing import PostgresServer

    with PostgresServer() as server:
        conn = await asyncpg.connect(server.url)
        await migrate(conn, "delayq")
        svc = EventService.from_url(redis_url, prefix=prefix)
        outbox = Outbox()
        try:
            async with OutboxRelay(svc, server.url, poll_interval=0.1) as relay:
                await outbox.enqueue_with_delay(conn, Ping(id="before"), 3600)
                await wait_for(lambda: relay.relayed == 1, timeout=10)
                await conn.close()
                server.kill()
                server.start()
                conn = await asyncpg.connect(server.url)
                await outbox.enqueue_with_delay(conn, Ping(id="after"), 3600)
                await wait_for(lambda: relay.relayed == 2, timeout=20)
        finally:
            await conn.close()
            await svc.aclose()


def test_python_m_delayq_postgres_sql(tmp_path):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "delayq.postgres", "sql", "--schema", "app_q"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert 'CREATE TABLE "app_q".inbox' in out.stdout
    assert Path(tmp_path).exists()


def test_importing_delayq_does_not_import_asyncpg_or_sqlalchemy():
    import subprocess
    import sys

    code = (
        "import sys, delayq, delayq.testing; "
        "bad = [m for m in ('asyncpg', 'sqlalchemy') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
