"""Each Lua script's KEYS, as an ordered list of names: the one place a key's position is decided.

The Python side builds a call from a script's names (:func:`keys_for` over a mapping of
name -> key, see :meth:`delayq.keyspace.layout.TypeKeys.named`); the Lua side gets a
``local K_<NAME> = KEYS[i]`` per name, generated from the same list when the script is
loaded (:func:`lua_header`). Nothing else writes a key's index or a script's key count.

A script lists the names its code uses, in the order of :data:`TYPE_KEYS` (then its own
extras), so that a caller may leave off the trailing optional keys (``through``): a
script given fewer keys sees the others as nil. Scripts that act on every delivery group
(:data:`GROUPED`) take their listed keys, then :data:`GROUP_KEYS` per group, then
:data:`GROUP_FLOW_KEYS` per group, then the type's ``fkeys``, then (the scripts of
:data:`GROUP_LEVELLED` only) :data:`LEVEL_KEYS` per group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = [
    "BATCHED",
    "BATCH_KEYS",
    "GROUPED",
    "GROUP_FLOW_KEYS",
    "GROUP_KEYS",
    "GROUP_LEVELLED",
    "KEY_KINDS",
    "LEVELS",
    "LEVEL_KEYS",
    "SCRIPT_KEYS",
    "TYPE_KEYS",
    "group_header",
    "keys_for",
    "lua_header",
    "lua_key_tables",
    "lua_name",
    "through",
]


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def _levelled(text: str, after: str = "") -> tuple[str, ...]:
    """``text``'s names, then ``prio`` and the ready lists of levels 1..9 (see
    :data:`LEVEL_KEYS`): the keys a script that pushes to a ready list needs for a type
    with priorities; a call for one without leaves them off. Then ``after``'s names (the
    dependencies' keys, sent only for a type that has them)."""
    return (*_names(text), "prio", *LEVEL_KEYS, *_names(after))


LEVELS = 10
"""Priority levels: 0 (the most urgent, the default) to 9."""

LEVEL_KEYS = tuple(f"ready_{n}" for n in range(1, LEVELS))
"""The ready lists of priority levels 1..9 (level 0's is ``ready``): ``K_READY_1`` ... in Lua."""

TYPE_KEYS = (
    *_names(
        "events scheduled ready queued inflight leases attempts errors dead meta groups pending "
        "retries limits wake dedup fkeys klines krot kwait krun prio"
    ),
    *LEVEL_KEYS,
    # dependencies (docs/WORKFLOWS.md): last, so that a call for a type without them
    # leaves them off (``through``) and sends what it sent before they existed
    *_names("deps relay waiting"),
)
"""The keys of one delivery group's view of a shard, in the order per-type scripts take them
(:meth:`~delayq.keyspace.layout.TypeKeys.named` maps each to its key)."""

KEY_KINDS = {
    "events": "hash",
    "scheduled": "zset",
    "ready": "list",
    "queued": "zset",
    "inflight": "zset",
    "leases": "hash",
    "attempts": "hash",
    "errors": "hash",
    "dead": "zset",
    "meta": "hash",
    "groups": "hash",
    "pending": "hash",
    "retries": "zset",
    "limits": "hash",
    "wake": "list",
    "dedup": "zset",
    "deps": "hash",
    "relay": "zset",
    "waiting": "zset",
    "fkeys": "hash",
    "klines": "zset",
    "krot": "zset",
    "kwait": "zset",
    "krun": "zset",
    "prio": "hash",
    **dict.fromkeys(LEVEL_KEYS, "list"),
    "sink": "zset",
    "schedules": "hash",
    "schedule_state": "hash",
    "results": "hash",
    "rexp": "zset",
    "progress": "hash",
    "index": "zset",
    "homes": "hash",
    "lock": "string",
    "members": "zset",
    "workers": "zset",
    "worker": "string",
    "minute": "hash",
    "coarse": "hash",
    "types": "set",
    "dshards": "set",
    "format": "string",
    # a batch shard's (docs/WORKFLOWS.md, "Batches")
    "bindex": "zset",
    "bopen": "zset",
    "bclosed": "zset",
    "bdone": "zset",
    "bunconf": "zset",
    "baudit": "zset",
    "brec": "hash",
    "bmembers": "hash",
    "bfailed": "list",
}
"""The Redis type (as ``TYPE`` names it) each named key holds: what ``check_keys`` in
``lua/_prelude.lua`` expects, and what docs/ARCHITECTURE.md's key table says."""

