"""What one relay batch is in PostgreSQL: the statement that takes its rows, the settings of
its transaction, and the timeout options that bound it (:class:`~delayq.postgres.OutboxRelay`
runs them).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import asyncpg

from ..retry import delay_seconds

__all__ = ["begin_statement", "group_rows", "has_client_check", "take_statement", "timeout_option"]

log = logging.getLogger("delayq.postgres.relay")

# Off for each batch's transaction, so the plan of take_statement() is the walk along the
# primary key whatever the statistics say.
PLAN_SETTINGS = ("enable_seqscan = off", "enable_sort = off", "jit = off")


def take_statement(schema: str) -> str:
    """The statement that takes a batch: ``$1`` rows at most, oldest first, returned.

    The rows are deleted (and stay locked) until the transaction commits after Redis has
    them; a crash before that rolls the delete back. A row waits while an earlier row of
    the same event is still there (locked by another relay, say), so one event's rows
    reach Redis in insertion order; and a row with parents (``after=``) waits while an
    earlier row of one of its parents is still there, so a child reaches Redis after its
    parents' rows (and links their events, pending, rather than finding them "missing").
    The last column says whether any row with parents is in the table: the relay then
    runs its next batch at once (such a row may wait only for this batch's commit).

    The plan must not depend on statistics: a drained outbox, analyzed, looks like a
    one-row table however big it grows before the next ANALYZE. So ARRAY(...) runs the
    LIMIT once (an IN (subquery) could be joined and re-run per row, deleting the whole
    backlog); the "earliest row of its event" test is a scalar subquery, always one index
    probe per candidate (NOT EXISTS can become an anti-join that scans the whole event
    index per candidate); the parents' test is the same probe for each parent (never a join, which
    could read every earlier row of the table per candidate), behind a CASE so that a
    row without parents never runs it;
    and the batch's transaction turns off sequential scans and sorts
    (:data:`PLAN_SETTINGS`), which leaves the walk along the primary key in id order:
    about ``batch_size`` rows read, plus those skipped (locked, or waiting for an earlier
    row of their event or of a parent). The last column is one probe of the partial index
    of rows with parents, empty while nobody uses ``after=``.
    """
    table = f'"{schema}".outbox'
    return (
        f"DELETE FROM {table} WHERE id = ANY(ARRAY(SELECT id FROM {table} o WHERE o.id = ("
        f"SELECT min(p.id) FROM {table} p WHERE p.event_type = o.event_type "
        "AND p.event_id = o.event_id) "
        "AND CASE WHEN o.parent_ids IS NULL THEN true ELSE ("
        "SELECT a.i FROM unnest(o.parent_types, o.parent_ids) AS a(t, i) WHERE ("
        f"SELECT min(p.id) FROM {table} p WHERE p.event_type = a.t AND p.event_id = a.i"
        ") < o.id LIMIT 1) IS NULL END "
        "ORDER BY o.id LIMIT $1 FOR UPDATE SKIP LOCKED)) "
        "RETURNING id, event_type, event_id, envelope, due_ms, absolute, replace_existing, "
        "parent_types, parent_ids, on_parent_failure, "
        f"(SELECT EXISTS (SELECT FROM {table} c WHERE c.parent_ids IS NOT NULL))"
    )


def begin_statement(
    statement_timeout: float | None,
    idle_in_transaction_timeout: float | None,
    client_check_interval: float | None,
) -> str:
    """Opens a batch's transaction with its settings, in one round trip; per transaction
    (SET LOCAL), so a pooler in transaction mode carries nothing over. Seconds; None
    leaves the server's setting (``client_check_interval``: only where the server has it,
    see :func:`has_client_check`)."""
    settings = list(PLAN_SETTINGS)
    for name, value in (
        ("statement_timeout", statement_timeout),
        ("idle_in_transaction_session_timeout", idle_in_transaction_timeout),
        ("client_connection_check_interval", client_check_interval),
    ):
        if value is not None:
            settings.append(f"{name} = {round(value * 1000)}")
    return "BEGIN; " + " ".join(f"SET LOCAL {item};" for item in settings)


def timeout_option(value: float | timedelta | None, name: str) -> float | None:
    """A timeout option in seconds (at least 1 ms), or None."""
    if value is None:
        return None
    seconds = delay_seconds(value, name)
    if not 0.001 <= seconds <= 86_400:
        raise ValueError(f"{name} must be None or between 0.001 and 86400 seconds")
    return seconds


async def has_client_check(conn: asyncpg.Connection) -> bool:
    """Whether the server can check for a vanished client mid-query (PostgreSQL 14+, on
    platforms where it supports ``client_connection_check_interval``)."""
    try:
        await conn.execute("SELECT set_config('client_connection_check_interval', '1000', true)")
    except (asyncpg.UndefinedObjectError, asyncpg.InvalidParameterValueError) as exc:
        log.info("outbox relay: no client_connection_check_interval on this server (%s)", exc)
        return False
    return True


Parents = tuple[tuple[str, str], ...]
"""A row's parents, ``((wire name, id), ...)``; empty for a row without."""

RowGroup = tuple[str, bool, bool, Parents, str]
"""What one ``enqueue_envelopes`` call sends: (type, absolute, replace, parents, policy)."""


def group_rows(rows: list[Any]) -> dict[RowGroup, list[tuple[str, bytes, int]]]:
    """A batch's rows (as taken, in id order) by (type, absolute, replace, parents,
    policy), in first-seen order: one ``enqueue_envelopes`` call each."""
    groups: dict[RowGroup, list[tuple[str, bytes, int]]] = {}
    for row in rows:
        _, event_type, event_id, envelope, due_ms, absolute, replace = row[:7]
        types, ids, policy = row[7:10]
        parents: Parents = () if ids is None else tuple(zip(types, ids, strict=True))
        groups.setdefault((event_type, absolute, replace, parents, policy or "fail"), []).append(
            (event_id, bytes(envelope), due_ms)
        )
    return groups
