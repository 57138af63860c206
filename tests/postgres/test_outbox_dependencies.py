"""Outbox rows with parents (``after=[...]``) against a real PostgreSQL and a real Redis
(docs/POSTGRES.md, "Dependencies through the outbox"; docs/WORKFLOWS.md, "Dependencies").

A child committed with its parent reaches Redis after it and waits for its run, even when
the relay has to take it in a later batch, or a parent's row is held by another relay;
the policies hold; bad input raises at insert; a schema of migration 1 is upgraded, its
rows relayed, and a relay on a schema not yet upgraded says what to do.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import asyncpg
import pytest
from test_relay_batches import assert_bounded, batch_plan

from delayq import Event, EventService, Parent, current_delivery, fixed
from delayq.postgres import Outbox, OutboxRelay, migrate, migrations


class Charge(Event, event_name="pgd-charge", results=timedelta(hours=1)):
    fail: bool = False


class Receipt(Event, event_name="pgd-receipt"):
    pass


class Seen:
    """A handler noting the parents each run saw."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], tuple[Parent, ...]] = {}

    async def handle(self, event: Event) -> object:
        d = current_delivery()
        assert d is not None
        self.runs[d.event_type, event.id] = d.parents
        if isinstance(event, Charge):
            if event.fail:
                raise RuntimeError("declined")
            return {"paid": event.id}
        return None

    def statuses(self, t: type[Event], i: str) -> list[str]:
        return [p.status for p in self.runs[t.event_name, i]]


@pytest.fixture
async def service(redis_url: str, prefix: str):
    svc = EventService.from_url(
        redis_url,
        prefix=prefix,
        scheduling_interval=0.1,
        polling_timeout=0.5,
        retry_attempts=0,
        retry_backoff=fixed(0.05),
        shutdown_grace=1.0,
    )
    try:
        yield svc
    finally:
        await svc.aclose()


async def _drain(relay: OutboxRelay) -> None:
    while await relay.relay_once():
        pass


async def test_a_child_committed_with_its_parent_waits_for_its_run(
    pg, schema, service, postgres_url, wait_for
):
    outbox, seen = Outbox(schema), Seen()
    for t in (Charge, Receipt):
        service.add_handler(t, seen.handle)
    await service.start()
    soon = datetime.now(timezone.utc) + timedelta(seconds=0.3)
    async with pg.transaction():
        await outbox.enqueue_with_delay(pg, Charge(id="o1"), 0.3)
        await outbox.enqueue_with_delay(pg, Receipt(id="r1"), 0, after=[(Charge, "o1")])
        await outbox.enqueue_at(pg, Receipt(id="r2"), soon, after=[("pgd-charge", "o1")])
        await outbox.enqueue_many(
            pg, [Receipt(id="r3"), (Receipt(id="r4"), 0.1)], after=[(Charge, "o1")]
        )
    # poll_interval 30 s: the children, held back from the parent's batch, go in the
    # batch right after it, not at the next poll
    async with OutboxRelay(service, postgres_url, schema=schema, poll_interval=30) as relay:
        await wait_for(lambda: all(("pgd-receipt", f"r{i}") in seen.runs for i in range(1, 5)))
        assert relay.batches == 2 and relay.relayed == 5
    for i in range(1, 5):
        (parent,) = seen.runs["pgd-receipt", f"r{i}"]
        assert (parent.status, parent.value) == ("ok", {"paid": "o1"})
    assert await outbox.pending(pg) == 0


async def test_the_policies_through_the_outbox(pg, schema, service, postgres_url, wait_for):
    outbox, seen = Outbox(schema), Seen()
    for t in (Charge, Receipt):
        service.add_handler(t, seen.handle)
    await service.start()
    async with pg.transaction():
        await outbox.enqueue_with_delay(pg, Charge(id="bad", fail=True), 0.2)
        for policy in ("fail", "run", "skip"):
            await outbox.enqueue_with_delay(
                pg, Receipt(id=policy), 0, after=[(Charge, "bad")], on_parent_failure=policy
            )
    async with OutboxRelay(service, postgres_url, schema=schema, poll_interval=30):
        await wait_for(lambda: ("pgd-receipt", "run") in seen.runs)
        assert seen.statuses(Receipt, "run") == ["failed"]

        async def fail_dead_skip_gone() -> bool:
            states = [(await service.inspect(Receipt, i)).state for i in ("fail", "skip")]
            return states == ["dead", "absent"]

        await wait_for(fail_dead_skip_gone)
        info = await service.inspect(Receipt, "fail")
        assert (info.last_error or "").startswith("ParentFailed: pgd-charge bad failed")
        assert ("pgd-receipt", "skip") not in seen.runs


