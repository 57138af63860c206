"""Loads the Lua scripts that make every multi-key state change atomic.

Each ``.lua`` file opens with a comment listing its KEYS, ARGV, return value
and guarantees. Every script is sent after a header naming its KEYS
(``local K_READY = KEYS[3]``), generated from its list of names in
:data:`delayq.keyspace.scripts.SCRIPT_KEYS`: no ``.lua`` file writes a key's
position. Per-type scripts get the helpers they use from the small files of
:data:`LIBRARY` (followed from their code, so a script carries only its own; see
``_prelude.lua``); the
scripts that act on every delivery group of a type get ``_groups.lua`` after
them; the lock scripts work on one key and stand alone.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from ..keyspace import scripts as keyspace

__all__ = ["GROUPED", "PER_TYPE", "STANDALONE", "source", "with_prelude"]

PER_TYPE = (
    "enqueue",
    "move_due",
    "claim",
    "ack",
    "ack_results",
    "result_get",
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
    "dep_wait",
    "dep_link",
    "dep_prelink",
    "dep_apply",
    "dep_work",
    "dep_relayed",
    "dep_parents",
    "dep_children",
    "batch_open",
    "batch_renew",
    "batch_add",
    "batch_confirm",
    "batch_apply",
    "batch_close",
    "batch_sweep",
    "batch_trim",
    "batch_info",
    "batch_list",
    "batch_counts",
)
GROUPED = (
    "group_move",
    "group_cancel",
    "group_replace",
    "group_remove",
    "group_inspect",
    "group_run_now",
)
# The per-type scripts' helpers, in the order they are defined (each uses only those
# before it); a script gets the definitions it uses (see _prelude.lua)
LIBRARY = (
    "_checks",
    "_clock",
    "_registry",
    "_levels",
    "_limits",
    "_records",
    "_flow_keys",
    "_push",
    "_moves",
    "_deps",
    "_batches",
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
        return with_prelude(name, body)
    return keyspace.lua_header(name) + _strip(body)


def with_prelude(name: str, body: str) -> str:
    """``body`` as the per-type script ``name`` runs it: after the header naming its keys
    and the helpers of :data:`LIBRARY` it uses (also for tests of those helpers)."""
    here = resources.files(__name__)
    library = keyspace.lua_key_tables(name) + "".join(
        _strip((here / f"{part}.lua").read_text(encoding="utf-8")) for part in LIBRARY
    )
    # Whole-line comments are blanked, not sent: Redis keeps every script's text in
    # its script cache (in used_memory), and the prelude is half comments.
    body = _strip(body)
    return keyspace.lua_header(name) + _used(library, body) + body


_COMMENT_LINE = re.compile(r"^[ \t]*--[^\n]*$", re.MULTILINE)
_LOCAL = re.compile(r"^local (?:function (\w+)|([\w, ]+?)\s*(?:=|$))")
_WORD = re.compile(r"\b[A-Za-z_]\w*\b")


def _strip(text: str) -> str:
    return _COMMENT_LINE.sub("", text)


def _used(library: str, code: str) -> str:
    """The top-level definitions of ``library`` (each from a ``local`` line at column 0 to
    the next) that ``code`` uses, directly or through others, in their order."""
    chunks: list[tuple[set[str], str]] = []
    for line in library.splitlines(keepends=True):
        m = _LOCAL.match(line)
        if m:
            names = m.group(1) or m.group(2)
            chunks.append(({n.strip() for n in names.split(",")}, line))
        elif chunks:
            chunks[-1] = (chunks[-1][0], chunks[-1][1] + line)
    wanted = set(_WORD.findall(code))
    keep = [False] * len(chunks)
    changed = True
    while changed:
        changed = False
        for i, (names, text) in enumerate(chunks):
            if not keep[i] and names & wanted:
                keep[i] = changed = True
                wanted |= set(_WORD.findall(text))
    kept = "".join(text for (_, text), k in zip(chunks, keep, strict=True) if k)
    return "\n".join(line for line in kept.splitlines() if line.strip()) + "\n"
