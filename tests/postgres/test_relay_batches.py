"""The relay's batch stays a batch whatever PostgreSQL's statistics say (issue 26, part 1).

An outbox spends most of its life drained: one live row over many pages of dead ones. When
autovacuum analyzes it then, the planner believes the table holds about one row, and a batch
query that leaves it free to pick its plan can pick one whose cost grows with the backlog
(once it re-ran the ``LIMIT`` subquery per row and deleted the whole backlog in one
transaction, ignoring ``batch_size``). Each test here first gives the table exactly those
statistics, with autovacuum off on it so that nothing else analyzes it meanwhile.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Awaitable, Iterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from pgkit import spawn

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


async def drained_and_analyzed(pg: asyncpg.Connection, schema: str, relay: OutboxRelay) -> None:
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


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


async def batch_plan(pg: asyncpg.Connection, relay: OutboxRelay) -> list[dict[str, Any]]:
    """Run the relay's batch statement under EXPLAIN ANALYZE, as the relay runs it, and roll
    it back; return the plan's nodes."""
    await relay._connection()  # the batch's settings depend on the server
    await pg.execute(relay._begin)
    try:
        text = await pg.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + relay._take, 100)
    finally:
        await pg.execute("ROLLBACK")
    return list(plan_nodes(json.loads(text)[0]["Plan"]))


