"""``Outbox``: enqueue an event if and only if the caller's transaction commits.

The event is encoded into its envelope right away (validation errors raise here, in the
request, not later in the relay) and inserted into ``<schema>.outbox`` through the caller's
connection, inside the caller's transaction. Nothing reaches Redis until that transaction
commits; then a :class:`~delayq.postgres.OutboxRelay` moves the row to Redis and deletes it.
A row may carry parents (``after=[...]``, docs/WORKFLOWS.md "Dependencies"): the relay then
enqueues it as a child, once the rows of its parents that came before it have gone to Redis.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from ..codec import Codec, Serializer
from ..events import Event, EventTypes, check_event, item_due
from ..operations.dependencies import ParentFailurePolicy, ParentRef, check_policy, parent_refs
from ..retry import delay_ms, due_unix_ms
from . import _db
from .schema import validate_schema

__all__ = ["Outbox"]


class Outbox:
    """Writes events into the outbox table through the caller's connection and transaction.

    ``schema`` names the schema :func:`~delayq.postgres.migrate` created the tables in.
    ``serializer`` and ``max_payload_bytes`` mean what they mean for an
    :class:`~delayq.EventService` (envelopes are encoded here, at insert time).

    The connection given to each call is an asyncpg connection or a SQLAlchemy
    ``AsyncConnection``/``AsyncSession``. Call it inside your transaction; outside one the
    insert commits at once (asyncpg) or opens a transaction you must commit (SQLAlchemy).

    Unlike :meth:`EventService.enqueue_with_delay`, these methods return nothing: whether
    an event with the same id already exists in Redis is only known when the relay sends
    the row, and the same dedup and ``replace`` rule applies then.

    ``after=[(ParentType, parent_id), ...]`` and ``on_parent_failure`` mean what they mean
    for :meth:`EventService.enqueue_with_delay` (docs/WORKFLOWS.md, "Dependencies"): the
    relay enqueues the row as a child, after every earlier row of its parents has reached
    Redis. A parent is a class or a wire name. Not with ``replace``. Needs the schema's
    migration 2 (:func:`~delayq.postgres.migrate`).
    """

    def __init__(
        self,
        schema: str = "delayq",
        *,
        serializer: Serializer = "msgpack",
        max_payload_bytes: int = 512 * 1024,
    ):
        self.schema = validate_schema(schema)
        self._codec = Codec(serializer, max_payload_bytes)
        rows = (
            "FROM unnest(CAST($1 AS text[]), CAST($2 AS text[]), CAST($3 AS bytea[]), "
            "CAST($4 AS bigint[])) AS u(t, i, e, d)"
        )
        table = f'"{self.schema}".outbox'
        # rows without parents write the columns of migration 1 only
        self._insert = (
            f"INSERT INTO {table} "
            "(event_type, event_id, envelope, due_ms, absolute, replace_existing) "
            f"SELECT t, i, e, d, CAST($5 AS boolean), CAST($6 AS boolean) {rows}"
        )
        self._insert_children = (
            f"INSERT INTO {table} (event_type, event_id, envelope, due_ms, absolute, "
            "parent_types, parent_ids, on_parent_failure) "
            "SELECT t, i, e, d, CAST($5 AS boolean), CAST($6 AS text[]), CAST($7 AS text[]), "
            f"CAST($8 AS text) {rows}"
        )
        # parents' classes -> wire names (nothing is registered anywhere)
        self._types = EventTypes(lambda name, partitions: None)

    def _row(self, event: Any, context: Mapping[str, str] | None) -> tuple[str, str, bytes]:
        check_event(event)
        return type(event).event_name, event.id, self._codec.encode(event, context)

    def _parents(
        self, after: Sequence[ParentRef] | None, policy: str, replace: bool
    ) -> list[tuple[str, str]] | None:
        """``after=[...]`` checked (None: no parents)."""
        if after is None:
            return None
        check_policy(policy)
        if replace:
            raise ValueError("after= does not go with replace")
        return parent_refs(after, self._types)

    async def _write(
        self,
        conn: Any,
        rows: list[tuple[str, str, bytes, int]],
        absolute: bool,
        replace: bool,
        parents: list[tuple[str, str]] | None = None,
        policy: str = "fail",
    ) -> None:
        if not rows:
            return
        columns = list(map(list, zip(*rows)))
        if parents is None:
            await _db.fetch(conn, self._insert, *columns, absolute, bool(replace))
            return
        types, ids = [t for t, _ in parents], [i for _, i in parents]
        await _db.fetch(conn, self._insert_children, *columns, absolute, types, ids, policy)

    async def enqueue_with_delay(
        self,
        conn: Any,
        event: Event,
        delay: float | timedelta = 0,
        *,
        context: Mapping[str, str] | None = None,
        replace: bool = False,
        after: Sequence[ParentRef] | None = None,
        on_parent_failure: ParentFailurePolicy = "fail",
    ) -> None:
        """Insert ``event`` into the outbox, due ``delay`` (a timedelta or seconds) after relay.

        The delay counts from when the relay moves the row to Redis: the commit plus the
        relay's lag, milliseconds while a relay runs (see docs/POSTGRES.md). Use
        :meth:`enqueue_at` for a deadline that must not move. ``after`` and
        ``on_parent_failure``: see the class.
        """
        ms = delay_ms(delay)
        parents = self._parents(after, on_parent_failure, replace)
        row = (*self._row(event, context), ms)
        await self._write(conn, [row], False, replace, parents, on_parent_failure)

    async def enqueue_at(
        self,
        conn: Any,
        event: Event,
        when: datetime,
        *,
        context: Mapping[str, str] | None = None,
        replace: bool = False,
        after: Sequence[ParentRef] | None = None,
        on_parent_failure: ParentFailurePolicy = "fail",
    ) -> None:
        """Insert ``event`` into the outbox, due at ``when`` (timezone-aware; past means now).

        With ``after``, due at the later of ``when`` and its last parent's completion.
        """
        ms = due_unix_ms(when)
        parents = self._parents(after, on_parent_failure, replace)
        row = (*self._row(event, context), ms)
        await self._write(conn, [row], True, replace, parents, on_parent_failure)

    async def enqueue_many(
        self,
        conn: Any,
        events: Iterable[Event | tuple[Event, float | timedelta]],
        delay: float | timedelta = 0,
        *,
        context: Mapping[str, str] | None = None,
        replace: bool = False,
        after: Sequence[ParentRef] | None = None,
        on_parent_failure: ParentFailurePolicy = "fail",
    ) -> int:
        """Insert many events with one statement; return how many.

        Items are events (due ``delay`` after relay) or ``(event, delay)`` pairs. All are
        validated and encoded before anything is written. With ``after``, every event
        waits for those parents.
        """
        default_ms = delay_ms(delay)
        parents = self._parents(after, on_parent_failure, replace)
        rows = []
        for item in events:
            event, ms = item_due(item, default_ms)
            rows.append((*self._row(event, context), ms))
        await self._write(conn, rows, False, replace, parents, on_parent_failure)
        return len(rows)

    async def pending(self, conn: Any) -> int:
        """How many committed rows wait for a relay (as seen by ``conn``'s transaction)."""
        rows = await _db.fetch(conn, f'SELECT count(*) FROM "{self.schema}".outbox')
        return int(rows[0][0])
