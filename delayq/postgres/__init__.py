"""Exactly-once effects with PostgreSQL: a transactional outbox and an inbox (``delayq[postgres]``).

* :class:`Outbox` — ``await outbox.enqueue_with_delay(conn, event, delay)`` inserts the event
  into an outbox table inside your transaction: it reaches Redis if and only if the
  transaction commits.
* :class:`OutboxRelay` — moves committed rows to Redis (batched, ``FOR UPDATE SKIP
  LOCKED``, woken by ``LISTEN/NOTIFY``, polling as a fallback) and deletes them;
  ``EventService(..., outbox=outbox_relay(dsn))`` runs one inside the service, and
  ``delayq outbox-relay`` from the shell.
* :class:`Inbox` — ``async with inbox.once(conn) as first:`` inside a handler, so its database
  work happens once across redeliveries.
* :func:`migrate` / :func:`schema_sql` — the tables (SQL shipped in the package).

Connections are asyncpg connections, or SQLAlchemy ``AsyncConnection``/``AsyncSession``
objects. The guide is docs/POSTGRES.md.
"""

from .inbox import Inbox, prune_inbox
from .outbox import Outbox
from .relay import OutboxRelay, outbox_relay
from .schema import Migration, channel_name, migrate, migrations, schema_sql, validate_schema

__all__ = [
    "Inbox",
    "Migration",
    "Outbox",
    "OutboxRelay",
    "channel_name",
    "migrate",
    "migrations",
    "outbox_relay",
    "prune_inbox",
    "schema_sql",
    "validate_schema",
]
