"""The Redis key layout.

Every key of one event type shares the hash tag ``{prefix:type}``, so each Lua
script touches one cluster slot and no script spans two types. Keys that
belong to the whole prefix use the tag ``{prefix}``.

The keys of a type, what each holds and its Redis type are listed in
docs/ARCHITECTURE.md ("Keys"; ``tests/test_keyspace.py`` checks that table against
:data:`delayq.keyspace.scripts.KEY_KINDS`). A type with ``N > 1`` partitions has all of its
keys once per partition ``k``, under the hash tag ``{prefix:T#k/N.s}`` (see
:func:`delayq.keyspace.shards.partition_tag`); a named delivery group ``G`` has its own
copies of the per-delivery keys under ``{p:T}:g:G:``. Which of them each Lua script takes,
in which order, is :data:`delayq.keyspace.scripts.SCRIPT_KEYS`.

(Over 400 lines: one job, naming every key. The prefix's keys, a type's, a delivery
group's view, a priority level's and a batch shard's (a type's keys under the shard's
tag, with its batches' own) are one table read from several sides; split, the views
would have to reach into each other's names.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .groups import DEFAULT_GROUP, stored_group
from .names import validate_name
from .scripts import GROUP_KEYS, GROUP_LEVELLED, LEVEL_KEYS, LEVELS
from .shards import BATCH_SHARDS, BATCH_TYPE, batch_tag, parse_shard, partition_tag

__all__ = ["DEFAULT_GROUP", "KeyView", "PrefixKeys", "TypeKeys"]


class KeyView(NamedTuple):
    """One delivery group's view of a type (shard): the first 13 names of
    :data:`~delayq.keyspace.scripts.TYPE_KEYS` (:meth:`TypeKeys.named` adds the rest).

    Read a key by name (``view.ready``); scripts are given their keys by name too
    (:data:`~delayq.keyspace.scripts.SCRIPT_KEYS`).
    """

    events: str
    """HASH id -> envelope (the type's, shared by its groups)."""
    scheduled: str
    """ZSET id -> due ms: the type's schedule (the default group), or a named group's retries."""
    ready: str
    """LIST of ready entries."""
    queued: str
    """ZSET of ready ids not claimed yet."""
    inflight: str
    """ZSET id -> lease deadline."""
    leases: str
    """HASH id -> claim token."""
    attempts: str
    """HASH id -> deliveries so far."""
    errors: str
    """HASH id -> last failure."""
    dead: str
    """ZSET id -> dead-letter time."""
    meta: str
    """HASH of counters and the wake mark."""
    groups: str
    """HASH: the type's group registry."""
    pending: str
    """HASH id -> groups still holding a fanned-out event."""
    retries: str
    """ZSET: the group's retry schedule once groups exist."""


@dataclass(frozen=True, slots=True)
class PrefixKeys:
    """Keys and channels shared by all event types under one prefix."""

    prefix: str

    def __post_init__(self) -> None:
        validate_name(self.prefix, "prefix")

    @property
    def types(self) -> str:
        """SET of the event type names that have ever been used under this prefix."""
        return f"{{{self.prefix}}}:types"

    @property
    def format(self) -> str:
        """STRING: the stored-data format of the prefix (see :mod:`delayq.storage.format`)."""
        return f"{{{self.prefix}}}:format"

    @property
    def scheduler_lock(self) -> str:
        """STRING holding the token of the scheduler currently moving due events."""
        return f"{{{self.prefix}}}:scheduler-lock"

    @property
    def wakeup_channel(self) -> str:
        """Pub/sub channel on which enqueues wake the scheduler early."""
        return f"{{{self.prefix}}}:wakeup"

    @property
    def results_channel(self) -> str:
        """Pub/sub channel on which outcomes of types with ``results=`` are announced
        (``"<shard> <id>"``), to wake ``result()`` waiters (a timed re-check still runs)."""
        return f"{{{self.prefix}}}:results"

    @property
    def dependency_shards(self) -> str:
        """SET of the shards that ever took part in a dependency (as parent or child): the
        ones the relay looks at (docs/WORKFLOWS.md, "Dependencies"). A batch's shard is
        added before the batch is written: its batch shards are the ones in use, where
        ``batches()`` and ``batch_counts()`` look (docs/WORKFLOWS.md, "Batches")."""
        return f"{{{self.prefix}}}:dshards"

    @property
    def workers(self) -> str:
        """ZSET worker id -> expiry (ms) of the live workers' heartbeat records."""
        return f"{{{self.prefix}}}:workers"

    def worker(self, worker_id: str) -> str:
        """STRING: one worker's heartbeat record (JSON), with a TTL."""
        return f"{{{self.prefix}}}:worker:{worker_id}"

    def history(self, type_name: str, ring: str) -> str:
        """HASH: the ``ring`` ("minute" or "coarse") of one type's handled/failed/lateness history."""
        return f"{{{self.prefix}}}:history:{ring}:{type_name}"

    @property
    def cancel_channel(self) -> str:
        """Pub/sub channel on which ``cancel`` tells workers to stop a running handler."""
        return f"{{{self.prefix}}}:cancel"

    def for_type(self, type_name: str) -> TypeKeys:
        """The keys of one event type."""
        return TypeKeys(self.prefix, type_name)

    def for_shard(self, shard: str) -> TypeKeys:
        """The keys of one shard: a type name, or ``"T#k/N"`` for partition k of N."""
        type_name, partition, partitions = parse_shard(shard)
        return TypeKeys(self.prefix, type_name, partition, partitions)

    @property
    def schedule_index(self) -> str:
        """ZSET of the recurring schedules the firers read: name -> next fire (unix ms)."""
        return f"{{{self.prefix}}}:schedules"

    @property
    def schedule_homes(self) -> str:
        """HASH name -> ``"<gen>|<shard>"``: the shard each schedule fires into."""
        return f"{{{self.prefix}}}:schedule-homes"

    @property
    def members(self) -> str:
        """ZSET of live scheduler processes (token -> heartbeat deadline, ms); only used
        while a partitioned type exists (see delayq.partitions.spread)."""
        return f"{{{self.prefix}}}:schedulers"


@dataclass(frozen=True, slots=True)
class TypeKeys:
    """Keys of one event type (or one partition of it); all share one hash tag.

    The tag is ``{prefix:type}``, or ``{prefix:type#k/N.s}`` for partition ``k``
    of a type with ``N > 1`` partitions (``s``: see ``partitions.partition_tag``).
    """

    prefix: str
    type_name: str
    partition: int = 0
    partitions: int = 1

    def __post_init__(self) -> None:
        if self.type_name != BATCH_TYPE or self.partitions != BATCH_SHARDS:
            validate_name(self.type_name)
        if not 0 <= self.partition < self.partitions:
            raise ValueError(f"partition {self.partition} of {self.partitions} does not exist")

    @property
    def tag(self) -> str:
        """The hash tag every key of this type (partition) shares, braces included."""
        if self.type_name == BATCH_TYPE:  # a batch shard (see shards.batch_tag)
            return "{" + batch_tag(self.prefix, self.partition) + "}"
        if self.partitions == 1:
            return f"{{{self.prefix}:{self.type_name}}}"
        return (
            "{" + partition_tag(self.prefix, self.type_name, self.partition, self.partitions) + "}"
        )

    def _key(self, suffix: str) -> str:
        return f"{self.tag}:{suffix}"

    @property
    def events(self) -> str:
        """HASH id -> envelope."""
        return self._key("events")

    @property
    def scheduled(self) -> str:
        """ZSET id -> due time in ms."""
        return self._key("scheduled")

    @property
    def ready(self) -> str:
        """LIST of ready entries."""
        return self._key("ready")

    @property
    def queued(self) -> str:
        """ZSET of ids in the ready list that no consumer has claimed yet."""
        return self._key("queued")

    @property
    def inflight(self) -> str:
        """ZSET id -> lease deadline in ms."""
        return self._key("inflight")

    @property
    def leases(self) -> str:
        """HASH id -> claim token."""
        return self._key("leases")

    @property
    def attempts(self) -> str:
        """HASH id -> number of deliveries so far."""
        return self._key("attempts")

    @property
    def errors(self) -> str:
        """HASH id -> last failure."""
        return self._key("errors")

    @property
    def dead(self) -> str:
        """ZSET id -> dead-letter time in ms."""
        return self._key("dead")

    @property
    def meta(self) -> str:
        """HASH of counters and the scheduler's wake mark."""
        return self._key("meta")

    def all(self) -> tuple[str, ...]:
        """Every key of the type, in the order the Lua scripts that need all of them expect."""
        return (
            self.events,
            self.scheduled,
            self.ready,
            self.queued,
            self.inflight,
            self.leases,
            self.attempts,
            self.errors,
            self.dead,
            self.meta,
        )

    @property
    def groups(self) -> str:
        """HASH delivery group -> max deliveries (absent while no group is named)."""
        return self._key("groups")

    @property
    def pending(self) -> str:
        """HASH id -> number of groups still holding a fanned-out event."""
        return self._key("pending")

    @property
    def schedules(self) -> str:
        """HASH name -> definition of the recurring schedules firing into this shard."""
        return self._key("schedules")

    @property
    def schedule_state(self) -> str:
        """HASH name -> state (the mark of the last slot fired, ...) of those schedules."""
        return self._key("schedule-state")

    @property
    def results(self) -> str:
        """HASH id -> outcome of a finished event of a type that keeps results
        (``results=`` class option): ``"o"`` + the serializer's mark + the encoded return
        value, or ``"f"`` + the dead letter's error (see :mod:`delayq.results`)."""
        return self._key("results")

    @property
    def rexp(self) -> str:
        """ZSET id -> when (Redis time, ms) the kept outcome in :attr:`results` expires."""
        return self._key("rexp")

    def sink(self, name: str) -> str:
        """ZSET id -> micro-batch id: the ledger of the Spark streaming sink ``name``
        (``delayq.spark.stream_sink``), one per type partition; it holds one batch's ids."""
        validate_name(name, "sink name")
        return self._key(f"sink:{name}")

    def progress(self, group: str | None = None) -> str:
        """HASH id -> ``token NUL progress`` of running handlers that reported progress, of the
        type (``None``: its default group) or a named group; expires a day after its last
        write."""
        return self._key("progress") if group is None else self.group_key(group, "progress")

    def group_key(self, group: str, suffix: str) -> str:
        """The key ``suffix`` of one named delivery group."""
        return self._key(f"g:{group}:{suffix}")

    def view(self, group: str | None = None) -> KeyView:
        """One delivery group's view of the type (``None``: the default group).

        The default group's are the type's own keys (:meth:`all`), then the registry,
        ``pending`` and its retry schedule; a named group's are the type's envelopes,
        the group's own keys (its retries as ``scheduled``), the registry, ``pending``
        and its retries again.
        """
        if group is None:
            retries = self.group_key(DEFAULT_GROUP, "scheduled")
            return KeyView._make((*self.all(), self.groups, self.pending, retries))
        retries = self.group_key(group, "scheduled")
        return KeyView._make(
            (self.events, *self.group_keys(group), self.groups, self.pending, retries)
        )

    def read_view(self, group: str) -> KeyView:
        """The view the read-only scripts take to show one group of a type with groups.

        As :meth:`view`, but ``scheduled`` is always the type's own schedule (events
        not fanned out yet, which every group will get) and ``retries`` the group's
        retry schedule: ``counts``, ``scheduled_list`` and ``due_histogram`` count or
        merge both, so they show what the group will receive. For the default group
        this is exactly :meth:`view` of it.
        """
        if group == DEFAULT_GROUP:
            return self.view()
        return self.view(group)._replace(scheduled=self.scheduled)

    def named(self, group: str | None = None, *, read: bool = False) -> dict[str, str]:
        """Every name of :data:`~delayq.keyspace.scripts.TYPE_KEYS` -> its key, for one
        delivery group (``None``: the default group): what scripts are given.

        With ``read``, the view the read-only scripts take (:meth:`read_view`); for the
        default group (``None``) ``retries`` is then the type's own schedule (which they
        must not count twice) and the other read scripts leave it off.
        """
        if not read:
            view = self.view(group)
        elif group is None:
            view = self.view()._replace(retries=self.scheduled)
        else:
            view = self.read_view(group)
        lines = self.key_lines(stored_group(group))
        return {
            **view._asdict(),
            "limits": self.limits(group),
            "wake": self.wake(group),
            "dedup": self.dedup,
            "deps": self.deps,
            "relay": self.relay,
            "waiting": self.waiting,
            "fkeys": self.fkeys,
            **dict(zip(("klines", "krot", "kwait", "krun"), lines, strict=True)),
            "prio": self.prio,
            **dict(zip(LEVEL_KEYS, self.level_lists(stored_group(group)), strict=True)),
            "schedules": self.schedules,
            "schedule_state": self.schedule_state,
            "results": self.results,
            "rexp": self.rexp,
            "progress": self.progress(stored_group(group)),
            **(self._batch_names() if self.type_name == BATCH_TYPE else {}),
        }

    # -- a batch shard's own keys (docs/WORKFLOWS.md, "Batches"; see lua/_batches.lua):
    # the shard's `events`, `deps`, `relay` serve the batches as parents of their
    # callbacks, as a type's serve its events

    def _batch_names(self) -> dict[str, str]:
        return {
            "bindex": self.batch_index,
            "bopen": self.batch_open,
            "bclosed": self.batch_closed,
            "bdone": self.batch_done,
            "bunconf": self.batch_unconfirmed,
            "baudit": self.batch_audit,
        }

    @property
    def batch_index(self) -> str:
        """ZSET batch id -> when it was opened (ms): every batch of the shard."""
        return self._key("index")

    @property
    def batch_open(self) -> str:
        """ZSET batch id -> when its open lease runs out (ms): the open batches."""
        return self._key("open")

    @property
    def batch_closed(self) -> str:
        """ZSET batch id -> when a member last finished, or it closed (ms): the closed
        batches with members pending."""
        return self._key("closed")

    @property
    def batch_done(self) -> str:
        """ZSET batch id -> when it was done (ms): kept for the retention, then removed."""
        return self._key("done")

    @property
    def batch_unconfirmed(self) -> str:
        """ZSET ``"<batch id> NUL <member ref>"`` -> when the sweep settles that add if its
        producer has not confirmed it (ms)."""
        return self._key("unconfirmed")

    @property
    def batch_audit(self) -> str:
        """ZSET batch id -> when the sweep next looks at its pending members again (a
        member gone without a completion counts as vanished): the closed batches with
        members pending."""
        return self._key("audit")

    def batch(self, batch_id: str) -> tuple[str, str, str]:
        """One batch's own keys, in the order of :data:`~delayq.keyspace.scripts.BATCH_KEYS`:
        its record (HASH), its members (HASH ref -> outcome), its failed members (LIST)."""
        record = self._key(f"b:{batch_id}")
        return record, f"{record}:m", f"{record}:f"

    def group_call(self, script: str, names: Sequence[str], groups: Sequence[str]) -> list[str]:
        """The keys of ``script``, one of ``scripts.GROUPED``, on every delivery group: the
        default group's view of the type by ``names``, then each group's own keys, then
        each group's flow-key state, then the type's ``fkeys``, then (the scripts of
        ``scripts.GROUP_LEVELLED``) each group's ready lists of levels 1..9."""
        view = self.named()
        keys = [view[name] for name in names]
        for group in groups:
            keys.extend(self.group_keys(group))
        for group in groups:
            keys.extend(self.key_lines(stored_group(group)))
        keys.append(self.fkeys)
        if script in GROUP_LEVELLED:
            for group in groups:
                keys.extend(self.level_lists(stored_group(group)))
        return keys

    def limits(self, group: str | None = None) -> str:
        """HASH of the flow limits of the type (``None``: its default group) or a named
        group; exists only while a limit is set (see :mod:`delayq.flow.limits`)."""
        return self._key("limits") if group is None else self.group_key(group, "limits")

    @property
    def dedup(self) -> str:
        """ZSET of the dedup modes' marks: ``d:<id>`` -> end of its debounce window,
        ``u:<id>`` -> refused until (or -ttl while not handled yet); see enqueue.lua."""
        return self._key("dedup")

    @property
    def deps(self) -> str:
        """HASH of the type's dependency edges (docs/WORKFLOWS.md, "Dependencies"): as a
        parent, the children linked to each id and its completions not relayed yet; as a
        child, each waiting id's parents and their outcomes (see ``lua/_deps.lua``)."""
        return self._key("deps")

    @property
    def relay(self) -> str:
        """ZSET of the relay's work in this shard, member -> when due (ms): ``c``-members are
        completions of parents to hand to their children, ``a``-members audits of waiting
        children (see ``lua/_deps.lua``)."""
        return self._key("relay")

    @property
    def waiting(self) -> str:
        """ZSET id -> its own due time (ms) of the events waiting for their parents."""
        return self._key("waiting")

    def wake(self, group: str | None = None) -> str:
        """LIST of wake-up tokens for consumers waiting for a flow-limited slot."""
        return self._key("wake") if group is None else self.group_key(group, "wake")

    @property
    def fkeys(self) -> str:
        """HASH id -> flow key of the type's keyed events, and ``""`` -> 1 once the type
        uses flow keys (docs/FLOW.md, "Flow keys"; see ``lua/_prelude.lua``)."""
        return self._key("fkeys")

    def key_lines(self, group: str | None = None) -> tuple[str, str, str, str]:
        """The flow keys' state of the type (``None``: its default group) or a named group:
        ``klines`` (ZSET: each key's line of ready events), ``krot`` (ZSET: keys in
        rotation), ``kwait`` (ZSET: keys parked by a per-key limit), ``krun`` (ZSET: the
        keys' live deliveries). They exist only once the type uses flow keys."""
        names = ("klines", "krot", "kwait", "krun")
        if group is None:
            return tuple(self._key(n) for n in names)  # type: ignore[return-value]
        return tuple(self.group_key(group, n) for n in names)  # type: ignore[return-value]

    @property
    def prio(self) -> str:
        """HASH id -> priority level (1..9) of each event not at level 0; exists only while
        the type has such events (docs/guides/priorities.md)."""
        return self._key("prio")

    def level_lists(self, group: str | None = None) -> tuple[str, ...]:
        """The ready lists of priority levels 1..9 of the type (``None``: its default group)
        or a named group (level 0's is :attr:`KeyView.ready`); a level's list exists only
        while it holds entries."""
        if group is None:
            return tuple(self._key(f"ready:{n}") for n in range(1, LEVELS))
        return tuple(self.group_key(group, f"ready:{n}") for n in range(1, LEVELS))

    def group_keys(self, group: str) -> tuple[str, ...]:
        """The keys of one group in the order of :data:`~delayq.keyspace.scripts.GROUP_KEYS`
        (the default group's: its retries and the type's own)."""
        if group != DEFAULT_GROUP:
            return tuple(self.group_key(group, n) for n in GROUP_KEYS)
        own = self.view()._replace(scheduled=self.group_key(group, "scheduled"))
        return tuple(getattr(own, n) for n in GROUP_KEYS)
