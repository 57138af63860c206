"""What the handler found, kept where the application keeps its data: a SQLite file here,
your database in a real application. Both processes use it: the worker writes, the web
process reads.

delayq does not store handler results: a handler writes what it found to the
application's own storage, and whoever needs it reads it from there.
"""

import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

DATABASE = os.environ.get("CHECKS_DB") or str(Path(__file__).with_name("checks.sqlite3"))


def _connect() -> sqlite3.Connection:
    db = sqlite3.connect(DATABASE, timeout=10)
    db.execute("CREATE TABLE IF NOT EXISTS checks (order_id INTEGER PRIMARY KEY, result TEXT)")
    return db


def save_check(order_id: int, result: dict[str, Any]) -> None:
    """Record the check of an order (the last one wins: a retry overwrites)."""
    with closing(_connect()) as db, db:  # the inner `db`: one transaction, committed
        db.execute("INSERT OR REPLACE INTO checks VALUES (?, ?)", (order_id, json.dumps(result)))


def load_check(order_id: int) -> dict[str, Any] | None:
    """The recorded check of an order, or None while there is none."""
    with closing(_connect()) as db:
        row = db.execute("SELECT result FROM checks WHERE order_id = ?", (order_id,)).fetchone()
    return None if row is None else json.loads(row[0])
