"""The schedule operations behind ``EventService.schedule`` and friends, and what they return."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import timezone as _timezone
from typing import Any

import msgspec

from ..codec import Codec, check_context
from ..events import Event, EventTypes, check_event_type, validate_name
from ..flow.priorities import check_priority
from ..metrics import Metrics
from ..observer import Observer
from ..partitions.shards import shard_for, type_of
from ..storage.store import Store
from .firing import write_fires
from .identity import canonical_template, same_definition
from .spec import (
    OVERLAPS,
    ScheduleSpec,
    check_cron,
    check_template,
    check_timezone,
    decode_spec,
    encode_spec,
    next_look,
    next_slot,
    trigger_id,
)
from .state import ScheduleState

UTC = _timezone.utc

__all__ = ["ScheduleInfo", "Schedules"]

log = logging.getLogger("delayq.schedules")

_MIN_EVERY_MS = 100
_PLACEHOLDER_ID = "x"


def _dt(ms: int | None) -> datetime | None:
    return None if not ms else datetime.fromtimestamp(ms / 1000, UTC)


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One schedule as ``schedules()`` lists it (times are aware UTC datetimes)."""

    name: str
    event_type: str
    """The wire name of the type it fires."""
    cron: str | None
    """The cron expression (aliases expanded), or None for an ``every`` schedule."""
    every: timedelta | None
    timezone: str
    next_fire: datetime | None
    """The next slot (None while paused or after ``end_at``); in the past while overdue."""
    last_fire: datetime | None
    """When the last slot was fired (Redis's clock)."""
    last_slot: datetime | None
    """The nominal time of the last slot fired."""
    last_event_id: str | None
    paused: bool
    overlap: str
    catch_up: timedelta | None
    jitter: timedelta
    start_at: datetime | None
    end_at: datetime | None
    fires: int
    """Slots fired so far (manual triggers not included)."""
    skipped: int
    """Slots skipped by the overlap policy."""
    triggers: int
    """Manual fires (``trigger_schedule``)."""
    payload: dict[str, Any] = field(default_factory=dict)
    """The payload every fire carries (decoded without the event class)."""
    context: dict[str, str] = field(default_factory=dict)
    buffered: datetime | None = None
    """The slot of the fire ``overlap="buffer_one"`` holds back until the one before it
    has left (None: none is held)."""
    priority: int = 0
    """The priority level of its fires (0 the most urgent; docs/guides/priorities.md)."""

    @property
    def expression(self) -> str:
        """The cron expression, or ``every 0:05:00``."""
        return self.cron if self.cron is not None else f"every {self.every}"

    @property
    def lag(self) -> timedelta | None:
        """How late the last fire was: its actual time minus its slot's nominal time.

        Negative as a rule: fires are written up to 200 ms ahead, due at their slot."""
        if self.last_fire is None or self.last_slot is None:
            return None
        return self.last_fire - self.last_slot


def _payload_of(template: bytes) -> dict[str, Any]:
    try:
        if template[:1] == b"[":
            env = msgspec.json.decode(template)
        else:
            env = msgspec.msgpack.decode(template)
        body = env[0] if isinstance(env, list) and env else {}
        return dict(body) if isinstance(body, dict) else {"value": body}
    except (msgspec.DecodeError, TypeError, ValueError):
        return {}


def _context_of(template: bytes) -> dict[str, str]:
    try:
        env = (msgspec.json.decode if template[:1] == b"[" else msgspec.msgpack.decode)(template)
        ctx = env[2] if isinstance(env, list) and len(env) > 2 else None
        return dict(ctx) if isinstance(ctx, dict) else {}
    except (msgspec.DecodeError, TypeError, ValueError):
        return {}


def info_of(spec: ScheduleSpec, state: ScheduleState) -> ScheduleInfo:
    """What ``schedules()`` shows of a stored definition and state."""
    return ScheduleInfo(
        name=spec.name,
        event_type=spec.event_type,
        cron=spec.cron,
        every=None if spec.every_ms is None else timedelta(milliseconds=spec.every_ms),
        timezone=spec.timezone,
        next_fire=None if state.paused else _dt(next_slot(spec, state.mark_ms)),
        last_fire=_dt(state.last_fire_ms),
        last_slot=_dt(state.last_slot_ms),
        last_event_id=state.last_id or None,
        paused=state.paused,
        overlap=spec.overlap,
        catch_up=None if spec.catch_up_ms is None else timedelta(milliseconds=spec.catch_up_ms),
        jitter=timedelta(milliseconds=spec.jitter_ms),
        start_at=_dt(spec.start_ms),
        end_at=_dt(spec.end_ms),
        priority=spec.priority,
        fires=state.fires,
        skipped=state.skipped,
        triggers=state.triggers,
        payload=_payload_of(spec.template),
        context=_context_of(spec.template),
        buffered=_dt(state.buffered_slot_ms),
    )