GROUP_KEYS = _names("scheduled ready queued inflight leases attempts errors dead meta")
"""One delivery group's keys in a :data:`GROUPED` script's call (``scheduled``: its retries)."""

GROUP_FLOW_KEYS = _names("klines krot kwait krun")
"""One delivery group's flow-key state in a :data:`GROUPED` script's call."""

SCRIPT_KEYS: dict[str, tuple[str, ...]] = {
    # per-type scripts: one group's view of a shard (names in the order of TYPE_KEYS)
    # waiting (sent by a replace): a replace of a child waiting for parents keeps it waiting
    "enqueue": _levelled(
        "events scheduled ready queued inflight leases attempts errors dead meta groups "
        "pending retries dedup fkeys klines krot kwait",
        "waiting",
    ),
    # deps, relay: a lease expiring on a parent's last delivery hands on its failure
    "move_due": _levelled(
        "events scheduled ready queued inflight leases attempts errors dead meta groups "
        "fkeys klines krot kwait",
        "deps relay",
    ),
    "claim": (
        *_names("events ready queued inflight leases attempts meta limits klines krot kwait krun"),
        *LEVEL_KEYS,
    ),
    # deps, relay (only for a type with dependencies): a parent's completion is recorded
    # for its children, a child's edges go (docs/WORKFLOWS.md)
    "ack": _names(
        "events ready inflight leases attempts errors meta pending limits wake dedup "
        "fkeys klines krot kwait krun prio deps relay"
    ),
    # ack.lua's keys, then the type's kept outcomes (only for a type with results=)
    "ack_results": _names(
        "events ready inflight leases attempts errors meta pending limits wake dedup "
        "fkeys klines krot kwait krun results rexp prio deps relay"
    ),
    "renew": _names("inflight leases meta"),
    # a type without results= sends its keys through krun; a dead letter sends them all
    "fail": _levelled(
        "events scheduled ready queued inflight leases errors dead meta groups retries "
        "limits wake fkeys klines krot kwait krun results rexp",
        "deps relay",
    ),
    "result_get": _names("events dead errors results rexp"),
    "cancel": _names(
        "events scheduled queued inflight leases attempts errors dead groups dedup fkeys prio "
        "deps relay waiting"
    ),
    "dead_requeue": _levelled(
        "events scheduled ready queued attempts errors dead meta groups retries fkeys "
        "klines krot kwait"
    ),
    "dead_purge": _names("events attempts errors dead pending fkeys prio deps relay"),
    "run_now": _levelled("events scheduled ready queued meta groups fkeys klines krot kwait"),
    "group_register": _names("groups"),
    "migrate_out": _names("events scheduled queued inflight leases attempts errors dead prio"),
    "inspect": _names("events scheduled queued inflight attempts errors dead groups prio waiting"),
    "key_backlog": _names("klines krot kwait krun"),
    "schedule_fire": _levelled(
        "events scheduled ready queued dead meta groups schedules schedule_state fkeys "
        "klines krot kwait"
    ),
    # enqueue.lua's keys as far as the sink sends them, the sink's ledger, then the rest
    "sink_enqueue": _levelled(
        "events scheduled ready queued inflight leases attempts errors dead meta groups "
        "pending retries sink dedup fkeys klines krot kwait",
        "waiting",
    ),
    # read-only scripts: a group's read view (TypeKeys.named(group, read=True))
    "dead_list": _names("events attempts errors dead"),
    "inflight_list": _names("inflight attempts"),
    "due_histogram": _names("scheduled retries"),
    "counts": (
        *_names("scheduled ready queued inflight dead retries limits klines rexp"),
        *LEVEL_KEYS,
        "waiting",
        "relay",
    ),
    "scheduled_list": _names("events scheduled attempts errors retries"),
    "ready_list": _names("events queued attempts errors"),
    "dead_find": _names("events attempts errors dead"),
    # dependencies (docs/WORKFLOWS.md#dependencies): a child waits, a parent links it,
    # a completion is applied to the child, the relay reads its work and clears it
    "dep_wait": _names("events meta dedup deps relay waiting"),
    "dep_link": _names("events errors dead meta groups dedup results rexp deps"),
    # a batch's members link it before they are enqueued (an add's step)
    "dep_prelink": _names("events dead meta groups dedup deps"),
    "dep_apply": _names("events scheduled errors dead meta groups deps relay waiting results rexp"),
    "dep_work": _names("deps relay"),
    "dep_relayed": _names("events deps relay"),
    "dep_parents": _names("deps waiting"),
    "dep_children": _names("deps"),
    # batches (docs/WORKFLOWS.md#batches), on a batch shard: these, then BATCH_KEYS per
    # batch (see BATCHED)
    "batch_open": _names("events deps relay bindex bopen"),
    "batch_renew": _names("bopen"),
    "batch_add": _names("bunconf"),
    "batch_confirm": _names("bunconf"),
    "batch_apply": _names("events deps relay bopen bclosed bdone bunconf baudit"),
    "batch_close": _names("events deps relay bopen bclosed bdone baudit"),
    "batch_sweep": _names("bopen bclosed bdone bunconf baudit"),
    "batch_trim": _names("deps bindex bdone"),
    "batch_info": (),
    "batch_list": _names("bindex bopen bclosed bdone bunconf"),
    "batch_counts": _names("relay bopen bclosed bdone bunconf baudit"),
    # scripts on every delivery group: these, then the groups' (see the module's docstring)
    "group_move": _names("events scheduled meta groups pending prio"),
    "group_cancel": _names("events scheduled groups pending prio deps relay waiting"),
    "group_replace": _names("events scheduled meta groups pending prio"),
    "group_remove": _names("events meta groups pending prio"),
    "group_inspect": _names("events scheduled groups pending prio waiting"),
    "group_run_now": _names("events scheduled groups pending prio"),
    # scripts on other keys
    "lock_take": _names("lock"),
    "lock_steal": _names("lock"),
    "lock_release": _names("lock"),
    "heartbeat": _names("workers worker"),
    "worker_remove": _names("workers worker"),
    "members": _names("members"),
    "schedule_write": _names("schedules schedule_state"),
    "schedule_load": _names("schedules schedule_state"),
    "schedule_index": _names("index homes"),
    "schedule_due": _names("index homes"),
    "limits_set": _names("limits wake"),
    # a running delivery's progress, written only under its lease
    "progress": _names("leases progress"),
    # one pair per event type (history_add.lua loops over them, see BLOCKS)
    "history_add": _names("minute coarse"),
}
"""Each script's KEYS by name, in order."""

