"""``drain``: run a service's handlers until nothing is ready or due, moving time as asked.

The service runs as it always does (scheduler, consumers, schedule firer); drain only
waits, on conditions it reads from Redis and from the consumers, until the selected
types are quiet: no handler running or settling, nothing ready or overdue that a
consumer could claim, no schedule slot due. With ``until`` it then moves the service's
clock (:func:`delayq.testing.advance`) to the next time anything of those types becomes
due (a scheduled event or retry, a schedule's slot, a rate-limit token, a lease that runs
out) and waits again, until the next such time is past ``until``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import anyio

from ..durations import delay_ms, due_unix_ms
from ..events import Event
from ..runtime.consumer import Consumer
from ..service import EventService
from ..storage.store import Throttle
from .clock import advance, runtime_of
from .recording import Delivered, Recorder

__all__ = ["MAX_STEPS", "drain"]

MAX_STEPS = 10_000
"""The most clock moves one ``drain(until=...)`` makes before it gives up (a schedule
firing every second, drained over a day, would need 86,400)."""

_POLL = 0.005  # seconds between two looks while handlers run


@dataclass
class _Look:
    """What one look at the selected types found."""

    busy: str | None  # why it is not quiet yet (None: quiet)
    next_ms: int | None  # the earliest time after now when work becomes due


async def drain(
    service: EventService,
    *,
    types: Iterable[type[Event] | str] | None = None,
    until: timedelta | float | datetime | None = None,
    raise_errors: bool = False,
    timeout: float = 30.0,
) -> list[Delivered]:
    """Run ``service``'s handlers until nothing is ready or due; the runs since the last
    ``drain`` (or since the service started), in the order they ended.

    ``types`` (classes or wire names) limits the waiting, and the runs returned, to those
    types (default: every type the service handles). With ``until`` (a ``timedelta`` or
    seconds from the service's clock, or an aware ``datetime``) the clock moves forward,
    one due time after another, and everything due up to ``until`` runs as if that time
    had passed: retries after their backoff, schedules' slots, rate-limited events; the
    clock ends at ``until``. With ``raise_errors`` the first exception a handler raises is
    raised here, with its traceback (the failure is still recorded: a retry or a dead
    letter). ``timeout``: real seconds to wait for handlers at each step.

    The service must be started and made by :func:`~delayq.testing.isolated_service` (or
    the ``delayq_service`` fixture), or built with ``tracing=Recorder()``.
    """
    recorder = _recorder(service)
    consumers = _consumers(service, types)
    names = {c.type_name for c in consumers}
    # from the last drain's end: a run that began before this call (an event enqueued
    # due now starts at once) is one of this drain's
    first = recorder.drained
    deadline = None if until is None else await _deadline(service, until)
    steps = 0
    while True:
        look = await _settle(service, consumers, recorder, first, raise_errors, timeout)
        if deadline is None:
            break
        now = await service.store.browsing.server_time_ms()
        target = deadline if look.next_ms is None else min(look.next_ms, deadline)
        if target <= now:
            break
        steps += 1
        if steps > MAX_STEPS:
            raise RuntimeError(
                f"drain(until=...) moved the clock {MAX_STEPS} times and work is still due "
                f"before {until!r}: drain a shorter span"
            )
        await advance(service, timedelta(milliseconds=target - now))
    recorder.drained = len(recorder.deliveries)
    runs = [d for d in recorder.deliveries[first:] if d.type in names]
    return await _with_results(service, consumers, runs)


async def _with_results(
    service: EventService, consumers: list[Consumer], runs: list[Delivered]
) -> list[Delivered]:
    """The successful runs of a type with ``results=`` get the value it kept."""
    keeping = {
        c.type_name: c.event_type
        for c in consumers
        if getattr(c.event_type, "event_results_ms", None) is not None
    }
    ok: dict[str, list[str]] = {}
    for run in runs:
        if run.type in keeping and run.outcome == "success":
            ok.setdefault(run.type, []).append(run.id)
    if not ok:
        return runs
    values: dict[tuple[str, str], object] = {}
    for type_name, ids in ok.items():
        outcomes = await service.results(keeping[type_name], ids)
        for event_id, outcome in outcomes.items():
            if outcome.status == "ok":
                values[type_name, event_id] = outcome.value
    return [
        replace(r, result=values[r.type, r.id])
        if r.outcome == "success" and (r.type, r.id) in values
        else r
        for r in runs
    ]


def _recorder(service: EventService) -> Recorder:
    recorder = service.options.tracing
    if not isinstance(recorder, Recorder):
        raise RuntimeError(
            "drain() reads the handler runs a delayq.testing.Recorder records: use the "
            "delayq_service fixture or isolated_service(), or build the service with "
            "tracing=Recorder()"
        )
    if not service.is_running:
        raise RuntimeError("drain() needs a started service: `await service.start()` first")
    return recorder


def _consumers(service: EventService, types: Iterable[type[Event] | str] | None) -> list[Consumer]:
    runtime = runtime_of(service)
    if runtime.scheduler is None:
        raise RuntimeError(
            "drain() needs the service's scheduler to move due events: it was built with "
            "enable_scheduling=False"
        )
    consumers = list(runtime.consumers.values())
    if not consumers:
        raise RuntimeError(
            "drain() found no handlers: register them with service.add_handler(EventType, "
            "handler) first"
        )
    if types is None:
        return consumers
    wanted = {t if isinstance(t, str) else t.event_name for t in types}
    missing = wanted - {c.type_name for c in consumers}
    if missing:
        raise ValueError(f"drain(types=...): no handler for {sorted(missing)}")
    return [c for c in consumers if c.type_name in wanted]


async def _deadline(service: EventService, until: timedelta | float | datetime) -> int:
    now = await service.store.browsing.server_time_ms()
    if isinstance(until, datetime):
        deadline = due_unix_ms(until)
        if deadline < now:
            raise ValueError(f"drain(until={until.isoformat()}) is before the service's clock")
        return deadline
    return now + delay_ms(until, "drain()'s until")


async def _settle(
    service: EventService,
    consumers: list[Consumer],
    recorder: Recorder,
    first: int,
    raise_errors: bool,
    timeout: float,
) -> _Look:
    """Wait until the selected types are quiet; what the last look found."""
    give_up = time.monotonic() + timeout
    while True:
        if raise_errors:
            for delivered in recorder.deliveries[first:]:
                if delivered.exception is not None:
                    raise delivered.exception
        look = await _look(service, consumers, recorder)
        if look.busy is None:
            return look
        if time.monotonic() >= give_up:
            raise TimeoutError(f"drain() waited {timeout:g} s and still: {look.busy}")
        await anyio.sleep(_POLL)


async def _look(service: EventService, consumers: list[Consumer], recorder: Recorder) -> _Look:
    """One look at the selected types: busy (and why), or quiet and when work comes next.

    Work moves on: from a schedule's slot to the type's schedule, to its ready list, to
    a claim, to a handler here, to its ack. The look reads those places in that order, so
    work that moves on while it reads is seen in a later place (read after it arrived
    there). Only a settled run sends work back to a place already read: a failure's retry
    to the schedule, an ack's released children, a lease that ran out to the ready list.
    A run that starts and settles within one look (claimed after its first check, ended
    before its last) is not seen by either check, so a look during which a run of these
    types ended (the recorder has more) proves nothing and is taken again.
    """
    busy = _unsettled(consumers)
    if busy:
        return _Look(busy, None)
    ended = len(recorder.deliveries)
    nearest = math.inf
    now = await service.store.browsing.server_time_ms()
    names = {c.type_name for c in consumers}
    for schedule in await service.schedules():
        if schedule.event_type not in names or schedule.paused or schedule.next_fire is None:
            continue
        fire = round(schedule.next_fire.timestamp() * 1000)
        if fire <= now:
            return _Look(f"schedule {schedule.name!r}: a slot is due, not fired yet", None)
        nearest = min(nearest, fire)
    for consumer in consumers:
        view = consumer.group or "default"
        counts = (await service.group_stats(consumer.type_name)).get(view)
        if counts is None:  # a named group not registered yet
            return _Look(f"{consumer.label}: its group is not registered yet", None)
        waiting = consumer.flow_waits.waiting
        if counts.due and not waiting and not counts.paused:
            return _Look(f"{consumer.label}: {counts.due} events due, not claimed yet", None)
        if counts.next_due_at is not None:
            due = round(counts.next_due_at.timestamp() * 1000)
            if due > now:
                nearest = min(nearest, due)
        for shard, throttle in list(waiting.items()):
            nearest = min(nearest, await _throttled_until(service, consumer, shard, throttle, now))
        if counts.in_flight:  # leases no handler here holds: they run out in their time
            held = await service.in_flight(consumer.type_name, limit=1, group=consumer.group)
            if held:
                deadline = round(held[0].lease_deadline.timestamp() * 1000)
                if deadline <= now:
                    return _Look(
                        f"{consumer.label}: a lease ran out, not handed out again yet", None
                    )
                nearest = min(nearest, deadline)
            else:  # settled, or back in the ready list, since the counts were read
                return _Look(f"{consumer.label}: a lease ended while looking", None)
    # last, the claims and handler runs here (a claim whose reply is on its way shows as
    # in flight in Redis, and as under way here until its run is settled)
    busy = _unsettled(consumers)
    if busy is None and any(d.type in names for d in recorder.deliveries[ended:]):
        busy = "a handler run ended while looking: its outcome may be in a place read before"
    return _Look(busy, None if nearest == math.inf else int(nearest))


def _unsettled(consumers: list[Consumer]) -> str | None:
    for consumer in consumers:
        if consumer.unsettled:
            return f"{consumer.label}: {consumer.unsettled} deliveries not settled"
    return None


async def _throttled_until(
    service: EventService, consumer: Consumer, shard: str, throttle: Throttle, now: int
) -> float:
    """When a claim held back by flow limits may go through (inf: paused)."""
    reason, wait_ms = throttle.reason, throttle.wait_ms
    if reason == "paused":
        return math.inf
    if reason == "rate" and wait_ms >= 1000:
        # the claim answers 1 s at most: the next token's time, as claim.lua's wait_ms
        # computes it, from the GCRA's state
        fields = await service.store.limits.read_limits(shard, consumer.group)
        try:
            n, period = int(fields[b"rate_n"]), int(fields[b"rate_ms"])
            burst, tat = int(fields[b"burst"]), float(fields[b"tat"])
        except (KeyError, ValueError):
            return now + wait_ms
        return now + max(1, math.ceil(tat - now - (burst - 1) * period / n) + 1)
    return now + max(1, wait_ms)
