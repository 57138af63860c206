"""Loads the Lua scripts that make every multi-key state change atomic.

Each ``.lua`` file opens with a comment listing its KEYS, ARGV, return value
and guarantees. Per-type scripts get ``_prelude.lua`` prepended (key names and
the helpers they share); the scripts that act on every delivery group of a type
get ``_groups.lua`` after it; the lock scripts work on one key and stand alone.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

__all__ = ["GROUPED", "PER_TYPE", "key_count", "source"]

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
    "ready_list",
    "dead_find",
    "schedule_fire",
    "sink_enqueue",
    "key_backlog",
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
    "schedule_load",
    "schedule_index",
    "schedule_due",
    "limits_set",
    "progress",
)


@cache
def source(name: str) -> str:
    """Return the full source of the script ``name`` as sent to Redis."""
    if name not in PER_TYPE and name not in GROUPED and name not in STANDALONE:
        raise KeyError(f"no Lua script named {name!r}")
    here = resources.files(__name__)
    body = (here / f"{name}.lua").read_text(encoding="utf-8")
    # a script may run another's body as a local function: "--@<file>" inserts it
    body = re.sub(
        r"^--@(\w+\.lua)$",
        lambda m: (here / m.group(1)).read_text(encoding="utf-8"),
        body,
        flags=re.MULTILINE,
    )
    if name in GROUPED:
        body = (here / "_groups.lua").read_text(encoding="utf-8") + "\n" + body
    if name in PER_TYPE or name in GROUPED:
        body = (here / "_prelude.lua").read_text(encoding="utf-8") + "\n" + body
    # Whole-line comments are blanked, not sent: Redis keeps every script's text in
    # its script cache (in used_memory), and the prelude is half comments. Blank
    # lines keep the line numbers of error messages.
    return _COMMENT_LINE.sub("", body)


_COMMENT_LINE = re.compile(r"^[ \t]*--[^\n]*$", re.MULTILINE)


# The prelude's names of KEYS[11..21] (and the helpers that read them), by the
# number of keys a script must be given to have them.
_OPTIONAL_KEYS = (
    (
        21,
        re.compile(
            r"\bK_(?:FKEYS|KLINES|KROT|KWAIT|KRUN)\b|KEYS\[(?:17|18|19|20|21)\]"
            r"|\bpush_ready(?:_to)?\(|\bkey_done\("
        ),
    ),
    (16, re.compile(r"\bK_DEDUP\b|KEYS\[16\]")),
    (15, re.compile(r"\bK_WAKE\b|KEYS\[15\]|\bwake_waiters\(")),
    (14, re.compile(r"\bK_LIMITS\b|KEYS\[14\]")),
    (13, re.compile(r"\bK_GSCHED\b|KEYS\[13\]")),
    (12, re.compile(r"\bK_PENDING\b|KEYS\[12\]|\bcounting\(|\brelease\(")),
    (11, re.compile(r"\bK_GROUPS\b|KEYS\[11\]|\bgrouped\(")),
)


@cache
def key_count(name: str) -> int:
    """How many keys of a group's view (``keys.TypeKeys.view``) the per-type script ``name``
    uses: its ten, then groups, pending, the retry schedule, the flow limits, the
    wake list, the dedup set and the flow keys' five, as far as its code reads them.

    Derived from the script's own code (comments left out), so a type without groups
    sends only what the script needs.
    """
    if name not in PER_TYPE:
        raise KeyError(f"{name!r} is not a per-type script")
    text = (resources.files(__name__) / f"{name}.lua").read_text(encoding="utf-8")
    if re.search(r"KEYS\[14\]", text):
        return 14  # sink_enqueue: enqueue's thirteen and the sink's ledger
    code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    for count, pattern in _OPTIONAL_KEYS:
        if pattern.search(code):
            return count
    return 10
