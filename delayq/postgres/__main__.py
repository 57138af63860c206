"""``python -m delayq.postgres``: apply the migration, print its SQL, or run an outbox relay.

    python -m delayq.postgres migrate --database-url URL [--schema delayq]
    python -m delayq.postgres sql [--schema delayq]
    python -m delayq.postgres relay --database-url URL --redis-url URL [--prefix delayq]
                                    [--schema delayq] [--batch-size 500] [--poll-interval 1]

``--database-url`` defaults to ``$DATABASE_URL`` and ``--redis-url`` to ``$REDIS_URL``. The
relay runs until SIGINT or SIGTERM, then finishes its batch and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from ..service import EventService
from .relay import OutboxRelay
from .schema import migrate, schema_sql


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m delayq.postgres",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("migrate", "sql", "relay"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--schema", default="delayq")
        if name != "sql":
            cmd.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
        if name == "relay":
            cmd.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
            cmd.add_argument("--prefix", default="delayq")
            cmd.add_argument("--batch-size", type=int, default=500)
            cmd.add_argument("--poll-interval", type=float, default=1.0)
    return parser


async def _relay(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    service = EventService.from_url(args.redis_url, prefix=args.prefix, enable_scheduling=False)
    async with (
        service,
        OutboxRelay(
            service,
            args.database_url,
            schema=args.schema,
            batch_size=args.batch_size,
            poll_interval=args.poll_interval,
        ),
    ):
        logging.getLogger("delayq.postgres").info("relaying outbox %r", args.schema)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m delayq.postgres``."""
    args = _parser().parse_args(argv)
    if args.command == "sql":
        sys.stdout.write(schema_sql(args.schema))
        return 0
    if not args.database_url:
        sys.stderr.write("--database-url (or DATABASE_URL) is required\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.command == "migrate":
        applied = asyncio.run(migrate(args.database_url, args.schema))
        sys.stdout.write(f"applied versions: {applied or 'none (up to date)'}\n")
        return 0
    if not args.redis_url:
        sys.stderr.write("--redis-url (or REDIS_URL) is required\n")
        return 2
    asyncio.run(_relay(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