GROUPED = _names("group_move group_cancel group_replace group_remove group_inspect group_run_now")
"""The scripts that take every delivery group's keys after their own."""

GROUP_LEVELLED = _names("group_move group_run_now group_remove")
"""The :data:`GROUPED` scripts that push to (or delete) the groups' ready lists: they also take
each group's ready lists of priority levels 1..9 (:data:`LEVEL_KEYS`), after the type's
``fkeys``."""

BLOCKS = ("history_add",)
"""The scripts that take their list of keys once per item (``block_key(b, B_<NAME>)``)."""

BATCH_KEYS = _names("brec bmembers bfailed")
"""One batch's own keys (:meth:`~delayq.keyspace.layout.TypeKeys.batch`), in the order
:data:`BATCHED` scripts take them per batch: ``bkey(b, B_REC)`` in Lua."""

BATCHED = _names(
    "batch_open batch_renew batch_add batch_confirm batch_apply batch_close batch_trim batch_info"
)
"""The batch scripts that take, after their listed keys, :data:`BATCH_KEYS` once per batch
they act on (one, or for ``batch_apply`` and ``batch_trim`` several)."""


def through(script: str, last: str) -> tuple[str, ...]:
    """``script``'s names up to and including ``last``: what a call that needs no more sends."""
    names = SCRIPT_KEYS[script]
    return names[: names.index(last) + 1]


def keys_for(names: Iterable[str], keys: Mapping[str, str]) -> tuple[str, ...]:
    """The keys of ``names``, in order, from a mapping of name -> key."""
    return tuple(keys[name] for name in names)