def _next(spec: ScheduleSpec, state: ScheduleState, now_ms: int) -> int | None:
    """What the index says of a schedule after a write: when the firer next looks."""
    if state.paused:
        return None
    return next_look(spec, state.mark_ms, state.buffered_slot_ms, now_ms)


def _duration_ms(value: object, what: str, *, allow_zero: bool = True) -> int:
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise TypeError(f"{what} must be a timedelta (or seconds), not {value!r}")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    ms = round(seconds * 1000)
    if ms < 0 or (ms == 0 and not allow_zero):
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else 'positive'}: {value!r}")
    return ms


def _time_ms(value: object, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise TypeError(f"{what} must be a timezone-aware datetime, not {value!r}")
    return round(value.timestamp() * 1000)


class Schedules:
    """Creating, reading and changing schedules (``EventService`` delegates here)."""

    def __init__(
        self,
        store: Store,
        codec: Codec,
        types: EventTypes,
        metrics: Metrics,
        observer: Observer | None = None,
    ):
        self._store = store
        self._observer = observer
        self._codec = codec
        self._types = types
        self._metrics = metrics

    def build(
        self,
        name: str,
        event_type: type[Event],
        *,
        cron: str | None,
        every: timedelta | float | None,
        timezone: str,
        payload: Mapping[str, Any] | None,
        context: Mapping[str, str] | None,
        overlap: str,
        catch_up: timedelta | float | None,
        jitter: timedelta | float | None,
        start_at: datetime | None,
        end_at: datetime | None,
        priority: int | None = None,
    ) -> ScheduleSpec:
        """Check every argument and return the definition to store (nothing is written);
        ``priority`` None: the event class's default level."""
        validate_name(name, "schedule name")
        level = event_type.event_priority if priority is None else check_priority(priority)
        check_event_type(event_type)
        type_name = self._types.register(event_type)
        check_timezone(timezone)
        if (cron is None) == (every is None):
            raise TypeError("give exactly one of cron= and every=")
        expr = None if cron is None else check_cron(cron, timezone)
        every_ms = None
        if every is not None:
            every_ms = _duration_ms(every, "every", allow_zero=False)
            if every_ms < _MIN_EVERY_MS:
                raise ValueError(f"every must be at least {_MIN_EVERY_MS} ms: {every!r}")
        if overlap not in OVERLAPS:
            raise ValueError(f"overlap must be one of {', '.join(OVERLAPS)}: {overlap!r}")
        catch_up_ms = None if catch_up is None else _duration_ms(catch_up, "catch_up")
        jitter_ms = 0 if jitter is None else _duration_ms(jitter, "jitter")
        start_ms, end_ms = _time_ms(start_at, "start_at"), _time_ms(end_at, "end_at")
        if start_ms is not None and end_ms is not None and end_ms <= start_ms:
            raise ValueError("end_at must be after start_at")
        if event_type.__struct_config__.array_like:
            check_template(b"")  # raises: such types keep the id inside the body
        if payload is None:
            payload = {}
        if not isinstance(payload, Mapping):
            raise TypeError(f"payload must be a mapping of {event_type.__name__}'s fields")
        if "id" in payload:
            raise ValueError("payload may not hold 'id': each fire's id is derived from the slot")
        unknown = sorted(set(map(str, payload)) - set(event_type.__struct_fields__))
        if unknown:
            raise ValueError(
                f"payload is not a valid {event_type.__name__}: unknown fields {unknown}"
            )
        try:
            event = msgspec.convert({**payload, "id": _PLACEHOLDER_ID}, event_type)
        except msgspec.ValidationError as exc:
            raise ValueError(f"payload is not a valid {event_type.__name__}: {exc}") from None
        # no encode time, context keys in order: the same declaration, the same version
        template = canonical_template(self._codec.encode(event, check_context(context)))
        check_template(template)
        spec = ScheduleSpec(
            name=name,
            event_type=type_name,
            partitions=event_type.event_partitions,
            cron=expr,
            every_ms=every_ms,
            timezone=timezone,
            template=template,
            overlap=overlap,
            catch_up_ms=catch_up_ms,
            jitter_ms=jitter_ms,
            start_ms=start_ms,
            end_ms=end_ms,
            priority=level,
        )
        return spec.with_version()

    async def upsert(self, spec: ScheduleSpec) -> ScheduleInfo:
        """Create the schedule or update it in place (by name); return it as now stored."""
        shard = shard_for(spec.event_type, spec.name, spec.partitions)
        home = await self._store.schedules.schedule_home(spec.name)
        if home is not None and home != shard:
            if type_of(home) != spec.event_type:
                raise ValueError(
                    f"schedule {spec.name!r} fires {type_of(home)} events; unschedule it "
                    f"before using the name for {spec.event_type}"
                )
            # the type's partition count changed: the schedule moves to its new home
            # (its new mark is now, later than any slot the old one fired)
            removed = await self._store.schedules.schedule_write(home, "remove", spec.name)
            await self._store.schedules.schedule_index([(spec.name, removed.gen, "", None)])
        # the stored version says whether the definition changed (the mark moves then)
        data = encode_spec(spec)
        w = await self._store.schedules.schedule_write(
            shard, "upsert", spec.name, data, spec.version, "?"
        )
        if w.differs:
            # another version: a change, unless it is this definition as an older release
            # stored it (with its encode time); the script replaces exactly that version
            assert w.state is not None and w.definition is not None
            same = same_definition(w.definition, spec)
            old = ScheduleState.decode(w.state).version if same else ""
            w = await self._store.schedules.schedule_write(
                shard, "upsert", spec.name, data, spec.version, old
            )
        assert w.state is not None
        state = ScheduleState.decode(w.state)
        nxt = _next(spec, state, w.now_ms)
        await self._store.schedules.schedule_index([(spec.name, w.gen, shard, nxt)], publish=True)
        return info_of(spec, state)

    async def _read(self, name: str) -> tuple[str, ScheduleSpec, ScheduleState] | None:
        shard = await self._store.schedules.schedule_home(name)
        if shard is None:
            return None
        w = await self._store.schedules.schedule_write(shard, "read", name)
        if w.state is None or w.definition is None:
            return None
        return shard, decode_spec(w.definition), ScheduleState.decode(w.state)

    async def get(self, name: str) -> ScheduleInfo | None:
        """One schedule, or None."""
        found = await self._read(name)
        return None if found is None else info_of(found[1], found[2])

    async def list(self) -> list[ScheduleInfo]:
        """Every schedule under the prefix, by name."""
        by_shard: dict[str, list[str]] = {}
        for name, shard in (await self._store.schedules.schedule_homes()).items():
            by_shard.setdefault(shard, []).append(name)
        out: list[ScheduleInfo] = []
        for shard, names in by_shard.items():
            for i in range(0, len(names), 1000):
                chunk = names[i : i + 1000]
                for data, raw in await self._store.schedules.schedule_load(shard, chunk):
                    if data is not None and raw is not None:
                        out.append(info_of(decode_spec(data), ScheduleState.decode(raw)))
        return sorted(out, key=lambda i: i.name)

    async def remove(self, name: str) -> bool:
        """Delete a schedule; its fires already enqueued stay. False if there was none."""
        shard = await self._store.schedules.schedule_home(name)
        if shard is None:
            return False
        w = await self._store.schedules.schedule_write(shard, "remove", name)
        await self._store.schedules.schedule_index([(name, w.gen, "", None)], publish=True)
        return w.found

    async def set_paused(self, name: str, paused: bool) -> bool:
        """Pause or resume; False when there is no such schedule.

        A resumed schedule fires its next slot after now: slots that came while
        it was paused are not fired late.
        """
        shard = await self._store.schedules.schedule_home(name)
        if shard is None:
            return False
        w = await self._store.schedules.schedule_write(shard, "pause" if paused else "resume", name)
        if not w.found or w.state is None or w.definition is None:
            return False
        state = ScheduleState.decode(w.state)
        nxt = _next(decode_spec(w.definition), state, w.now_ms)
        await self._store.schedules.schedule_index([(name, w.gen, shard, nxt)], publish=True)
        return True

    async def trigger(self, name: str) -> str | None:
        """Fire once now, besides the regular slots (paused or not); the event id, or None."""
        found = await self._read(name)
        if found is None:
            return None
        shard, spec, _ = found
        now = await self._store.browsing.server_time_ms()
        event_id = trigger_id(name, now, spec.partitions)
        fire = (name, spec.version, "T", event_id, now, "allow", spec.template, now, spec.priority)
        (result,) = await write_fires(self._store, self._observer, shard, now, [fire], trigger=True)
        if result[3]:  # the script also let a buffered fire go (its predecessor had left)
            self._metrics.increment("schedule_fires", event_type=spec.event_type)
        if result[0] not in (1, 3):
            return None
        self._metrics.increment("schedule_triggers", event_type=spec.event_type)
        return event_id
