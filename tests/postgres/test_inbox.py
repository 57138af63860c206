"""The inbox against a real PostgreSQL and a real Redis: a handler's work happens once.

A handler that committed and was SIGKILLed before its ack is redelivered and skips its work;
a handler whose transaction rolled back does its work on the retry; the version and the
idempotency key are stable across redeliveries and new for a new enqueue.
"""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import timedelta

import asyncpg
import pytest
from pgkit import OrderCheck, spawn

from delayq import Delivery, EventService, current_delivery, fixed
from delayq.postgres import Inbox, Outbox, OutboxRelay


async def effects(pg: asyncpg.Connection, schema: str) -> list[tuple[int, str]]:
    rows = await pg.fetch(f'SELECT order_id, version FROM "{schema}".effects ORDER BY order_id')
    return [(r[0], r[1]) for r in rows]


async def test_killed_after_commit_before_ack_runs_the_work_once(
    pg, schema, postgres_url, redis_url, prefix, tmp_path, wait_for
):
    marker = tmp_path / "committed"
    common = ["--db", postgres_url, "--redis", redis_url, "--prefix", prefix, "--schema", schema]
    first = spawn(str(tmp_path / "w1.log"), "worker", *common, "--hang-after-commit", str(marker))
    procs = [first]
    try:
        outbox = Outbox(schema)
        service = EventService.from_url(redis_url, prefix=prefix)
        try:
            async with pg.transaction():
                await pg.execute(f'INSERT INTO "{schema}".orders (id) VALUES (7)')
                await outbox.enqueue_with_delay(pg, OrderCheck(id="order-7", order_id=7), 0)
            relay = OutboxRelay(service, postgres_url, schema=schema)
            try:
                assert await relay.relay_once() == 1
            finally:
                await relay.aclose()
            await wait_for(marker.exists, timeout=30, message="the first worker's commit")
            assert len(await effects(pg, schema)) == 1
            os.kill(first.pid, signal.SIGKILL)  # committed, not acked
            first.wait()
            counts = await service.stats_for(OrderCheck)
            assert counts.in_flight == 1
            procs.append(spawn(str(tmp_path / "w2.log"), "worker", *common))

            async def redelivered_and_acked() -> bool:
                runs = await pg.fetch(f'SELECT first FROM "{schema}".runs ORDER BY first DESC')
                c = await service.stats_for(OrderCheck)
                done = c.in_flight + c.ready + c.scheduled == 0
                return done and [r[0] for r in runs] == [True, False]

            await wait_for(redelivered_and_acked, timeout=30, interval=0.05)
        finally:
            await service.aclose()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    rows = await effects(pg, schema)
    assert [r[0] for r in rows] == [7]  # the effect exactly once
    inbox_rows = await pg.fetch(f'SELECT event_id, version FROM "{schema}".inbox')
    assert [(r[0], r[1]) for r in inbox_rows] == [("order-7", rows[0][1])]


@pytest.fixture
async def service(redis_url: str, prefix: str):
    svc = EventService.from_url(
        redis_url, prefix=prefix, scheduling_interval=0.05, retry_backoff=fixed(0.05)
    )
    try:
        yield svc
    finally:
        await svc.aclose()


async def test_rolled_back_handler_does_its_work_on_the_retry(
    postgres_url, pg, schema, service, wait_for
):
    pool = await asyncpg.create_pool(postgres_url, min_size=1, max_size=4)
    inbox = Inbox(schema)
    attempts: list[tuple[int, bool]] = []

    async def handler(event: OrderCheck) -> None:
        delivery = current_delivery()
        assert delivery is not None
        async with pool.acquire() as conn, inbox.once(conn) as first:
            attempts.append((delivery.attempt, first))
            if first:
                await conn.execute(
                    f'INSERT INTO "{schema}".effects (order_id, version, pid) VALUES ($1, $2, 0)',
                    event.order_id,
                    delivery.version,
                )
                if delivery.attempt == 1:
                    raise RuntimeError("the payment provider timed out")

    try:
        service.add_handler(OrderCheck, handler)
        await service.start()
        await service.enqueue_with_delay(OrderCheck(id="order-8", order_id=8))

        async def acked() -> bool:
            c = await service.stats_for(OrderCheck)
            return len(attempts) == 2 and c.in_flight + c.ready + c.scheduled == 0

        await wait_for(acked, timeout=10)
    finally:
        await service.aclose()
        await pool.close()
    assert attempts == [(1, True), (2, True)]  # the rollback took the inbox row with it
    assert [r[0] for r in await effects(pg, schema)] == [8]


