"""Shared pieces of the PostgreSQL tests and ``scripts/pg_soak.py``.

* :class:`OrderCheck` — the event the outbox schedules for an order;
* :func:`create_app_tables` — the application's own tables in a test schema: ``orders`` (one
  row per committed order) and ``effects`` (one row each time a handler's work committed;
  no unique constraint, so a duplicated effect would show);
* :func:`spawn` — start ``pgworker.py`` (a relay or a handling worker) as an OS process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from delayq import Event

__all__ = ["WORKER", "OrderCheck", "create_app_tables", "spawn"]

WORKER = str(Path(__file__).with_name("pgworker.py"))


class OrderCheck(Event, event_name="pg-order-check"):
    """Check order ``order_id`` (the test handler records one effect row for it)."""

    order_id: int


async def create_app_tables(conn: Any, schema: str) -> None:
    """The application's tables, next to the outbox and inbox in ``schema``."""
    await conn.execute(
        f"""
        CREATE TABLE IF NOT EXISTS "{schema}".orders (
            id integer PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now());
        CREATE TABLE IF NOT EXISTS "{schema}".effects (
            order_id integer NOT NULL, version text NOT NULL, pid integer NOT NULL,
            applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
        CREATE TABLE IF NOT EXISTS "{schema}".runs (
            order_id integer NOT NULL, first boolean NOT NULL, pid integer NOT NULL);
        """
    )


def spawn(log_path: str, *args: str) -> subprocess.Popen[bytes]:
    """Start ``pgworker.py args...`` with its output in ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, WORKER, *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
