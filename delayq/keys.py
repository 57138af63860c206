"""The Redis key layout.

Every key of one event type shares the hash tag ``{prefix:type}``, so each Lua
script touches one cluster slot and no script spans two types. Keys that
belong to the whole prefix use the tag ``{prefix}``.

Per type (``{p:T}:...``):

========== ====== ===========================================================
events     HASH   id -> envelope (payload, context, enqueue time)
scheduled  ZSET   id -> due time (ms, Redis clock)
ready      LIST   ``"<due ms>:<id>"`` entries, pushed left, popped right
queued     ZSET   id -> push sequence number (>0) for ids in the ready list,
                  or -(ms when noticed popped but unclaimed)
inflight   ZSET   id -> lease deadline (ms)
leases     HASH   id -> claim token of the current delivery
attempts   HASH   id -> deliveries so far
errors     HASH   id -> last failure ("Type: message")
dead       ZSET   id -> time it became a dead letter (ms)
meta       HASH   ``pushed`` counter, ``claims`` counter, ``wake`` mark, ``enqueue``
                  (the last enqueue call id: tells a retried call from a new one)
groups     HASH   delivery group -> its max deliveries; exists only once a
                  group has been named (see delayq.operations.groups)
pending    HASH   id -> how many groups still hold a fanned-out event
limits     HASH   flow limits (concurrency, rate, paused, GCRA state); exists
                  only while a limit is set (see delayq.flow.limits)
wake       LIST   wake-up tokens for consumers waiting for a limited slot (TTL 1 s)
dedup      ZSET   debounce windows and unique_for marks (only once those modes are used)
fkeys      HASH   id -> flow key of keyed events (only once the type uses flow keys)
klines     ZSET   flow keys' lines of ready events; krot, kwait, krun: keys in
                  rotation, parked, running (per group; docs/FLOW.md "Flow keys")
sink:<n>   ZSET   id -> micro-batch id: the ledger of the Spark streaming sink
                  named n (exists only for types such a sink writes)
========== ====== ===========================================================

A type with ``N > 1`` partitions (``class T(Event, partitions=N)``) has all of
the keys above once per partition ``k``, under the hash tag ``{prefix:T#k/N.s}``
(``s``: a salt that places the partitions evenly over the cluster's slot
ranges, see delayq.partitions.shards.partition_tag); with ``N = 1`` the keys are
exactly the ones above.

Per delivery group ``G`` of a type with groups (``{p:T}:g:G:...``): scheduled
(the group's retries), ready, queued, inflight, leases, attempts, errors, dead
meta, limits and wake, as above but for that group alone. The default group keeps the
type's own keys, plus ``{p:T}:g:default:scheduled`` for its retries.

Per prefix (``{p}:...``): ``types`` (SET of type names), ``scheduler-lock``,
``workers`` (ZSET worker id -> expiry) with one ``worker:<id>`` STRING per live
process (TTL), and ``history:minute:<type>`` / ``history:coarse:<type>``
(HASH rings of at most 60 and 72 fields, see :mod:`delayq.runtime.history`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .events import validate_name
from .partitions.shards import parse_shard, partition_tag

__all__ = ["DEFAULT_GROUP", "KeyView", "PrefixKeys", "TypeKeys"]

DEFAULT_GROUP = "default"
"""The delivery group of handlers added without a ``group``: it uses the type's own keys."""


class KeyView(NamedTuple):
    """The 13 keys a per-type script takes, in order (``lua/_prelude.lua`` names them
    ``K_EVENTS`` ... ``K_GSCHED``): one delivery group's view of a type (shard).

    A tuple, so a script is given ``view[:n]``; read a key by name (``view.ready``).
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
    def scheduler_lock(self) -> str:
        """STRING holding the token of the scheduler currently moving due events."""
        return f"{{{self.prefix}}}:scheduler-lock"

    @property
    def wakeup_channel(self) -> str:
        """Pub/sub channel on which enqueues wake the scheduler early."""
        return f"{{{self.prefix}}}:wakeup"

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
        validate_name(self.type_name)
        if not 0 <= self.partition < self.partitions:
            raise ValueError(f"partition {self.partition} of {self.partitions} does not exist")

    @property
    def tag(self) -> str:
        """The hash tag every key of this type (partition) shares, braces included."""
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
        """The 13 keys the per-group scripts take (see ``lua/_prelude.lua``); ``None``
        is the default group.

        The ten keys of the group as the type's scripts expect them (the
        default group's are :meth:`all`), then the registry, ``pending`` and
        the group's retry schedule.
        """
        if group is None:
            retries = self.group_key(DEFAULT_GROUP, "scheduled")
            return KeyView._make((*self.all(), self.groups, self.pending, retries))
        g = self.group_keys(group)
        return KeyView._make((self.events, *g, self.groups, self.pending, g[0]))

    def read_view(self, group: str) -> KeyView:
        """The 13 keys the read-only scripts take to show one group of a type with groups.

        As :meth:`view`, but ``scheduled`` (KEYS[2]) is always the type's own
        schedule (events not fanned out yet, which every group will get) and
        KEYS[13] the group's retry schedule: ``counts``, ``scheduled_list`` and
        ``due_histogram`` count or merge both, so they show what the group will
        receive. For the default group this is exactly :meth:`view` of it.
        """
        if group == DEFAULT_GROUP:
            return self.view()
        g = self.group_keys(group)
        return KeyView._make((self.events, self.scheduled, *g[1:], self.groups, self.pending, g[0]))

    def limits(self, group: str | None = None) -> str:
        """HASH of the flow limits of the type (``None``: its default group) or a named
        group; exists only while a limit is set (see :mod:`delayq.flow.limits`)."""
        return self._key("limits") if group is None else self.group_key(group, "limits")

    @property
    def dedup(self) -> str:
        """ZSET of the dedup modes' marks: ``d:<id>`` -> end of its debounce window,
        ``u:<id>`` -> refused until (or -ttl while not handled yet); see enqueue.lua."""
        return self._key("dedup")

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

    def group_keys(self, group: str) -> tuple[str, ...]:
        """The nine keys of one group, in the order ``lua/_groups.lua`` expects."""
        if group == DEFAULT_GROUP:
            return (self.group_key(group, "scheduled"), *self.all()[2:])
        names = ("scheduled", "ready", "queued", "inflight", "leases", "attempts", "errors")
        return (*(self.group_key(group, n) for n in names),
                self.group_key(group, "dead"), self.group_key(group, "meta"))  # fmt: skip
