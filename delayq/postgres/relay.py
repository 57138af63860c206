"""``OutboxRelay``: moves committed outbox rows to Redis, then deletes them.

One batch is one PostgreSQL transaction: delete up to ``batch_size`` rows, picked with ``FOR
UPDATE SKIP LOCKED`` so several relays share the table without waiting for each other, and
get them back (``RETURNING``), with a plan that reads about ``batch_size`` rows whatever the
table's statistics say (:func:`~delayq.postgres.batches.take_statement`); enqueue them through :meth:`EventService.enqueue_envelopes`
(the normal enqueue script: same (type, id) dedup, same ``replace`` rule); commit. A relay that dies between the enqueue and
the commit leaves its rows in the table, unlocked once PostgreSQL ends its session (bounded
by the relay's timeouts); the next batch sends them again, and Redis
keeps the event it already has (counted as ``kept``). A row with parents (``after=``) goes
through the same call with ``after=`` and its policy, once no earlier row of its parents
is left in the table (the batch after theirs, which then runs at once). A re-sent row carries the very envelope
of the first send, so even an event that was already handled comes back as the *same version*
(:attr:`delayq.Delivery.version`), which the inbox recognises.

The relay sleeps on ``LISTEN <schema>_outbox`` (a trigger notifies at each commit that
inserted rows) and polls every ``poll_interval`` all the same, so a lost notification or a
dropped listening connection only delays rows, never strands them. It also prunes the inbox
every ``prune_interval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, cast

import asyncpg

from .._pacing import Retrying
from ..operations.dependencies import ParentFailurePolicy
from ..retry import delay_seconds
from ..service import EventService
from .batches import begin_statement, group_rows, has_client_check, take_statement, timeout_option
from .inbox import prune_inbox
from .schema import channel_name, validate_schema

__all__ = ["OutboxRelay"]

log = logging.getLogger("delayq.postgres.relay")


class OutboxRelay:
    """Relays committed outbox rows of ``schema`` at ``dsn`` into ``service``'s Redis.

    Run it next to (or inside) a service, in as many processes as you like::

        async with EventService.from_url(redis_url) as service, OutboxRelay(service, dsn):
            ...   # the relay runs until the block ends

    or drive it yourself: ``await relay.run()`` until :meth:`stop`, or :meth:`relay_once`
    for one batch. The relay opens (and closes) two connections of its own: one for the
    batches, one that listens.

    Args:
        service: where events go (only its enqueue API is used; it need not be started).
        dsn: a ``postgresql://`` URL for ``asyncpg.connect``.
        schema: the schema :func:`~delayq.postgres.migrate` created the tables in.
        batch_size: most rows per transaction (1–10000).
        poll_interval: the longest the relay sleeps without a notification (seconds).
        listen: ``False`` to rely on polling alone (say, behind a pooler in transaction
            mode, where LISTEN does not work).
        inbox_retention: inbox rows older than this are deleted; ``None`` never prunes.
        prune_interval: how often this relay prunes the inbox.
        connect_kwargs: extra keyword arguments for ``asyncpg.connect`` (ssl, timeouts...).
        shutdown_grace: how long :meth:`aclose` lets a batch under way finish.
        statement_timeout: the longest one statement of a batch may run (PostgreSQL's
            ``statement_timeout``, set for each batch's transaction); ``None`` leaves the
            server's setting.
        idle_in_transaction_timeout: the longest a batch's transaction may wait on the relay
            (sending to Redis) before PostgreSQL ends the session and so frees its rows (a
            frozen or unreachable relay); ``None`` leaves the server's setting.
        client_check_interval: how often PostgreSQL 14+ checks, while a batch's statement
            runs, that the relay is still connected (``client_connection_check_interval``),
            so a killed relay's statement stops and frees its rows; ``None`` leaves the
            server's setting. Ignored where the server lacks it.
    """

    def __init__(
        self,
        service: EventService,
        dsn: str,
        *,
        schema: str = "delayq",
        batch_size: int = 500,
        poll_interval: float | timedelta = 1.0,
        listen: bool = True,
        inbox_retention: float | timedelta | None = timedelta(days=7),
        prune_interval: float | timedelta = timedelta(minutes=10),
        connect_kwargs: Mapping[str, Any] | None = None,
        shutdown_grace: float = 10.0,
        statement_timeout: float | timedelta | None = 30.0,
        idle_in_transaction_timeout: float | timedelta | None = 60.0,
        client_check_interval: float | timedelta | None = 1.0,
    ):
        if not isinstance(service, EventService):
            raise TypeError(f"service must be an EventService, not {type(service).__name__}")
        if not isinstance(dsn, str):
            raise TypeError("dsn must be a postgresql:// URL")
        if not isinstance(batch_size, int) or not 1 <= batch_size <= 10_000:
            raise ValueError(f"batch_size must be an int from 1 to 10000, not {batch_size!r}")
        self.service = service
        self.schema = validate_schema(schema)
        self.batch_size = batch_size
        self.poll_interval = delay_seconds(poll_interval, "poll_interval")
        if not 0.01 <= self.poll_interval <= 3600:
            raise ValueError("poll_interval must be between 0.01 and 3600 seconds")
        self.listen = bool(listen)
        self.inbox_retention = (
            None if inbox_retention is None else delay_seconds(inbox_retention, "inbox_retention")
        )
        self.prune_interval = delay_seconds(prune_interval, "prune_interval")
        self.shutdown_grace = shutdown_grace
        self.statement_timeout = timeout_option(statement_timeout, "statement_timeout")
        self.idle_in_transaction_timeout = timeout_option(
            idle_in_transaction_timeout, "idle_in_transaction_timeout"
        )
        self.client_check_interval = timeout_option(client_check_interval, "client_check_interval")
        self._dsn = dsn
        self._connect_kwargs = dict(connect_kwargs or {})
        self._channel = channel_name(self.schema)
        self._take = take_statement(self.schema)  # (why it reads what it reads: there)
        # opens each batch's transaction with its settings (made when connecting: the
        # server may lack client_connection_check_interval)
        self._begin = ""
        self._conn: asyncpg.Connection | None = None
        self._listener: asyncpg.Connection | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._next_prune = 0.0
        # the last batch saw rows with parents (after=) in the table: the next runs at once
        self._children_waiting = False
        #: rows moved to Redis and deleted
        self.relayed = 0
        #: of those, rows whose event already existed in Redis (a re-sent row, or a
        #: duplicate id): Redis kept the event it had
        self.kept = 0
        #: batches committed
        self.batches = 0
        #: inbox rows pruned
        self.pruned = 0

    # -- connections --------------------------------------------------------------

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            conn = await asyncpg.connect(self._dsn, **self._connect_kwargs)
            try:
                check = self.client_check_interval
                if check is not None and not await has_client_check(conn):
                    check = None
            except BaseException:
                await self._drop(conn)
                raise
            self._begin = begin_statement(
                self.statement_timeout, self.idle_in_transaction_timeout, check
            )
            self._conn = conn
        return self._conn

    def _notified(self, *_: object) -> None:
        self._wake.set()

    async def _ensure_listening(self) -> None:
        if not self.listen or (self._listener is not None and not self._listener.is_closed()):
            return
        if self._listener is not None:
            await self._drop(self._listener)
        self._listener = None
        listener = await asyncpg.connect(self._dsn, **self._connect_kwargs)
        try:
            await listener.add_listener(self._channel, self._notified)
        except BaseException:
            await self._drop(listener)
            raise
        self._listener = listener
        self._wake.set()  # rows committed while nobody listened

    @staticmethod
    async def _drop(conn: asyncpg.Connection | None) -> None:
        if conn is None or conn.is_closed():
            return
        try:
            await asyncio.wait_for(conn.close(), 2.0)
        except Exception:
            conn.terminate()

    async def _close_connections(self) -> None:
        conn, listener, self._conn, self._listener = self._conn, self._listener, None, None
        await self._drop(conn)
        await self._drop(listener)

    # -- the work -----------------------------------------------------------------------

    async def relay_once(self) -> int:
        """Relay one batch: send up to ``batch_size`` committed rows to Redis; return how many."""
        conn = await self._connection()
        try:
            await conn.execute(self._begin)
            rows = sorted(await conn.fetch(self._take, self.batch_size), key=lambda r: r[0])
            kept = await self._send(rows) if rows else 0
            await conn.execute("COMMIT")
        except asyncpg.UndefinedColumnError as exc:
            await self._rollback(conn)
            raise RuntimeError(
                f"the outbox of schema {self.schema!r} lacks a column ({exc}): migrate it "
                "(delayq.postgres.migrate, `delayq outbox-migrate`, or schema_sql's "
                "migration 2 in your own tool)"
            ) from exc
        except BaseException:
            await self._rollback(conn)
            raise
        if not rows:
            self._children_waiting = False
            return 0
        # rows with parents in the table: one may wait for this batch's rows only
        self._children_waiting = bool(rows[0][-1])
        self.relayed += len(rows)
        self.kept += kept
        self.batches += 1
        return len(rows)

    async def _rollback(self, conn: asyncpg.Connection) -> None:
        """End a failed batch's transaction; a connection that cannot is closed (same effect)."""
        try:
            if not conn.is_closed() and conn.is_in_transaction():
                await asyncio.wait_for(conn.execute("ROLLBACK"), 2.0)
        except (Exception, asyncio.CancelledError) as exc:
            conn.terminate()
            if self._conn is conn:
                self._conn = None
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _send(self, rows: list[Any]) -> int:
        """Enqueue the rows, grouped by (type, mode, replace, parents, policy) in first-seen
        order; return kept."""
        kept = 0
        for (event_type, absolute, replace, parents, policy), items in group_rows(rows).items():
            if parents:
                codes = await self.service.enqueue_envelopes(
                    event_type,
                    items,
                    absolute=absolute,
                    after=parents,
                    on_parent_failure=cast(ParentFailurePolicy, policy),  # checked on insert
                )
            else:
                codes = await self.service.enqueue_envelopes(
                    event_type, items, absolute=absolute, replace=replace
                )
            kept += codes.count(0)
        return kept

    async def prune_inbox(self) -> int:
        """Delete inbox rows older than ``inbox_retention`` now; return how many."""
        if self.inbox_retention is None:
            return 0
        pruned = await prune_inbox(await self._connection(), self.inbox_retention, self.schema)
        self.pruned += pruned
        return pruned

    # -- the loop -------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` has been called."""
        return self._stopping

    def stop(self) -> None:
        """Ask :meth:`run` to return after the batch under way."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        """Relay until :meth:`stop`: batches while rows wait, then sleep until notified or polled.

        Errors (PostgreSQL or Redis down, a dropped connection) are logged and retried with
        backoff; the loop goes on. Closes its connections when it returns.
        """
        retrying = Retrying(first=0.1)
        try:
            while not self._stopping:
                try:
                    await self._ensure_listening()
                    # cleared before the batch: a commit notified during it is not lost
                    self._wake.clear()
                    moved = await self.relay_once()
                    if self.inbox_retention is not None and time.monotonic() >= self._next_prune:
                        self._next_prune = time.monotonic() + self.prune_interval
                        await self.prune_inbox()
                    retrying.reset()
                    if moved >= self.batch_size or (moved and self._children_waiting):
                        continue  # more are waiting (or children of rows just sent may be)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.poll_interval)
                except Exception as exc:  # PostgreSQL or Redis errors...: loops never die
                    await self._failed(exc, retrying.next())
        finally:
            await self._close_connections()

    async def _failed(self, exc: Exception, backoff: float) -> None:
        log.warning(
            "outbox relay (%s): %s: %s; retrying in %.1fs",
            self.schema,
            type(exc).__name__,
            exc,
            backoff,
        )
        await self._close_connections()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wait_stopping(), backoff)

    async def _wait_stopping(self) -> None:
        while not self._stopping:
            self._wake.clear()
            await self._wake.wait()

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Run :meth:`run` in a task owned by this relay (closed by :meth:`aclose`)."""
        if self._task is not None:
            return
        self._stopping = False
        self._task = asyncio.create_task(self.run(), name=f"delayq-outbox-relay-{self.schema}")

    async def aclose(self) -> None:
        """Stop: let the batch under way finish (up to ``shutdown_grace``), then cancel."""
        self.stop()
        task, self._task = self._task, None
        if task is None:
            await self._close_connections()
            return
        await asyncio.wait([task], timeout=self.shutdown_grace)
        while not task.done():
            # a cancelled batch rolls back: its rows are sent again by the next relay
            task.cancel()
            await asyncio.wait([task], timeout=1.0)
        if not task.cancelled() and task.exception() is not None:
            log.error("the outbox relay ended with an error", exc_info=task.exception())

    async def __aenter__(self) -> OutboxRelay:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def outbox_relay(dsn: str, **options: Any) -> Callable[[EventService], OutboxRelay]:
    """For ``EventService(..., outbox=outbox_relay(dsn, schema=...))``: the service runs a relay.

    The relay starts with the service and stops (finishing its batch) when the
    service closes, before its consumers drain. ``options`` are
    :class:`OutboxRelay`'s keyword arguments; they are checked now.
    """
    allowed = set(inspect.signature(OutboxRelay.__init__).parameters) - {"self", "service", "dsn"}
    unknown = set(options) - allowed
    if unknown:
        raise TypeError(f"unknown OutboxRelay options {sorted(unknown)}; known: {sorted(allowed)}")
    if not isinstance(dsn, str) or not dsn:
        raise ValueError(f"dsn must be a postgresql:// URL, not {dsn!r}")

    def make(service: EventService) -> OutboxRelay:
        return OutboxRelay(service, dsn, **options)

    return make
