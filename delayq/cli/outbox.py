"""``delayq outbox-relay`` and ``delayq outbox-migrate``: the PostgreSQL outbox from the shell.

Both need the ``postgres`` extra (asyncpg); see docs/POSTGRES.md. The relay runs until
SIGTERM or SIGINT, then finishes the batch under way and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Annotated, Any

import typer

from .logs import LEVELS, setup_logging
from .ops import Connection, with_connection
from .output import console, fail

__all__ = ["outbox_migrate", "outbox_relay", "register"]

DatabaseUrl = Annotated[
    str,
    typer.Option(
        "--database-url",
        envvar="DATABASE_URL",
        help="PostgreSQL holding the outbox (postgresql://user:pass@host/db).",
        rich_help_panel="Connection",
        show_default=False,
    ),
]
Schema = Annotated[
    str,
    typer.Option("--schema", help="Schema of the outbox and inbox tables (their migration's)."),
]


def _postgres() -> Any:
    try:
        from .. import postgres
    except ImportError as exc:
        fail(f"this command needs the postgres extra (pip install 'delayq[postgres]'): {exc}")
    return postgres


def outbox_migrate(database_url: DatabaseUrl = "", schema: Schema = "delayq") -> None:
    """Create (or bring up to date) the outbox and inbox tables in SCHEMA; safe to rerun."""
    if not database_url:
        fail("--database-url (or DATABASE_URL) is required")
    postgres = _postgres()
    try:
        applied = asyncio.run(postgres.migrate(database_url, schema))
    except Exception as exc:
        fail(f"migration failed: {type(exc).__name__}: {exc}")
    console.print(f"applied migrations: {applied or 'none (up to date)'}")


@with_connection
def outbox_relay(
    database_url: DatabaseUrl = "",
    conn: Connection = Connection(),
    schema: Schema = "delayq",
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=10_000, help="Most rows per transaction.")
    ] = 500,
    poll_interval: Annotated[
        float,
        typer.Option(
            "--poll-interval",
            min=0.01,
            help="Longest sleep without a NOTIFY, in seconds (the fallback poll).",
        ),
    ] = 1.0,
    no_listen: Annotated[
        bool,
        typer.Option(
            "--no-listen",
            help="Poll only, no LISTEN (behind a pooler in transaction mode).",
        ),
    ] = False,
    statement_timeout: Annotated[
        float,
        typer.Option(
            "--statement-timeout",
            min=0,
            max=86_400,
            help="Longest one statement of a batch may run, in seconds (0: the server's setting).",
        ),
    ] = 30.0,
    idle_timeout: Annotated[
        float,
        typer.Option(
            "--idle-timeout",
            min=0,
            max=86_400,
            help="Longest a batch's transaction may wait on this relay before PostgreSQL "
            "ends the session and frees its rows, in seconds (0: the server's setting).",
        ),
    ] = 60.0,
    client_check_interval: Annotated[
        float,
        typer.Option(
            "--client-check-interval",
            min=0,
            max=86_400,
            help="How often PostgreSQL 14+ checks mid-statement that this relay is still "
            "connected, in seconds (0: the server's setting).",
        ),
    ] = 1.0,
    log_level: Annotated[
        str, typer.Option("--log-level", help="debug, info, warning or error.")
    ] = "info",
) -> None:
    """Move committed outbox rows to Redis until SIGTERM or SIGINT.

    Several relays may run at once (rows are taken with FOR UPDATE SKIP LOCKED). Each batch is one transaction: rows are deleted only once Redis has them, and a row sent twice after a crash is absorbed by the (type, id) dedup.
    """
    if not database_url:
        fail("--database-url (or DATABASE_URL) is required")
    if log_level.lower() not in LEVELS:
        fail(f"--log-level must be one of {', '.join(LEVELS)}, not {log_level!r}")
    for flag, value in (
        ("--statement-timeout", statement_timeout),
        ("--idle-timeout", idle_timeout),
        ("--client-check-interval", client_check_interval),
    ):
        if 0 < value < 0.001:
            fail(f"{flag} must be 0 (the server's setting) or at least 0.001 seconds")
    setup_logging(log_level.lower(), "text")
    postgres = _postgres()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with conn.connect() as service:
            relay = postgres.OutboxRelay(
                service,
                database_url,
                schema=schema,
                batch_size=batch_size,
                poll_interval=poll_interval,
                listen=not no_listen,
                statement_timeout=statement_timeout or None,
                idle_in_transaction_timeout=idle_timeout or None,
                client_check_interval=client_check_interval or None,
            )
            async with relay:
                logging.getLogger("delayq.cli.outbox").info(
                    "relaying outbox %r to prefix %r", schema, conn.prefix
                )
                await stop.wait()

    asyncio.run(main())


def register(app: typer.Typer) -> None:
    """Add the outbox commands to ``app``."""
    app.command("outbox-migrate", rich_help_panel="PostgreSQL outbox")(outbox_migrate)
    app.command("outbox-relay", rich_help_panel="PostgreSQL outbox")(outbox_relay)
