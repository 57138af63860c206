"""The testing kit (delayq.testing: advance, drain, enqueued and its assertions) on a real
server: time moves for everything compared with Redis's clock, and nothing sleeps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import anyio
import pytest

from delayq import EventService, ScheduleInfo, events
from delayq.testing import (
    advance,
    assert_enqueued,
    assert_not_enqueued,
    drain,
    enqueued,
    isolated_service,
    now,
    wait_for,
)
from delayq.testing.clock import runtime_of


class Nudge(events.Event, event_name="kit-nudge"):
    text: str = ""


@pytest.fixture
async def service(redis_url: str) -> AsyncIterator[EventService]:
    async with isolated_service(redis_url) as svc:
        yield svc


async def test_an_event_three_hours_away_runs_after_advance(service: EventService) -> None:
    seen: list[str] = []

    async def handle(event: Nudge) -> None:
        seen.append(event.id)

    service.add_handler(Nudge, handle)
    await service.enqueue_with_delay(Nudge(id="n1", text="hi"), timedelta(hours=3))
    assert await drain(service) == []
    await assert_enqueued(service, Nudge, id="n1", due_in=timedelta(hours=3))
    await advance(service, timedelta(hours=2, minutes=59))
    assert await drain(service) == []
    await advance(service, timedelta(minutes=1))
    runs = await drain(service)
    assert [(r.type, r.id, r.attempt, r.outcome) for r in runs] == [
        ("kit-nudge", "n1", 1, "success")
    ]
    assert seen == ["n1"]
    await assert_not_enqueued(service, Nudge)


async def test_retries_follow_their_backoff_then_the_event_dead_letters(
    service: EventService,
) -> None:
    async def fail(event: Nudge) -> None:
        raise ValueError(f"no {event.id}")

    service.add_handler(Nudge, fail, retry_attempts=2, retry_backoff=lambda attempt: 60.0 * attempt)
    await service.enqueue_with_delay(Nudge(id="n2"), 0)
    start = await now(service)
    runs = await drain(service, until=timedelta(hours=1))
    assert [(r.attempt, r.outcome, r.error) for r in runs] == [
        (1, "retry", "ValueError: no n2"),
        (2, "retry", "ValueError: no n2"),
        (3, "dead", "ValueError: no n2"),
    ]
    # each retry ran when its backoff ended on the moved clock: 60 s, then 120 s later
    assert runs[0].at is not None and runs[1].at is not None and runs[2].at is not None
    assert timedelta(seconds=60) <= runs[1].at - runs[0].at < timedelta(seconds=61)
    assert timedelta(seconds=120) <= runs[2].at - runs[1].at < timedelta(seconds=121)
    assert timedelta(hours=1) <= await now(service) - start < timedelta(hours=1, seconds=1)
    assert [d.id for d in await service.dead_letters(Nudge)] == ["n2"]


@pytest.mark.parametrize(
    ("after", "backoff"),
    [
        # the counts showed the run in flight, its lease was gone when read
        ("group_stats", 60.0),
        # its lease was read too (it runs out after 15 s, later than the 1 s backoff)
        ("in_flight", 1.0),
    ],
)
async def test_a_retry_recorded_while_drain_looks_is_waited_for(
    service: EventService, monkeypatch: pytest.MonkeyPatch, after: str, backoff: float
) -> None:
    """A run claimed after a look's first check and failed before its last (a loaded
    machine): the look read the schedule before the retry went there, and drain moved the
    clock past the retry's due time (to ``until``, or to the lease's end)."""
    entered, gate = anyio.Event(), anyio.Event()

    async def fail(event: Nudge) -> None:
        if not entered.is_set():
            entered.set()
            await gate.wait()
        raise ValueError(f"no {event.id}")

    service.add_handler(Nudge, fail, retry_attempts=1, retry_backoff=lambda attempt: backoff)
    (consumer,) = runtime_of(service).consumers.values()
    schedules, read = service.schedules, getattr(service, after)
    looks = 0

    async def schedules_after_the_claim() -> list[ScheduleInfo]:
        nonlocal looks
        looks += 1
        if looks == 2:  # the look right after the clock moved to the event's due time
            with anyio.fail_after(10):
                await entered.wait()
        return await schedules()

    async def read_then_the_failure(*args: Any, **kwargs: Any) -> Any:
        found = await read(*args, **kwargs)
        if entered.is_set() and not gate.is_set():
            gate.set()
            await wait_for(lambda: consumer.unsettled == 0)
        return found

    monkeypatch.setattr(service, "schedules", schedules_after_the_claim)
    monkeypatch.setattr(service, after, read_then_the_failure)
    await service.enqueue_with_delay(Nudge(id="n9"), 60)
    runs = await drain(service, until=timedelta(hours=1))
    assert [(r.attempt, r.outcome) for r in runs] == [(1, "retry"), (2, "dead")]
    assert runs[0].at is not None and runs[1].at is not None
    assert 0 <= (runs[1].at - runs[0].at).total_seconds() - backoff < 1


async def test_raise_errors_raises_the_handlers_exception_with_its_traceback(
    service: EventService,
) -> None:
    async def broken(event: Nudge) -> None:
        raise KeyError("missing-" + event.id)

    service.add_handler(Nudge, broken)
    await service.enqueue_with_delay(Nudge(id="n3"), 0)
    with pytest.raises(KeyError, match="missing-n3") as caught:
        await drain(service, raise_errors=True)
    assert any(entry.name == "broken" for entry in caught.traceback)


async def test_debounce_and_unique_for_windows_move_with_the_clock(service: EventService) -> None:
    runs: list[tuple[str, str]] = []

    async def handle(event: Nudge) -> None:
        runs.append((event.id, event.text))

    service.add_handler(Nudge, handle)
    for text in ("a", "b", "c"):  # one minute apart: each pushes the due time on
        await service.enqueue_with_delay(
            Nudge(id="d", text=text), timedelta(minutes=2), debounce=timedelta(minutes=10)
        )
        await advance(service, timedelta(minutes=1))
    await assert_enqueued(
        service, Nudge, id="d", payload={"text": "c"}, due_in=timedelta(minutes=1)
    )
    await drain(service, until=timedelta(minutes=30))
    assert runs == [("d", "c")]

    assert await service.enqueue_with_delay(
        Nudge(id="u", text="1"), 0, unique_for=timedelta(hours=1)
    )
    await drain(service)
    assert not await service.enqueue_with_delay(Nudge(id="u"), 0, unique_for=timedelta(hours=1))
    await advance(service, timedelta(hours=1, seconds=1))
    assert await service.enqueue_with_delay(
        Nudge(id="u", text="2"), 0, unique_for=timedelta(hours=1)
    )
    await drain(service)
    assert runs[1:] == [("u", "1"), ("u", "2")]


async def test_a_rate_limit_spaces_runs_on_the_moved_clock(service: EventService) -> None:
    async def handle(event: Nudge) -> None:
        pass

    await service.set_limits(Nudge, rate="1/min burst 1")
    service.add_handler(Nudge, handle, concurrency=5)
    await service.enqueue_many([Nudge(id=f"r{i}") for i in range(3)])
    assert len(await drain(service)) == 1  # one token now, the next a minute later
    runs = await drain(service, until=timedelta(minutes=5))
    assert [r.id for r in runs] == ["r1", "r2"]
    assert runs[0].at is not None and runs[1].at is not None
    assert timedelta(seconds=59) <= runs[1].at - runs[0].at <= timedelta(seconds=61)


async def test_a_schedule_fires_its_slots_per_its_catch_up_policy(service: EventService) -> None:
    fired: list[str] = []

    async def handle(event: Nudge) -> None:
        fired.append(event.id)

    service.add_handler(Nudge, handle)
    await service.schedule(
        "hourly", Nudge, cron="0 * * * *", catch_up=timedelta(hours=3), overlap="allow"
    )
    runs = await drain(service, until=timedelta(hours=5))
    assert len(runs) == 5 and all(r.outcome == "success" for r in runs)
    # jumping 10 h at once: the slots of the last 3 h (the catch-up window) fire, in order
    await advance(service, timedelta(hours=10))
    later = await drain(service)
    assert len(later) == 3
    assert fired[-3:] == sorted(fired[-3:])


async def test_a_lease_runs_out_when_the_clock_jumps_past_it(redis_url: str) -> None:
    async with isolated_service(redis_url, visibility_timeout=30) as service:
        gate = anyio.Event()
        attempts: list[int] = []

        async def slow(event: Nudge) -> None:
            attempts.append(len(attempts) + 1)
            if len(attempts) == 1:
                await gate.wait()  # the first run stalls

        service.add_handler(Nudge, slow, concurrency=2)
        await service.enqueue_with_delay(Nudge(id="l"), 0)
        await wait_for(lambda: attempts == [1])
        await advance(service, timedelta(minutes=1))  # past the 30 s lease: it is redelivered
        await wait_for(lambda: attempts == [1, 2])
        gate.set()  # the stalled first run ends late: its ack finds its lease gone
        # the runs since the start, in the order they ended: the redelivery's (no await
        # in it) ended before the gate opened
        assert [r.attempt for r in await drain(service)] == [2, 1]
        await assert_not_enqueued(service, Nudge)


async def test_misuse_is_refused_with_clear_errors(redis_url: str, service: EventService) -> None:
    with pytest.raises(ValueError, match="forward only"):
        await advance(service, timedelta(seconds=-1))
    with pytest.raises(ValueError, match="forward only"):
        await advance(service, (await now(service)) - timedelta(minutes=1))
    with pytest.raises(RuntimeError, match="no handlers"):
        await drain(service)
    plain = EventService.from_url(redis_url, prefix=service.options.prefix + "-plain")
    try:
        with pytest.raises(RuntimeError, match="Recorder"):
            await drain(plain)
    finally:
        await plain.aclose()
    async with isolated_service(redis_url) as other:
        await other.aclose()
        with pytest.raises(RuntimeError, match="started service"):
            await drain(other)
    async with isolated_service(redis_url, enable_scheduling=False) as producer:
        with pytest.raises(RuntimeError, match="enable_scheduling=False"):
            await drain(producer)


async def test_an_assertion_shows_what_was_enqueued(service: EventService) -> None:
    await service.enqueue_with_delay(Nudge(id="a1", text="x"), timedelta(minutes=5))
    await service.enqueue_with_delay(Nudge(id="a2", text="y"), 0)
    listed = await enqueued(service, Nudge)
    assert [(e.id, e.state) for e in listed] == [("a2", "ready"), ("a1", "scheduled")]
    assert listed[1].event == Nudge(id="a1", text="x")
    with pytest.raises(AssertionError) as caught:
        await assert_enqueued(service, Nudge, id="a1", due_in=timedelta(hours=1))
    message = str(caught.value)
    assert "expected Nudge with id='a1', due in 1:00:00 ± 0:00:01 to be enqueued" in message
    assert "id='a1' due in 0:04:59" in message and "id='a2' ready" in message
    with pytest.raises(AssertionError, match=r"expected no Nudge with payload=.*'y'"):
        await assert_not_enqueued(service, Nudge, payload={"text": "y"})


class Other(events.Event, event_name="kit-other"):
    pass


async def test_drain_types_waits_for_and_returns_those_types_only(service: EventService) -> None:
    async def handle(event: events.Event) -> None:
        pass

    service.add_handler(Nudge, handle)
    service.add_handler(Other, handle)
    await service.enqueue_with_delay(Nudge(id="t1"), timedelta(minutes=1))
    await service.enqueue_with_delay(Other(id="t2"), timedelta(minutes=1))
    runs = await drain(service, types=[Other], until=timedelta(minutes=1))
    assert [(r.type, r.id) for r in runs] == [("kit-other", "t2")]
    with pytest.raises(ValueError, match="no handler for"):
        await drain(service, types=["kit-nothing"])


async def test_drain_waits_out_the_lease_of_a_worker_that_died(redis_url: str) -> None:
    async with isolated_service(redis_url, visibility_timeout=60) as service:
        started = anyio.Event()

        async def stall(event: Nudge) -> None:
            started.set()
            await anyio.sleep_forever()

        prefix = service.options.prefix
        dying = EventService.from_url(redis_url, prefix=prefix, shutdown_grace=0)
        dying.add_handler(Nudge, stall)
        await dying.start()
        await service.enqueue_with_delay(Nudge(id="w"), 0)
        with anyio.fail_after(10):
            await started.wait()
        await dying.aclose()  # its handler is cancelled; its lease stays until it runs out

        async def handle(event: Nudge) -> None:
            pass

        service.add_handler(Nudge, handle)
        assert await drain(service) == []  # the lease is another process's: nothing to run now
        runs = await drain(service, until=timedelta(minutes=2))
        assert [(r.id, r.attempt, r.outcome) for r in runs] == [("w", 2, "success")]


class Priced(events.Event, event_name="kit-priced", results=timedelta(minutes=5)):
    cents: int


async def test_drain_gives_the_value_a_results_type_kept(service: EventService) -> None:
    async def price(event: Priced) -> int:
        return event.cents * 2

    service.add_handler(Priced, price)
    await service.enqueue_with_delay(Priced(id="p1", cents=21), timedelta(minutes=2))
    runs = await drain(service, until=timedelta(minutes=3))
    assert [(r.id, r.outcome, r.result) for r in runs] == [("p1", "success", 42)]


async def test_a_kept_result_expires_when_the_clock_moves_past_its_window(
    service: EventService,
) -> None:
    async def price(event: Priced) -> int:
        return event.cents

    service.add_handler(Priced, price)
    await service.enqueue_with_delay(Priced(id="p2", cents=7), 0)
    await drain(service)
    assert await service.result(Priced, "p2", timeout=5) == 7
    await advance(service, timedelta(minutes=6))  # past Priced's 5 minutes
    with pytest.raises(LookupError):
        await service.result(Priced, "p2", timeout=1)
