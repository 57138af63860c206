"""An OS process for the PostgreSQL tests and the soak: an outbox relay, or a handling worker.

    python pgworker.py relay  --db URL --redis URL --prefix P --schema S [--hang-after-send FILE]
                              [--app-name NAME] [--statement-timeout S|none]
                              [--idle-in-transaction-timeout S|none] [--client-check-interval S|none]
    python pgworker.py worker --db URL --redis URL --prefix P --schema S [--hang-after-commit FILE]
                                                                 [--post-commit-ms MS]

``relay`` runs an :class:`OutboxRelay`; with ``--hang-after-send`` its first batch is sent to
Redis, then FILE is written and the process hangs before deleting the rows (a test SIGKILLs
it there). ``worker`` handles :class:`OrderCheck` through the inbox: in one transaction it
records the delivery and, the first time, inserts an ``effects`` row; with
``--hang-after-commit`` the first delivery it handles writes FILE after the commit and hangs
before returning (so before the ack). Both exit cleanly on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import asyncpg
from pgkit import OrderCheck

from delayq import EventService, current_delivery, fixed
from delayq.postgres import Inbox, OutboxRelay


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("mode", choices=["relay", "worker"])
    p.add_argument("--db", required=True)
    p.add_argument("--redis", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--schema", required=True)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--visibility", type=float, default=2.0)
    p.add_argument("--hang-after-send")
    p.add_argument("--hang-after-commit")
    p.add_argument("--post-commit-ms", type=float, default=0.0, help="work after the commit")
    p.add_argument("--app-name", help="the relay's application_name in pg_stat_activity")
    for name in ("statement-timeout", "idle-in-transaction-timeout", "client-check-interval"):
        p.add_argument(
            f"--{name}", type=seconds, default=argparse.SUPPRESS, help="seconds, or 'none'"
        )
    return p.parse_args()


def seconds(text: str) -> float | None:
    """A relay timeout option: seconds, or 'none'."""
    return None if text == "none" else float(text)


class HangingRelay(OutboxRelay):
    """Sends its first batch to Redis, then hangs inside the batch's transaction."""

    marker: str

    async def _send(self, rows: list[Any]) -> int:
        kept = await super()._send(rows)
        Path(self.marker).write_text(str(len(rows)))  # noqa: ASYNC240
        await asyncio.Event().wait()
        return kept


async def relay(args: argparse.Namespace, stop: asyncio.Event) -> None:
    service = EventService.from_url(args.redis, prefix=args.prefix, enable_scheduling=False)
    cls = HangingRelay if args.hang_after_send else OutboxRelay
    options: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("statement_timeout", "idle_in_transaction_timeout", "client_check_interval")
        if hasattr(args, name)  # else the relay's default
    }
    if args.app_name:
        options["connect_kwargs"] = {"server_settings": {"application_name": args.app_name}}
    relay = cls(service, args.db, schema=args.schema, batch_size=args.batch_size,
                poll_interval=0.2, **options)  # fmt: skip
    if args.hang_after_send:
        relay.marker = args.hang_after_send  # type: ignore[attr-defined]
    async with service, relay:
        await stop.wait()


async def worker(args: argparse.Namespace, stop: asyncio.Event) -> None:
    pool = await asyncpg.create_pool(args.db, min_size=1, max_size=args.concurrency + 1)
    inbox = Inbox(args.schema)
    pid = os.getpid()
    hang = args.hang_after_commit

    async def check(event: OrderCheck) -> None:
        nonlocal hang
        delivery = current_delivery()
        assert delivery is not None
        async with pool.acquire() as conn:
            async with conn.transaction(), inbox.once(conn) as first:
                if first:
                    await conn.execute(
                        f'INSERT INTO "{args.schema}".effects (order_id, version, pid) '
                        "VALUES ($1, $2, $3)",
                        event.order_id, delivery.version, pid,
                    )  # fmt: skip
            await conn.execute(
                f'INSERT INTO "{args.schema}".runs (order_id, first, pid) VALUES ($1, $2, $3)',
                event.order_id, first, pid,
            )  # fmt: skip
        if args.post_commit_ms:
            # say, a notification sent after the commit: a kill here means a redelivery
            await asyncio.sleep(args.post_commit_ms / 1000)
        if hang:
            Path(hang).write_text(event.id)  # noqa: ASYNC240
            hang = None
            await asyncio.Event().wait()

    service = EventService.from_url(
        args.redis, prefix=args.prefix, visibility_timeout=args.visibility,
        retry_attempts=20, retry_backoff=fixed(0.2), scheduling_interval=0.2,
        lock_timeout=2.0, shutdown_grace=2.0,
    )  # fmt: skip
    service.add_handler(OrderCheck, check, concurrency=args.concurrency)
    try:
        async with service:
            await stop.wait()
    finally:
        await pool.close()


async def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await (relay if args.mode == "relay" else worker)(args, stop)


if __name__ == "__main__":
    asyncio.run(main())
