"""``Inbox``: a handler's database work happens once, however often its event is delivered.

Delivery is at least once: a handler that committed its work and died before the ack runs
again. The inbox records each delivery's identity — event type, id and
:attr:`~delayq.Delivery.version` — in ``<schema>.inbox`` inside the handler's own
transaction. The row commits together with the handler's writes, or not at all, so on a
redelivery the row is there exactly when the work was done::

    async def check_payment(event: PaymentCheck) -> None:
        async with pool.acquire() as conn, conn.transaction():
            async with inbox.once(conn) as first:
                if first:
                    await conn.execute("UPDATE orders SET checked = true WHERE id = $1", ...)
        # returning normally acks the event, whether the work ran now or before

Two deliveries of one version running at once (a lease lost while the handler still ran)
serialise on the row's primary key: the second waits for the first transaction and then
sees its row (or, if it rolled back, does the work itself).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from ..context import Delivery, current_delivery
from ..retry import delay_seconds
from . import _db
from .schema import validate_schema

__all__ = ["Inbox", "prune_inbox"]

_PRUNE_CHUNK = 5000


class Inbox:
    """Idempotent handlers: record each delivery in ``<schema>.inbox`` in the handler's transaction.

    Connections are asyncpg connections or SQLAlchemy ``AsyncConnection``/``AsyncSession``
    objects, as for the :class:`~delayq.postgres.Outbox`.
    """

    def __init__(self, schema: str = "delayq"):
        self.schema = validate_schema(schema)
        table = f'"{self.schema}".inbox'
        self._claim = (
            f"INSERT INTO {table} (event_type, event_id, version) VALUES ($1, $2, $3) "
            "ON CONFLICT DO NOTHING RETURNING true"
        )
        self._seen = (
            f"SELECT true FROM {table} WHERE event_type = $1 AND event_id = $2 AND version = $3"
        )

    @staticmethod
    def _delivery(delivery: Delivery | None) -> Delivery:
        found = delivery if delivery is not None else current_delivery()
        if found is None:
            raise RuntimeError(
                "no delivery: call the inbox inside a delayq handler, or pass delivery="
            )
        return found

    async def claim(self, conn: Any, delivery: Delivery | None = None) -> bool:
        """Record the delivery in the inbox; True the first time, False when already recorded.

        Call it inside the transaction that does the handler's work: the record commits or
        rolls back with that work. ``delivery`` defaults to the one being handled.
        """
        d = self._delivery(delivery)
        rows = await _db.fetch(conn, self._claim, d.event_type, d.id, d.version)
        return bool(rows)

    @asynccontextmanager
    async def once(self, conn: Any, delivery: Delivery | None = None) -> AsyncIterator[bool]:
        """``async with inbox.once(conn) as first:`` — do the work only when ``first``.

        Joins the transaction open on ``conn``, or opens one for the block (committed when
        the block ends, rolled back if it raises). ``first`` is False when this version of
        the event was already handled by a committed transaction: skip the work and return
        normally, and the event is acked.
        """
        if _db.in_transaction(conn):
            yield await self.claim(conn, delivery)
            return
        async with _db.transaction(conn):
            yield await self.claim(conn, delivery)

    async def seen(self, conn: Any, delivery: Delivery | None = None) -> bool:
        """True when this version of the event is recorded as handled (reads, writes nothing)."""
        d = self._delivery(delivery)
        return bool(await _db.fetch(conn, self._seen, d.event_type, d.id, d.version))

    async def prune(self, conn: Any, older_than: float | timedelta = timedelta(days=7)) -> int:
        """Delete rows recorded more than ``older_than`` ago; return how many."""
        return await prune_inbox(conn, older_than, self.schema)


async def prune_inbox(conn: Any, older_than: float | timedelta, schema: str = "delayq") -> int:
    """Delete inbox rows of ``schema`` older than ``older_than``, in chunks; return how many.

    Keep ``older_than`` well above ``visibility_timeout`` plus the whole retry schedule: a
    version pruned while it can still be redelivered would run again.
    """
    seconds = delay_seconds(older_than, "older_than")
    table = f'"{validate_schema(schema)}".inbox'
    sql = (
        # ANY(ARRAY(...)) runs the LIMIT subquery once, as the relay's batch does (a plain
        # IN can become a join that re-runs it per row); the index on handled_at serves it
        f"WITH gone AS (DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} "
        "WHERE handled_at < now() - make_interval(secs => CAST($1 AS double precision)) "
        f"ORDER BY handled_at LIMIT {_PRUNE_CHUNK})) RETURNING 1) SELECT count(*) FROM gone"
    )
    total = 0
    while True:
        rows = await _db.fetch(conn, sql, seconds)
        count = int(rows[0][0])
        total += count
        if count < _PRUNE_CHUNK:
            return total
