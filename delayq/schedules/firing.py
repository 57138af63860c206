"""The firing loop: fires every schedule's due slots, on time, from any number of processes.

Every process that runs the scheduler runs one :class:`ScheduleFirer`. It
sleeps until the earliest next fire in the prefix's index (one ZSET for all
schedules: no per-schedule polling), reads what is due in one script, and
fires each due slot with ``schedule_fire.lua`` in the schedule's type shard.
The scheduler leader's firer acts at the slot; the others look
``takeover_delay`` later and find it done (or fire it, if the leader died):
the script fires a slot at most once, so racing firers are harmless and
the lock only decides who is on time.

Users without schedules pay nothing: the firer reads the index once at start
and then sleeps until a wake-up (``schedule()`` publishes ``:schedules`` on
the scheduler's wake-up channel, and the scheduler forwards it, as it does
after every resubscription). Once it has seen a schedule it also re-reads the
index every ``sweep`` seconds in case a wake-up was lost.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

import anyio

from .._pacing import Stoppable, Wakeup, poll
from ..metrics import Metrics
from ..observer import Observer
from ..partitions.shards import type_of
from ..storage.store import Store
from .spec import (
    ScheduleSpec,
    decode_spec,
    due_slots,
    fire_id,
    jitter_ms,
    next_look,
    next_slot,
    restamp,
)
from .state import ScheduleState

__all__ = ["ScheduleFirer", "write_fires"]

# A fire to write: (name, definition version, slot ms or 'T' (trigger) or 'P' (only look
# at a buffered fire), event id, due ms, overlap, the definition's envelope template,
# the slot ms its event carries)
# name, version, slot ('T', 'P'), id, due ms, overlap, template, slot ms, priority level
Planned = tuple[str, str, str, str, int, str, bytes, int, int]

# schedule_fire.lua's codes, as a fire's send span names them
OUTCOMES = {
    1: "fired",
    3: "kept",
    2: "skipped",
    4: "buffered",
    0: "done",
    -1: "stale",
    -2: "gone",
    -3: "paused",
    5: "looked",
}


async def write_fires(
    store: Store,
    observer: Observer | None,
    shard: str,
    now: int,
    planned: Sequence[Planned],
    *,
    trigger: bool = False,
) -> list[tuple[int, int, int, int, int]]:
    """Write fires in one ``schedule_fire.lua`` call, each in a send span when tracing is
    on (its context stored in the fire's event); the script's answer per fire."""
    spans = None
    if observer is not None and observer.tracing is not None:
        spans = observer.firing(
            type_of(shard), [(p[3], p[0], p[7]) for p in planned if p[2] != "P"], trigger=trigger
        )
    carriers = iter(spans.carriers) if spans is not None else None
    fires: list[tuple[str, str, str, str, int, bytes, str, int]] = []
    for name, version, slot_arg, event_id, due, overlap, template, slot, level in planned:
        if slot_arg == "P":
            fires.append((name, version, slot_arg, "", 0, b"", overlap, level))
            continue
        extra = None if carriers is None else next(carriers)
        envelope = restamp(template, now, name, slot, extra)
        fires.append((name, version, slot_arg, event_id, due, envelope, overlap, level))
    if spans is None:
        return await store.schedules.schedule_fire(shard, fires)
    try:
        results = await store.schedules.schedule_fire(shard, fires)
    except BaseException as exc:
        spans.end(None, exc)
        raise
    outcomes = [
        OUTCOMES.get(r[0], str(r[0])) for p, r in zip(planned, results, strict=True) if p[2] != "P"
    ]
    spans.end(outcomes, None)
    return results


log = logging.getLogger("delayq.schedules")

# A schedule the index lists but its shard lacks (removed meanwhile), or whose definition is
# not its state's version (written by something else than schedule_write.lua), is looked at
# again then.
_RETRY_MS = 5000
# A fire more than this late (ms) counts as a catch-up fire.
CATCH_UP_MS = 1000
# Slots are fired this long (ms) before their time: the event is written into the
# type's schedule due at the slot, and the scheduler moves it then, as precisely as any
# delayed event (the firer's own round trips do not add to its lateness).
AHEAD_MS = 200
# A schedule whose next slot is already due but which has nothing to fire (its slot math
# disagreeing with itself) is looked at again this long (ms) later, never at once: no spin.
_NOTHING_DUE_MS = 1000


class ScheduleFirer(Stoppable):
    """The loop that fires due slots; run it with :meth:`run`, end it with :meth:`stop`."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        *,
        is_leader: Callable[[], bool],
        takeover_delay: float,
        sweep: float,
        batch: int = 500,
        observer: Observer | None = None,
    ):
        super().__init__()
        self._store = store
        self._metrics = metrics
        self._observer = observer
        self._is_leader = is_leader
        self._delay = takeover_delay
        self._sweep = sweep
        self._batch = batch
        self._woken = False
        self._seen = False  # schedules exist (then the index is re-read every sweep)
        self._wake = Wakeup()
        self._specs: dict[tuple[str, str], ScheduleSpec] = {}  # (name, version) -> spec
        self._warned: set[tuple[str, int]] = set()  # (name, mark) told about (_next_look)
        self.passes = 0
        """How many times the index has been read (tests and benchmarks look)."""

    def wake(self) -> None:
        """Read the index now (a schedule was written, or wake-ups may have been missed)."""
        self._woken = True
        self._wake.set()

    async def run(self) -> None:
        """Fire due slots until :meth:`stop`."""
        self._wake.renew()
        with anyio.CancelScope() as self._scope:
            await poll(
                self._turn,
                wake=self._wake,
                stopping=lambda: self._stopping,
                log=log,
                what="firing schedules",
                on_error=lambda: self._metrics.increment("redis_errors"),
            )

    async def _turn(self) -> float:
        """One pass; 0 when woken meanwhile (the index may have changed)."""
        self._woken = False
        sleep_for = await self._pass()
        return 0.0 if self._woken else sleep_for

    async def _pass(self) -> float:
        """Fire what is due; return how long to sleep."""
        leader = self._is_leader()
        while True:
            now, nxt, due = await self._store.schedules.schedules_due(self._batch, AHEAD_MS)
            read_at = time.monotonic()
            self.passes += 1
            if due:
                self._seen = True
                written = await self._fire(now, due)
                if len(due) >= self._batch:
                    continue
                if written is not None and (nxt is None or written < nxt):
                    nxt = written
            break
        if nxt is None:
            return self._sweep if self._seen else math.inf
        self._seen = True
        wait = (nxt - AHEAD_MS - now) / 1000 - (time.monotonic() - read_at)
        if not leader:
            wait += self._delay
        return max(0.0, min(wait, self._sweep))

    def _spec(self, name: str, data: bytes, version: str) -> ScheduleSpec:
        spec = self._specs.get((name, version))
        if spec is None:
            spec = decode_spec(data)
            if spec.version != version:
                return spec  # never cached under another definition's version
            if len(self._specs) > 10_000:
                self._specs.clear()
            self._specs[name, version] = spec
        return spec

    async def _fire(self, now: int, due: list[tuple[str, int, str]]) -> int | None:
        """Fire what is due; return the earliest next fire written to the index."""
        by_shard: dict[str, list[tuple[str, int]]] = {}
        for name, gen, shard in due:
            by_shard.setdefault(shard, []).append((name, gen))
        earliest: int | None = None
        for shard, entries in by_shard.items():
            for *_, nxt in await self._fire_shard(now, shard, entries):
                if nxt is not None and (earliest is None or nxt < earliest):
                    earliest = nxt
        return earliest

    async def _fire_shard(
        self, now: int, shard: str, entries: list[tuple[str, int]]
    ) -> list[tuple[str, int, str, int | None]]:
        label = type_of(shard)
        loaded = await self._store.schedules.schedule_load(shard, [name for name, _ in entries])
        index: list[tuple[str, int, str, int | None]] = []
        fires: list[Planned] = []
        specs: dict[str, ScheduleSpec] = {}
        for (name, seen_gen), (data, raw_state) in zip(entries, loaded, strict=True):
            if data is None or raw_state is None:
                # removed meanwhile: look again later, unless the index learnt of it first
                index.append((name, seen_gen, shard, now + _RETRY_MS))
                continue
            # read together (schedule_load.lua): the definition is the state's version's
            state = ScheduleState.decode(raw_state)
            spec = self._spec(name, data, state.version)
            if spec.version != state.version:
                index.append((name, seen_gen, shard, now + _RETRY_MS))
                continue
            if state.paused:
                index.append((name, state.gen, shard, None))
                continue
            slots, missed = due_slots(spec, state.mark_ms, now + AHEAD_MS)
            if missed:
                self._metrics.increment("schedule_missed", missed, event_type=label)
                log.info("schedule %s: %d slots missed (catch-up policy)", name, missed)
            if not slots and not state.buffered_slot_ms:
                index.append((name, state.gen, shard, self._next_look(spec, state.mark_ms, now)))
                continue
            specs[name] = spec
            if state.buffered_slot_ms:
                # a fire is held back (buffer_one): the script releases it first if the
                # fire before it has left
                fires.append((name, spec.version, "P", "", 0, spec.overlap, b"", 0, spec.priority))
            for slot in slots:
                fires.append(
                    (
                        name,
                        spec.version,
                        str(slot),
                        fire_id(name, slot, spec.partitions),
                        slot + jitter_ms(spec, slot),
                        spec.overlap,
                        spec.template,
                        slot,
                        spec.priority,
                    )
                )
        if fires:
            results = await write_fires(self._store, self._observer, shard, now, fires)
            last: dict[str, tuple[int, int, int, int]] = {}
            for item, (code, gen, mark, released, buffered) in zip(fires, results, strict=True):
                name = item[0]
                last[name] = (code, gen, mark, buffered)
                if released:
                    self._fired(label, now, released, held=True)
                    log.info("schedule %s: buffered slot %d fired", name, released)
                if code in (1, 3):
                    self._fired(label, now, int(item[2]))
                elif code == 2:
                    self._metrics.increment("schedule_skipped", event_type=label)
                    log.info(
                        "schedule %s: slot %s skipped (previous fire still pending)", name, item[2]
                    )
                elif code == 4:
                    log.info(
                        "schedule %s: slot %s buffered (previous fire still pending)", name, item[2]
                    )
            for name, (code, gen, mark, buffered) in last.items():
                if code >= 0:
                    nxt = next_look(specs[name], mark, buffered, now, AHEAD_MS)
                    index.append((name, gen, shard, nxt))
                # stale, gone, paused: the write that caused it updated the index
        await self._store.schedules.schedule_index(index)
        return index

    def _next_look(self, spec: ScheduleSpec, mark: int, now: int) -> int | None:
        """The index entry of a schedule with nothing to fire: its next slot, or, when that
        is already due (defence in depth: the slot lookups disagree), a second from now."""
        nxt = next_slot(spec, mark)
        if nxt is None or nxt > now + AHEAD_MS:
            return nxt
        if (spec.name, mark) not in self._warned:
            if len(self._warned) > 10_000:
                self._warned.clear()
            self._warned.add((spec.name, mark))
            log.warning(
                "schedule %s: slot %d is due but nothing fires; looking again every %d ms",
                spec.name,
                nxt,
                _NOTHING_DUE_MS,
            )
        return now + AHEAD_MS + _NOTHING_DUE_MS

    def _fired(self, label: str, now: int, slot: int, *, held: bool = False) -> None:
        self._metrics.increment("schedule_fires", event_type=label)
        # ahead of time counts as on time (the scheduler moves it at its slot); a buffered
        # fire's lag includes the time it was held
        lag = max(0, now - slot)
        self._metrics.observe("schedule_lag", lag / 1000, event_type=label)
        if lag > CATCH_UP_MS and not held:
            self._metrics.increment("schedule_catch_up", event_type=label)