async def test_a_child_waits_while_another_relay_holds_its_parents_row(
    pg, schema, service, postgres_url, postgres_conn_factory
):
    outbox = Outbox(schema)
    async with pg.transaction():
        await outbox.enqueue_with_delay(pg, Charge(id="held"), 3600)
        await outbox.enqueue_with_delay(pg, Receipt(id="waits"), 0, after=[(Charge, "held")])
        await outbox.enqueue_with_delay(pg, Receipt(id="free"), 3600)
    other = await postgres_conn_factory()
    relay = OutboxRelay(service, postgres_url, schema=schema, batch_size=10)
    try:
        async with other.transaction():  # another relay's batch has the parent's row
            await other.execute(
                f"SELECT id FROM \"{schema}\".outbox WHERE event_id = 'held' FOR UPDATE"
            )
            assert await relay.relay_once() == 1  # "free" only: the child waits
            assert (await service.inspect(Receipt, "waits")).state == "absent"
        await _drain(relay)
    finally:
        await relay.aclose()
    info = await service.inspect(Receipt, "waits")
    assert info.state == "waiting" and [p.status for p in info.parents] == ["pending"]


async def test_a_child_through_sqlalchemy(postgres_url, schema, service):
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(postgres_url.replace("postgresql://", "postgresql+asyncpg://"))
    outbox = Outbox(schema)
    try:
        async with AsyncSession(engine) as session, session.begin():
            await outbox.enqueue_with_delay(session, Charge(id="sa"), 3600)
            await outbox.enqueue_many(
                session, [Receipt(id="sa")], after=[(Charge, "sa")], on_parent_failure="skip"
            )
    finally:
        await engine.dispose()
    relay = OutboxRelay(service, postgres_url, schema=schema)
    try:
        await _drain(relay)
    finally:
        await relay.aclose()
    info = await service.inspect(Receipt, "sa")
    assert info.state == "waiting" and [p.status for p in info.parents] == ["pending"]


async def test_bad_input_raises_at_insert(pg, schema):
    outbox = Outbox(schema)
    bad: list[dict[str, Any]] = [
        {"after": [(Charge, "p")], "replace": True},
        {"after": []},
        {"after": [(Charge, "p")], "on_parent_failure": "maybe"},
        {"after": [(Charge, "")]},
    ]
    for options in bad:
        with pytest.raises(ValueError):
            await outbox.enqueue_with_delay(pg, Receipt(id="x"), 0, **options)
    for after in ([Charge], "pgd-charge", [(Charge, 1)], [(int, "p")]):
        with pytest.raises((TypeError, ValueError)):
            await outbox.enqueue_many(pg, [Receipt(id="x")], after=after)  # type: ignore[arg-type]
    assert await outbox.pending(pg) == 0
    # the table refuses what the API does not write
    with pytest.raises(asyncpg.CheckViolationError):
        await pg.execute(
            f'INSERT INTO "{schema}".outbox (event_type, event_id, envelope, due_ms, '
            "parent_types, parent_ids, on_parent_failure) "
            "VALUES ('t', 'i', '', 0, ARRAY['a', 'b'], ARRAY['x'], 'fail')"
        )


async def test_a_schema_of_migration_1_is_upgraded(pg, service, postgres_url, wait_for):
    name = f"t_{uuid.uuid4().hex[:10]}"
    first = migrations(name)[0]
    assert first.version == 1
    try:
        # what migrate() made before this version: migration 1, recorded
        async with pg.transaction():
            await pg.execute(f'CREATE SCHEMA "{name}"')
            await pg.execute(
                f'CREATE TABLE "{name}".schema_version (version integer PRIMARY KEY, '
                "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            await pg.execute(first.sql)
            await pg.execute(
                f'INSERT INTO "{name}".schema_version (version, name) VALUES (1, $1)', first.name
            )
        outbox = Outbox(name)
        await outbox.enqueue_with_delay(pg, Receipt(id="old"), 3600)  # writes migration 1's columns
        relay = OutboxRelay(service, postgres_url, schema=name)
        try:
            with pytest.raises(RuntimeError, match="migrate"):
                await relay.relay_once()
            assert await migrate(pg, name) == [m.version for m in migrations(name)[1:]]
            await outbox.enqueue_with_delay(pg, Receipt(id="new"), 0, after=[(Receipt, "old")])
            await _drain(relay)
        finally:
            await relay.aclose()
        assert relay.relayed == 2
        info = await service.inspect(Receipt, "new")
        assert info.state == "waiting" and [p.id for p in info.parents] == ["old"]
    finally:
        await pg.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


async def test_a_backlog_of_children_keeps_the_batch_bounded(pg, schema, service, postgres_url):
    # every child costs one more index probe for its parent: still about batch_size rows read
    outbox = Outbox(schema)
    async with pg.transaction():
        for start in range(0, 1000, 100):
            await outbox.enqueue_many(
                pg,
                [Receipt(id=f"c{i}") for i in range(start, start + 100)],
                3600,
                after=[(Charge, f"p{start}")],
            )
    await pg.execute(f'ANALYZE "{schema}".outbox')
    relay = OutboxRelay(service, postgres_url, schema=schema, batch_size=100)
    try:
        assert_bounded(await batch_plan(pg, relay), 100)
        assert await relay.relay_once() == 100
    finally:
        await relay.aclose()


@pytest.fixture
async def postgres_conn_factory(postgres_url: str):
    conns: list[asyncpg.Connection] = []

    async def connect() -> asyncpg.Connection:
        conns.append(await asyncpg.connect(postgres_url))
        return conns[-1]

    try:
        yield connect
    finally:
        await asyncio.gather(*(c.close() for c in conns))