async def test_version_and_idempotency_key(service, pg, schema, wait_for):
    seen: list[Delivery] = []
    inbox = Inbox(schema)

    async def handler(event: OrderCheck) -> bool:
        delivery = current_delivery()
        assert delivery is not None
        seen.append(delivery)
        async with inbox.once(pg) as first:
            return not first or delivery.attempt > 1  # fail the first attempt after recording

    service.add_handler(OrderCheck, handler)
    await service.start()
    await service.enqueue_with_delay(OrderCheck(id="v", order_id=1))
    await wait_for(lambda: len(seen) == 2, timeout=10)
    a, b = seen
    assert (a.attempt, b.attempt) == (1, 2)
    assert a.version == b.version and len(a.version) == 32
    assert a.idempotency_key == b.idempotency_key
    assert a.idempotency_key.startswith("dq-") and len(a.idempotency_key) == 43

    async def acked() -> bool:
        c = await service.stats_for(OrderCheck)
        return c.in_flight + c.ready + c.scheduled == 0

    # the second handler uses pg after it is seen: wait for its ack before using pg here
    await wait_for(acked, timeout=10)
    # the first attempt returned False after its row committed (once() opened and
    # committed its own transaction): the retry found the row
    assert await inbox.seen(pg, a)
    # the same event enqueued again after it was handled is a new version
    await service.enqueue_with_delay(OrderCheck(id="v", order_id=1))
    await wait_for(lambda: len(seen) == 3, timeout=10)
    c = seen[2]
    assert c.version != a.version and c.idempotency_key != a.idempotency_key
    assert c.attempt == 1
    await wait_for(acked, timeout=10)
    assert await inbox.seen(pg, c)


async def test_resent_outbox_row_is_the_same_version(service, pg, schema, postgres_url, wait_for):
    """A relay that dies after sending re-sends the same envelope: the inbox absorbs it."""
    outbox = Outbox(schema)
    inbox = Inbox(schema)
    firsts: list[bool] = []

    async def handler(event: OrderCheck) -> None:
        async with inbox.once(pg) as first:
            firsts.append(first)

    service.add_handler(OrderCheck, handler)
    await service.start()
    await outbox.enqueue_with_delay(pg, OrderCheck(id="r", order_id=1), 0)
    relay = OutboxRelay(service, postgres_url, schema=schema)
    try:
        conn = await relay._connection()
        tx = conn.transaction()
        await tx.start()
        rows = await conn.fetch(relay._take, 10)
        await relay._send(rows)  # sent to Redis, then the "crash": the delete rolls back
        await tx.rollback()
        await wait_for(lambda: firsts == [True], timeout=10)

        async def acked() -> bool:
            c = await service.stats_for(OrderCheck)
            return c.in_flight + c.ready + c.scheduled == 0

        await wait_for(acked, timeout=10)
        assert await relay.relay_once() == 1  # the row comes again, after the event was acked
    finally:
        await relay.aclose()
    await wait_for(lambda: len(firsts) == 2, timeout=10)
    # the handler is still in inbox.once(pg) (and the schema is dropped on pg) until its ack
    await wait_for(acked, timeout=10)
    assert firsts == [True, False]


async def test_prune_and_errors(pg, schema):
    inbox = Inbox(schema)
    await pg.execute(
        f'INSERT INTO "{schema}".inbox (event_type, event_id, version, handled_at) '
        "SELECT 't', 'i' || g, 'v', now() - interval '10 days' FROM generate_series(1, 12000) g"
    )
    await pg.execute(
        f"INSERT INTO \"{schema}\".inbox (event_type, event_id, version) VALUES ('t', 'new', 'v')"
    )
    assert await inbox.prune(pg, timedelta(days=7)) == 12000
    assert await pg.fetchval(f'SELECT count(*) FROM "{schema}".inbox') == 1
    with pytest.raises(RuntimeError, match="no delivery"):
        async with inbox.once(pg):
            pass
    with pytest.raises(TypeError):
        await inbox.claim(object(), Delivery("t", "i", 1, None, 0, {}, b"x"))


async def test_sqlalchemy_session_inbox(postgres_url, schema):
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(postgres_url.replace("postgresql://", "postgresql+asyncpg://"))
    inbox = Inbox(schema)
    delivery = Delivery("pg-order-check", "s", 1, None, 0, {}, b"envelope")
    try:
        async with AsyncSession(engine) as session:
            async with inbox.once(session, delivery) as first:
                assert first
            async with session.begin():
                async with inbox.once(session, delivery) as first:
                    assert not first
            assert await inbox.seen(session, delivery)
    finally:
        await engine.dispose()
    await asyncio.sleep(0)