def assert_bounded(nodes: list[dict[str, Any]], batch: int) -> None:
    """The plan walks the primary key in order and reads a few rows per row it takes."""
    kinds = [n["Node Type"] for n in nodes]
    assert "Seq Scan" not in kinds and "Sort" not in kinds, kinds
    assert kinds[0] == "ModifyTable" and nodes[0]["Actual Rows"] == batch
    # every row any scan produced or read and rejected, over all its executions
    read = sum(
        (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
        for n in nodes
        if "Relation Name" in n
    )
    assert read <= 5 * batch, [
        (k, n["Actual Rows"], n["Actual Loops"]) for k, n in zip(kinds, nodes)
    ]


@pytest.mark.parametrize("backlog", [1_000, 10_000, pytest.param(100_000, marks=pytest.mark.slow)])
async def test_batch_reads_about_batch_size_rows_at_any_backlog(
    pg, schema, service, postgres_url, backlog
):
    relay = OutboxRelay(service, postgres_url, schema=schema, batch_size=100)
    try:
        await drained_and_analyzed(pg, schema, relay)
        await add_rows(pg, schema, backlog, "new")
        # statistics of a one-row table, a backlog of thousands
        assert_bounded(await batch_plan(pg, relay), 100)
        assert await relay.relay_once() == 100
        # and with statistics that know the backlog
        await pg.execute(f'ANALYZE "{schema}".outbox')
        assert_bounded(await batch_plan(pg, relay), 100)
        assert await relay.relay_once() == 100
        if backlog <= 10_000:
            while moved := await relay.relay_once():
                assert moved <= 100
            assert relay.relayed == 3001 + backlog
    finally:
        await relay.aclose()


async def test_batch_transaction_settings(pg, schema, service, postgres_url):
    seen: dict[str, str] = {}
    check = pg.get_server_version().major >= 14  # client_connection_check_interval

    class Watching(OutboxRelay):
        async def _send(self, rows: list[Any]) -> int:
            assert self._conn is not None
            for name in (
                "statement_timeout", "idle_in_transaction_session_timeout",
                "client_connection_check_interval", "enable_seqscan", "enable_sort",
            ):  # fmt: skip
                if check or name != "client_connection_check_interval":
                    seen[name] = await self._conn.fetchval(f"SHOW {name}")
            return await super()._send(rows)

    await add_rows(pg, schema, 1, "s")
    relay = Watching(service, postgres_url, schema=schema)
    try:
        assert await relay.relay_once() == 1
        # only the batch's transaction has them (SET LOCAL): a pooler carries nothing over
        assert relay._conn is not None
        assert await relay._conn.fetchval("SHOW enable_seqscan") == "on"
    finally:
        await relay.aclose()
    assert seen == {
        "statement_timeout": "30s",
        "idle_in_transaction_session_timeout": "1min",
        "enable_seqscan": "off",
        "enable_sort": "off",
        **({"client_connection_check_interval": "1s"} if check else {}),
    }
    await add_rows(pg, schema, 1, "t")
    seen.clear()
    relay = Watching(
        service, postgres_url, schema=schema, statement_timeout=timedelta(milliseconds=2500),
        idle_in_transaction_timeout=None, client_check_interval=0.25,
    )  # fmt: skip
    server = await pg.fetchval("SHOW idle_in_transaction_session_timeout")
    try:
        assert await relay.relay_once() == 1
    finally:
        await relay.aclose()
    assert seen["statement_timeout"] == "2500ms"
    assert seen["idle_in_transaction_session_timeout"] == server
    assert seen.get("client_connection_check_interval", "250ms") == "250ms"
    for bad in (0, -1, 86_401, "1"):
        with pytest.raises((ValueError, TypeError)):
            OutboxRelay(service, postgres_url, statement_timeout=bad)  # type: ignore[arg-type]


async def test_statement_timeout_ends_a_stuck_batch(pg, schema, service, postgres_url):
    await add_rows(pg, schema, 3, "s")
    relay = OutboxRelay(service, postgres_url, schema=schema, statement_timeout=0.2)
    try:
        async with pg.transaction():
            # the batch's DELETE waits for this lock until its statement_timeout
            await pg.execute(f'LOCK TABLE "{schema}".outbox IN ACCESS EXCLUSIVE MODE')
            with pytest.raises(asyncpg.QueryCanceledError):
                await relay.relay_once()
        assert await relay.relay_once() == 3  # the next batch goes through
    finally:
        await relay.aclose()


async def backends(pg: asyncpg.Connection, app: str) -> list[str]:
    rows = await pg.fetch(
        "SELECT coalesce(wait_event_type, '') FROM pg_stat_activity WHERE application_name = $1",
        app,
    )
    return [r[0] for r in rows]


async def test_killed_relays_statement_stops_within_the_check_interval(
    pg, schema, postgres_url, redis_url, prefix, tmp_path, wait_for
):
    if pg.get_server_version().major < 14:
        pytest.skip("client_connection_check_interval came in PostgreSQL 14")
    await add_rows(pg, schema, 5, "k")
    common = ["--db", postgres_url, "--redis", redis_url, "--prefix", prefix, "--schema", schema]
    procs = {}
    # (pg_stat_activity is read on pg, outside any transaction: one would freeze its view)
    locker = await asyncpg.connect(postgres_url)
    try:
        await locker.execute("BEGIN")
        await locker.execute(f'LOCK TABLE "{schema}".outbox IN ACCESS EXCLUSIVE MODE')
        for app, interval in (("relay-checked", "0.2"), ("relay-unchecked", "none")):
            procs[app] = spawn(
                str(tmp_path / f"{app}.log"), "relay", *common, "--app-name", app,
                "--statement-timeout", "none", "--client-check-interval", interval,
            )  # fmt: skip
        for app in procs:  # each relay's batch waits for the table lock
            await wait_for(
                lambda app=app: _has(backends(pg, app), "Lock"), timeout=30,
                message=f"{app}'s batch waiting for the lock",
            )  # fmt: skip
        for proc in procs.values():
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        # PostgreSQL notices the checked relay is gone, ends its statement, frees its rows
        await wait_for(
            lambda: _empty(backends(pg, "relay-checked")), timeout=10,
            message="the killed relay's backend to end",
        )  # fmt: skip
        # without the check, the dead relay's statement waits on (until it would reply)
        assert await backends(pg, "relay-unchecked") == ["Lock"]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await locker.close()
    await wait_for(lambda: _empty(backends(pg, "relay-unchecked")), timeout=10)
    assert await Outbox(schema).pending(pg) == 5  # nothing was committed


async def _has(pending: Awaitable[list[str]], value: str) -> bool:
    return value in await pending


async def _empty(pending: Awaitable[list[str]]) -> bool:
    return not await pending


async def test_frozen_relays_rows_come_back_after_idle_timeout(
    pg, schema, service, postgres_url, redis_url, prefix, tmp_path, wait_for
):
    total = 250
    await add_rows(pg, schema, total, "f")
    marker = tmp_path / "sent"
    proc = spawn(
        str(tmp_path / "relay.log"), "relay", "--db", postgres_url, "--redis", redis_url,
        "--prefix", prefix, "--schema", schema, "--batch-size", "100",
        "--hang-after-send", str(marker), "--idle-in-transaction-timeout", "0.5",
        "--app-name", "relay-frozen",
    )  # fmt: skip
    try:
        await wait_for(marker.exists, timeout=30, message="the relay's first batch")
        # the relay hangs inside its batch's transaction (as if SIGSTOPped): PostgreSQL ends
        # its session after idle_in_transaction_timeout, and the batch's rows are free again
        async with OutboxRelay(
            service, postgres_url, schema=schema, batch_size=100, poll_interval=0.05
        ) as relay:
            await wait_for(lambda: relay.relayed >= total, timeout=30)
        assert relay.relayed == total and relay.kept == 100
        # its session is gone (what is left is its listening connection)
        assert (
            await pg.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'relay-frozen' "
                "AND xact_start IS NOT NULL"
            )
            == 0
        )
        assert await Outbox(schema).pending(pg) == 0
        assert (await service.stats_for(Job)).scheduled == total
    finally:
        proc.kill()
        proc.wait()
