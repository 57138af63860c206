"""``delayq outbox-migrate`` and ``delayq outbox-relay`` on a real PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid

import asyncpg
from pgkit import OrderCheck

from delayq import EventService
from delayq.postgres import Outbox


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "delayq", *args]


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


async def test_migrate_then_relay_from_the_shell(postgres_url, redis_url, prefix, wait_for):
    schema = f"c_{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "DATABASE_URL": postgres_url, "REDIS_URL": redis_url}
    done = await asyncio.to_thread(_run, _cli("outbox-migrate", "--schema", schema), env)
    assert done.returncode == 0, done.stderr
    again = await asyncio.to_thread(_run, _cli("outbox-migrate", "--schema", schema), env)
    assert again.returncode == 0 and "up to date" in again.stdout, again.stdout
    relay = _spawn(
        _cli("outbox-relay", "--schema", schema, "--prefix", prefix, "--poll-interval", "0.2",
             "--statement-timeout", "20", "--idle-timeout", "0"),
        env,
    )  # fmt: skip
    checker = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    conn = await asyncpg.connect(postgres_url)
    try:
        outbox = Outbox(schema)
        async with conn.transaction():
            await outbox.enqueue_with_delay(conn, OrderCheck(id="o-1", order_id=1), 3600)

        async def relayed() -> bool:
            return (await checker.stats_for(OrderCheck)).scheduled == 1

        await wait_for(relayed, timeout=20, message=f"relay log: {relay.stderr}")
        relay.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(relay.wait, 30)
        assert code == 0, relay.stderr.read() if relay.stderr else ""
    finally:
        relay.kill()
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
        await checker.aclose()


def test_relay_timeouts_are_checked(redis_url):
    env = {**os.environ, "DATABASE_URL": "postgresql://127.0.0.1:1/none"}
    for flag, value in (("--statement-timeout", "0.0001"), ("--idle-timeout", "-1"),
                        ("--client-check-interval", "90000")):  # fmt: skip
        done = _run(_cli("outbox-relay", "--redis-url", redis_url, flag, value), env)
        assert done.returncode == 2, (flag, done.stderr)
        assert flag in done.stderr and "Traceback" not in done.stderr


def test_relay_needs_a_database_url(redis_url):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run(
        _cli("outbox-relay", "--redis-url", redis_url), env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--database-url" in done.stderr


async def test_service_runs_the_relay_with_the_outbox_option(
    postgres_url, redis_url, prefix, schema, pg, wait_for
):
    from delayq.postgres import outbox_relay

    seen: list[str] = []

    async def handle(event: OrderCheck) -> None:
        seen.append(event.id)

    service = EventService.from_url(
        redis_url,
        prefix=prefix,
        outbox=outbox_relay(postgres_url, schema=schema, poll_interval=0.2),
    )
    service.add_handler(OrderCheck, handle)
    async with service:
        async with pg.transaction():
            await Outbox(schema).enqueue_with_delay(pg, OrderCheck(id="o-2", order_id=2), 0)
        await wait_for(lambda: seen == ["o-2"], timeout=20)
    assert await pg.fetchval(f'SELECT count(*) FROM "{schema}".outbox') == 0


def test_outbox_option_is_checked():
    import pytest

    from delayq.postgres import outbox_relay

    with pytest.raises(TypeError, match="unknown OutboxRelay options"):
        outbox_relay("postgresql://x/y", batchsize=3)
    with pytest.raises(TypeError, match="outbox must be"):
        EventService.from_url("redis://localhost:1/0", outbox="postgresql://x/y")