def lua_name(name: str) -> str:
    """The Lua local that holds the key ``name`` (``K_EVENTS``, ``K_SCHEDULE_STATE``)."""
    return "K_" + name.upper()


def lua_header(script: str) -> str:
    """The Lua lines that name a script's KEYS (``local K_EVENTS = KEYS[1]`` ...), and for a
    :data:`GROUPED` script the layout of the groups' keys after them (:func:`group_header`)."""
    names = SCRIPT_KEYS[script]
    if script in BLOCKS:
        # one block of these keys per item: block_key(b, B_MINUTE) is item b's
        width = len(names)
        return (
            "\n".join(
                [
                    f"local {', '.join('B_' + n.upper() for n in names)} = "
                    + ", ".join(str(i) for i in range(1, width + 1)),
                    f"local function block_key(b, j) return KEYS[{width} * (b - 1) + j] end",
                ]
            )
            + "\n"
        )
    lines = [f"local {lua_name(n)} = KEYS[{i}]" for i, n in enumerate(names, 1)]
    if script in BATCHED:
        # after the script's own keys, one block of BATCH_KEYS per batch
        width = len(BATCH_KEYS)
        lines.append(
            f"local {', '.join('B_' + n[1:].upper() for n in BATCH_KEYS)} = "
            + ", ".join(str(i) for i in range(1, width + 1))
        )
        lines.append(
            f"local function bkey(b, j) return KEYS[{len(names)} + {width} * (b - 1) + j] end"
        )
    if script in GROUPED:
        lines.append(group_header(len(names), levels=script in GROUP_LEVELLED))
    return "\n".join(lines) + "\n"


def lua_key_tables(script: str) -> str:
    """``KEY_OF`` (name -> key) and ``KEY_KIND`` (name -> Redis type) of a script's keys, for
    ``check_keys`` (``lua/_prelude.lua``); the loader sends them only to the scripts that
    check keys."""
    names = SCRIPT_KEYS[script]
    key_of = ", ".join(f"{n} = {lua_name(n)}" for n in names)
    kinds = ", ".join(f"{n} = '{KEY_KINDS[n]}'" for n in names)
    return f"local KEY_OF = {{{key_of}}}\nlocal KEY_KIND = {{{kinds}}}\n"


def group_header(before: int, *, levels: bool = False) -> str:
    """The layout of a :data:`GROUPED` script's group keys, after its ``before`` own keys:
    ``gkey(g, G_READY)``, ``gkkey(g, G_KLINES)``, the type's ``K_FKEYS``; with ``levels``
    (:data:`GROUP_LEVELLED`) then ``glkey(g, n)``, group g's ready list of level n (1..9)."""
    width, flow = len(GROUP_KEYS), len(GROUP_FLOW_KEYS)
    names = [f"G_{n.upper()}" for n in GROUP_KEYS]
    flow_names = [f"G_{n.upper()}" for n in GROUP_FLOW_KEYS]
    kinds = ", ".join(f"'{KEY_KINDS[n]}'" for n in GROUP_KEYS)
    return "\n".join(
        [
            "local N_GROUPS = tonumber(ARGV[1])",
            f"local {', '.join(names)} = {', '.join(str(i) for i in range(1, width + 1))}",
            f"local {', '.join(flow_names)} = {', '.join(str(i) for i in range(1, flow + 1))}",
            f"local GROUP_WIDTH, GROUP_FLOW_WIDTH = {width}, {flow}",
            f"local GKEY_KIND = {{{kinds}}}",
            f"local function gkey(g, j) return KEYS[{before} + {width} * (g - 1) + j] end",
            "local function gkkey(g, j) "
            f"return KEYS[{before} + {width} * N_GROUPS + {flow} * (g - 1) + j] end",
            f"local K_FKEYS = KEYS[{before} + {width + flow} * N_GROUPS + 1]",
            # LEVEL_WIDTH 0: the script takes no level lists (group_levels() in _groups.lua)
            f"local LEVEL_WIDTH = {len(LEVEL_KEYS) if levels else 0}",
            "local function glkey(g, n) "
            f"return KEYS[{before} + {width + flow} * N_GROUPS + 1 + LEVEL_WIDTH * (g - 1) + n] end",
        ]
    )
