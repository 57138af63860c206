"""Loads the Lua scripts that make every multi-key state change atomic.

Each ``.lua`` file opens with a comment listing its KEYS, ARGV, return value
and guarantees. Per-type scripts get ``_prelude.lua`` prepended (key names and
the helpers they share); the scripts that act on every delivery group of a type
get ``_groups.lua`` after it; the lock scripts work on one key and stand alone.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["GROUPED", "PER_TYPE", "source"]

PER_TYPE = (
    "enqueue",
    "move_due",
    "claim",
    "ack",
    "renew",
    "fail",
    "cancel",
    "dead_list",
    "dead_requeue",
    "dead_purge",
    "run_now",
    "inflight_list",
    "due_histogram",
    "group_register",
    "migrate_out",
    "inspect",
    "counts",
    "scheduled_list",
    "schedule_fire",
)
GROUPED = (
    "group_move",
    "group_cancel",
    "group_replace",
    "group_remove",
    "group_inspect",
    "group_run_now",
)
STANDALONE = (
    "lock_take",
    "lock_steal",
    "lock_release",
    "heartbeat",
    "worker_remove",
    "history_add",
    "members",
    "schedule_write",
    "schedule_index",
    "schedule_due",
)


@cache
def source(name: str) -> str:
    """Return the full source of the script ``name`` as sent to Redis."""
    if name not in PER_TYPE and name not in GROUPED and name not in STANDALONE:
        raise KeyError(f"no Lua script named {name!r}")
    here = resources.files(__name__)
    body = (here / f"{name}.lua").read_text(encoding="utf-8")
    if name in GROUPED:
        body = (here / "_groups.lua").read_text(encoding="utf-8") + "\n" + body
    if name in PER_TYPE or name in GROUPED:
        return (here / "_prelude.lua").read_text(encoding="utf-8") + "\n" + body
    return body
