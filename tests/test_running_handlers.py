"""Control over running handlers (issue 36): timeouts per type and per event, middleware
around handler runs, enqueue hooks (docs/guides/running-handlers.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Any

import anyio
import httpx
import pytest
from core_support import Recorder, ServicePool, keys_of, run_cli

from delayq import (
    CancelResult,
    Delivery,
    Event,
    EventService,
    InMemoryMetrics,
    current_delivery,
    fixed,
)
from delayq.codec import Codec
from delayq.dashboard import create_app
from delayq.testing import drain, isolated_service


class RunJob(Event, event_name="rh-job"):
    """The event type of these tests."""

    sleep: float = 0.0


class OtherJob(Event, event_name="rh-other"):
    """A second type, without a per-type timeout."""

    sleep: float = 0.0


@pytest.fixture
async def services(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix, retry_backoff=fixed(0.05))
    yield pool
    await pool.aclose()


async def sleeper(event: Any) -> None:
    await asyncio.sleep(event.sleep)


def dead(service: EventService, event_type: type[Event], n: int):
    async def check() -> bool:
        return (await service.stats_for(event_type)).dead >= n

    return check


# -- timeouts -------------------------------------------------------------------------


async def test_type_timeout_overrides_the_services(services, wait_for) -> None:
    # the service's 30 s would let the run finish; the type's 0.2 s cancels it
    service = await services.start(retry_attempts=0, handler_timeout=30)
    recorder = Recorder(sleeper)
    service.add_handler(RunJob, recorder, timeout=timedelta(seconds=0.2))
    fast = Recorder(sleeper)
    service.add_handler(OtherJob, fast)
    assert await service.enqueue_with_delay(RunJob(id="slow", sleep=5), 0)
    assert await service.enqueue_with_delay(OtherJob(id="other", sleep=0.5), 0)
    await wait_for(dead(service, RunJob, 1), timeout=10)
    (letter,) = await service.dead_letters(RunJob)
    assert letter.error.startswith("HandlerTimeout"), letter.error
    await wait_for(fast.handled(1), timeout=10)  # the other type keeps the service's 30 s
    assert (await service.stats_for(OtherJob)).dead == 0


async def test_event_timeout_overrides_the_types(services, wait_for) -> None:
    service = await services.start(retry_attempts=0)
    recorder = Recorder(sleeper)
    service.add_handler(RunJob, recorder, concurrency=4, timeout=0.2)
    # longer than the type's: this event's 10 s lets it finish
    assert await service.enqueue_with_delay(RunJob(id="long", sleep=0.6), 0, timeout=10)
    # shorter than none at all: a type without a timeout still cancels this one
    other = Recorder(sleeper)
    service.add_handler(OtherJob, other)
    assert await service.enqueue_at(
        OtherJob(id="short", sleep=5), datetime.now(timezone.utc),
        timeout=timedelta(milliseconds=200),
    )  # fmt: skip
    await wait_for(recorder.handled(1), timeout=10)
    await wait_for(dead(service, OtherJob, 1), timeout=10)
    assert (await service.stats_for(RunJob)).dead == 0
    (letter,) = await service.dead_letters(OtherJob)
    assert letter.error.startswith("HandlerTimeout: handler ran longer than 0.2s"), letter.error
    # the timeout is the handler's business: event_context does not show it
    assert recorder.contexts == [{}]


async def test_a_timed_out_run_is_retried_by_the_types_policy(services, wait_for) -> None:
    service = await services.start(retry_attempts=0)
    recorder = Recorder(sleeper)
    # the type's policy (one retry) over the service's (none)
    service.add_handler(RunJob, recorder, timeout=0.1, retry_attempts=1)
    assert await service.enqueue_with_delay(RunJob(id="t", sleep=5), 0)
    await wait_for(dead(service, RunJob, 1), timeout=10)
    (letter,) = await service.dead_letters(RunJob)
    assert letter.attempts == 2 and letter.error.startswith("HandlerTimeout"), letter
    assert recorder.counts == {"t": 2}


async def test_event_timeout_on_many_and_envelopes(services, wait_for) -> None:
    service = await services.start(retry_attempts=0)
    recorder = Recorder(sleeper)
    service.add_handler(RunJob, recorder, concurrency=4)
    assert await service.enqueue_many([RunJob(id="m1", sleep=5), RunJob(id="m2", sleep=5)],
                                      timeout=0.1) == [True, True]  # fmt: skip
    codec = Codec()
    envelope = codec.encode(RunJob(id="e1", sleep=5), {"k": "v"})
    assert await service.enqueue_envelopes("rh-job", [("e1", envelope, 0)], timeout=0.1) == [1]
    await wait_for(dead(service, RunJob, 3), timeout=10)
    letters = await service.dead_letters(RunJob)
    assert sorted(d.id for d in letters) == ["e1", "m1", "m2"]
    assert all(d.error.startswith("HandlerTimeout") for d in letters)
    assert sorted(map(sorted, map(dict.items, recorder.contexts))) == [[], [], [("k", "v")]]


async def test_plain_envelope_unchanged_without_timeout(services, redis_client, prefix) -> None:
    service = services.producer()
    await service.enqueue_with_delay(RunJob(id="plain"), 60)
    await service.enqueue_with_delay(RunJob(id="timed"), 60, timeout=2.5)
    events = keys_of(prefix, "rh-job").events
    plain = await redis_client.hget(events, "plain")
    timed = await redis_client.hget(events, "timed")
    assert plain[0] == 0x92  # [body, enqueued_at]: no context at all
    _, context = Codec().decode(timed, RunJob, "timed")
    assert context == {"delayq-timeout": "2500"}


@pytest.mark.parametrize(
    ("timeout", "error"),
    [(0, ValueError), (-1, ValueError), (8 * 24 * 3600, ValueError), ("1", TypeError),
     (True, TypeError), (float("nan"), ValueError)],
)  # fmt: skip
async def test_timeouts_are_checked_before_anything_is_written(
    services, redis_client, prefix, timeout, error
) -> None:
    service = services.producer()
    with pytest.raises(error):
        service.add_handler(RunJob, sleeper, timeout=timeout)
    with pytest.raises(error):
        await service.enqueue_with_delay(RunJob(id="x"), 0, timeout=timeout)
    with pytest.raises(error):
        await service.enqueue_many([RunJob(id="y")], timeout=timeout)
    with pytest.raises(error):
        await service.enqueue_envelopes("rh-job", [("z", Codec().encode(RunJob(id="z")), 0)],
                                        timeout=timeout)  # fmt: skip
    with pytest.raises(ValueError):
        await service.enqueue_envelopes("rh-job", [("z", b"\x93garbage", 0)], timeout=1)
    assert await redis_client.exists(keys_of(prefix, "rh-job").events) == 0


# -- middleware -------------------------------------------------------------------------


async def test_middleware_order_and_both_styles(services, wait_for) -> None:
    seen: list[str] = []

    async def outer(delivery: Delivery, call_next: Any) -> Any:
        seen.append(f"outer>{delivery.id}")
        result = await call_next()
        seen.append(f"outer<{result}")
        return result

    @contextlib.asynccontextmanager
    async def middle(delivery: Delivery) -> AsyncIterator[None]:
        seen.append(f"middle>{delivery.attempt}")
        try:
            yield
        finally:
            seen.append("middle<")

    async def handler(event: RunJob) -> str:
        seen.append("handler")
        return "done"

    service = await services.start()
    service.add_handler(RunJob, handler)
    service.use(outer)
    service.use(middle)  # added after add_handler: applies all the same
    assert await service.enqueue_with_delay(RunJob(id="a"), 0)
    await wait_for(lambda: "outer<done" in seen, timeout=10)
    assert seen == ["outer>a", "middle>1", "handler", "middle<", "outer<done"]


async def test_middleware_exceptions_are_failures(services, wait_for) -> None:
    async def refuse(delivery: Delivery, call_next: Any) -> Any:
        if delivery.id == "bad":
            raise PermissionError("no tenant")
        return await call_next()

    service = await services.start(retry_attempts=1)
    recorder = Recorder()
    service.add_handler(RunJob, recorder, concurrency=2)
    service.use(refuse)
    assert await service.enqueue_many([RunJob(id="bad"), RunJob(id="good")]) == [True, True]
    await wait_for(dead(service, RunJob, 1), timeout=10)
    (letter,) = await service.dead_letters(RunJob)
    assert (letter.id, letter.attempts, letter.error) == ("bad", 2, "PermissionError: no tenant")
    assert recorder.ids == ["good"]  # the handler never ran for "bad"


async def test_middleware_runs_inside_the_timeout_and_cannot_swallow_it(services, wait_for) -> None:
    async def swallow(delivery: Delivery, call_next: Any) -> Any:
        try:
            return await call_next()
        except asyncio.CancelledError:
            return None  # what a middleware must not do: the run still times out

    service = await services.start(retry_attempts=0)
    service.use(swallow)
    service.add_handler(RunJob, sleeper, timeout=0.2)
    assert await service.enqueue_with_delay(RunJob(id="s", sleep=5), 0)
    await wait_for(dead(service, RunJob, 1), timeout=10)
    (letter,) = await service.dead_letters(RunJob)
    assert letter.error.startswith("HandlerTimeout"), letter.error


def test_middleware_is_checked() -> None:
    service = EventService.from_url("redis://127.0.0.1:1")

    async def one_arg(delivery: Delivery) -> None: ...

    with pytest.raises(TypeError):
        service.use("not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        service.use(one_arg)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        service.use_enqueue(42)  # type: ignore[arg-type]


# -- enqueue hooks ----------------------------------------------------------------------


async def test_enqueue_hooks_add_context_and_refuse(services, redis_client, prefix, wait_for):
    async def request_id(event: Event, context: dict[str, str]) -> None:
        context.setdefault("request-id", "r-42")

    def no_drafts(event: Event, context: dict[str, str]) -> None:
        if event.id.startswith("draft"):
            raise ValueError("drafts are not enqueued")

    service = await services.start()
    recorder = Recorder()
    service.add_handler(RunJob, recorder, concurrency=4)
    service.use_enqueue(request_id)
    service.use_enqueue(no_drafts)
    assert await service.enqueue_with_delay(RunJob(id="a"), 0, context={"user": "u1"})
    with pytest.raises(ValueError, match="drafts"):
        await service.enqueue_with_delay(RunJob(id="draft-1"), 0)
    with pytest.raises(ValueError, match="drafts"):  # one refused: none of the call written
        await service.enqueue_many([RunJob(id="b"), RunJob(id="draft-2")])
    assert await service.enqueue_many([RunJob(id="c"), (RunJob(id="d"), 0)], timeout=30) == [
        True,
        True,
    ]
    await wait_for(recorder.handled(3), timeout=10)
    assert sorted(recorder.ids) == ["a", "c", "d"]
    by_id = dict(zip(recorder.ids, recorder.contexts, strict=True))
    assert by_id["a"] == {"user": "u1", "request-id": "r-42"}
    assert by_id["c"] == by_id["d"] == {"request-id": "r-42"}
    # the refused ids were never written
    for refused in ("draft-1", "draft-2", "b"):
        assert not await redis_client.hexists(keys_of(prefix, "rh-job").events, refused)


# -- progress ---------------------------------------------------------------------------


async def test_progress_is_rate_limited_and_the_last_value_written(
    services, redis_client, redis_url, prefix, wait_for, capsys, monkeypatch
) -> None:
    service = await services.start()
    store = service._store
    writes: list[int] = []
    write = store.running.write_progress

    async def counted(shard: str, group: str | None, items: Any) -> None:
        writes.append(len(items))
        await write(shard, group, items)

    store.running.write_progress = counted  # type: ignore[method-assign]
    release = asyncio.Event()
    calls = 0
    reporting: list[float] = []  # monotonic times: first report, last report

    async def busy(event: RunJob) -> None:
        nonlocal calls
        delivery = current_delivery()
        assert delivery is not None
        reporting.append(time.monotonic())
        for step in range(1, 201):  # 200 reports in about 1 s
            await delivery.progress(step / 2, note=f"step {step}")
            calls += 1
            await asyncio.sleep(0.005)
        reporting.append(time.monotonic())
        await release.wait()

    service.add_handler(RunJob, busy)
    assert await service.enqueue_with_delay(RunJob(id="p"), 0)

    async def last_value_shown() -> bool:
        info = await service.inspect(RunJob, "p")
        return info.progress is not None and info.progress.value == 100

    await wait_for(last_value_shown, timeout=10)
    info = await service.inspect(RunJob, "p")
    assert info.state == "in_flight"
    assert info.progress is not None and info.progress.note == "step 200"
    assert info.to_dict()["progress"]["value"] == 100
    assert calls == 200
    # the first at once, then at most one a second (the reports took about 1 s, longer on
    # a loaded machine: the bound is counted from the time they took), the last one too
    assert 2 <= len(writes) <= math.ceil(reporting[1] - reporting[0]) + 2, (writes, reporting)
    (running,) = await service.in_flight(RunJob)
    assert running.progress is not None and running.progress.value == 100
    # the dashboard's event page and running list show it, escaped
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(service)), base_url="http://dash.test"
    ) as http:
        page = (await http.get("/event", params={"type": "rh-job", "id": "p"})).text
        assert 'id="event-progress">100' in page and "step 200" in page
        live = (await http.get("/type", params={"name": "rh-job"})).text
        assert '<td class="progress" data-label="progress" title="step 200">100.0</td>' in live
    # and delayq inspect (text and --json)
    inspect = ("inspect", "rh-job", "p")
    code, out = await run_cli(monkeypatch, capsys, redis_url, prefix, *inspect, "--json")
    assert code == 0 and json.loads(out)["progress"]["value"] == 100, out
    code, out = await run_cli(monkeypatch, capsys, redis_url, prefix, *inspect)
    assert code == 0 and "100.0 (step 200)" in out, out
    release.set()
    progress_key = f"{{{prefix}:rh-job}}:progress"

    async def cleared() -> bool:
        return await redis_client.hlen(progress_key) == 0

    await wait_for(cleared, timeout=10)
    assert (await service.inspect(RunJob, "p")).progress is None


async def test_progress_is_checked() -> None:
    delivery = Delivery("rh-job", "x", 1, None, 0, {})
    with pytest.raises(RuntimeError):
        await delivery.progress(5)  # no handler runs it


async def test_metrics_see_runs_through_middleware_and_cancels(services, wait_for) -> None:
    metrics = InMemoryMetrics()
    service = await services.start(metrics=metrics, retry_attempts=0)
    seen: list[str] = []

    async def note(delivery: Delivery, call_next: Any) -> Any:
        seen.append(delivery.id)
        return await call_next()

    service.use(note)
    service.add_handler(RunJob, sleeper, concurrency=4)
    assert await service.enqueue_with_delay(RunJob(id="ok"), 0)
    assert await service.enqueue_with_delay(RunJob(id="long", sleep=60), 0)
    await wait_for(lambda: metrics.observed("handler_duration", "success") == 1, timeout=10)
    await wait_for(lambda: "long" in seen, timeout=10)
    assert await service.cancel(RunJob, "long") is CancelResult.SIGNALLED
    await wait_for(lambda: metrics.observed("handler_duration", "cancelled") == 1, timeout=5)
    assert (await service.inspect(RunJob, "long")).state == "absent"
    assert await service.dead_letters(RunJob) == []


async def test_drain_records_runs_through_middleware_and_a_cancelled_run(redis_url) -> None:
    # the testing kit's Recorder sits around the middleware chain: it sees each run once,
    # and a run stopped by cancel() as "cancelled"
    async with isolated_service(redis_url) as service:
        seen: list[str] = []
        running = asyncio.Event()

        async def note(delivery: Delivery, call_next: Any) -> Any:
            seen.append(delivery.id)
            return await call_next()

        async def handle(event: RunJob) -> None:
            if event.sleep:
                running.set()
                await asyncio.sleep(event.sleep)

        async def cancel_once_running() -> None:
            await running.wait()
            assert await service.cancel(RunJob, "long") is CancelResult.SIGNALLED

        service.use(note)
        service.add_handler(RunJob, handle, concurrency=2)
        # due in a minute: nothing runs before drain moves the clock
        assert await service.enqueue_with_delay(RunJob(id="ok"), timedelta(minutes=1))
        assert await service.enqueue_with_delay(RunJob(id="long", sleep=60), timedelta(minutes=1))
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_once_running)
            runs = await drain(service, until=timedelta(minutes=1))
        assert sorted((r.id, r.attempt, r.outcome) for r in runs) == [
            ("long", 1, "cancelled"),
            ("ok", 1, "success"),
        ]
        assert sorted(seen) == ["long", "ok"]
        assert (await service.inspect(RunJob, "long")).state == "absent"


async def test_a_cancel_waits_for_a_shielded_section(services, wait_for) -> None:
    service = await services.start()
    steps: list[str] = []
    inside = asyncio.Event()

    async def careful(event: RunJob) -> None:
        with anyio.CancelScope(shield=True):
            inside.set()
            await asyncio.sleep(0.3)  # the cancel comes now: this step still ends
            steps.append("charged")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            steps.append("cancelled")
            raise

    service.add_handler(RunJob, careful)
    assert await service.enqueue_with_delay(RunJob(id="pay"), 0)
    await wait_for(inside.is_set, timeout=10)
    assert await service.cancel(RunJob, "pay") is CancelResult.SIGNALLED
    await wait_for(lambda: len(steps) == 2, timeout=5)
    assert steps == ["charged", "cancelled"]


async def test_a_handler_ignoring_the_cancel_is_bounded_by_its_timeout_and_changes_nothing(
    services, wait_for
) -> None:
    metrics = InMemoryMetrics()
    # a long lease: its renewal (which would cancel the run again, finding the lease
    # gone) comes after the 1 s timeout here
    service = await services.start(metrics=metrics, retry_attempts=3, visibility_timeout=30)
    steps: list[str] = []

    async def stubborn(event: RunJob) -> None:
        steps.append(f"{event.id} started")
        try:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                steps.append(f"{event.id} ignored the cancel")  # and goes on: a bug
            await asyncio.sleep(event.sleep)
            steps.append(f"{event.id} returned")
        finally:
            steps.append(f"{event.id} ended")

    service.add_handler(RunJob, stubborn, concurrency=2, timeout=1.0)
    # "acks": returns after the cancel; "hangs": would run a minute more, its timeout ends it
    assert await service.enqueue_many([RunJob(id="acks", sleep=0.1), RunJob(id="hangs", sleep=60)])
    await wait_for(lambda: len(steps) == 2, timeout=10)
    for run in ("acks", "hangs"):
        assert await service.cancel(RunJob, run) is CancelResult.SIGNALLED
    await wait_for(lambda: "acks returned" in steps, timeout=5)
    # stopped by its timeout (1 s), not a minute later
    await wait_for(lambda: "hangs ended" in steps, timeout=10)
    assert "hangs ignored the cancel" in steps and "hangs returned" not in steps
    # the late ack found its lease gone; the timed-out run ends cancelled (the cancel it
    # swallowed is still pending on its task) or its failure record is found stale too
    await wait_for(lambda: metrics.total("stale_outcomes") >= 1, timeout=5)
    # neither changed anything: no ack, no retry, no dead letter
    for run in ("acks", "hangs"):
        assert (await service.inspect(RunJob, run)).state == "absent"
    assert await service.dead_letters(RunJob) == []
    assert sorted(s for s in steps if s.endswith("started")) == ["acks started", "hangs started"]


async def test_a_cancel_spares_a_run_recording_its_outcome() -> None:
    # a run whose handler has returned and which is recording its failure is not cut off
    # (its record must reach Redis or be found stale there), inside a shield or not
    from delayq.runtime.handler_tasks import cancel_unless_shielded

    release = asyncio.Event()

    async def recording(shielded: bool) -> None:
        if shielded:
            with anyio.CancelScope(shield=True):
                await release.wait()
            await asyncio.sleep(0.2)  # recording: past the cancel's next look (20 ms)
        await release.wait()

    settling: set[asyncio.Task[Any]] = set()
    plain, spared, shielded = (
        asyncio.create_task(recording(False)),
        asyncio.create_task(recording(False)),
        asyncio.create_task(recording(True)),
    )
    await asyncio.sleep(0)  # every task at its first await
    settling.add(spared)
    for task in (plain, spared, shielded):
        cancel_unless_shielded(task, settling.__contains__)
    settling.add(shielded)  # it settles while the cancel waits for its shield to end
    release.set()
    await asyncio.wait([plain, spared, shielded], timeout=5)
    assert plain.cancelled()
    assert spared.done() and not spared.cancelled()
    assert shielded.done() and not shielded.cancelled()


async def test_the_dashboard_cancels_a_running_handler(services, wait_for) -> None:
    service = await services.start()
    steps: list[str] = []

    async def long(event: RunJob) -> None:
        steps.append("started")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            steps.append("cancelled")
            raise

    service.add_handler(RunJob, long)
    assert await service.enqueue_with_delay(RunJob(id="d"), 0)
    await wait_for(lambda: steps == ["started"], timeout=10)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(service)), base_url="http://dash.test"
    ) as http:
        page = await http.get("/event", params={"type": "rh-job", "id": "d"})
        assert "Cancel and stop its handler" in page.text
        match = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert match is not None
        form = {"type": "rh-job", "id": "d", "action": "cancel", "csrf": match.group(1)}
        r = await http.post("/actions/event", data={**form, "confirm": "yes"})
        assert r.status_code == 200 and "was running" in r.text, r.text
    await wait_for(lambda: steps == ["started", "cancelled"], timeout=5)


def _dashboard(service: EventService) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(service)), base_url="http://dash.test"
    )


async def test_a_cancelled_run_counts_as_cancelled_in_the_history_the_dashboard_shows(
    services, wait_for
) -> None:
    service = await services.start(retry_attempts=0, history_interval=0.1)
    running = asyncio.Event()

    async def handle(event: RunJob) -> None:
        if event.sleep < 0:
            raise RuntimeError("asked to fail")
        if event.sleep:
            running.set()
            await asyncio.sleep(event.sleep)

    service.add_handler(RunJob, handle, concurrency=4)
    assert await service.enqueue_many([RunJob(id="ok"), RunJob(id="bad", sleep=-1)])
    assert await service.enqueue_with_delay(RunJob(id="long", sleep=60), 0)
    await running.wait()
    assert await service.cancel(RunJob, "long") is CancelResult.SIGNALLED

    async def counted() -> bool:
        points = await service.history(RunJob)
        totals = [sum(getattr(p, f) for p in points) for f in ("handled", "failed", "cancelled")]
        return totals == [1, 1, 1]

    await wait_for(counted, timeout=10)
    async with _dashboard(service) as http:
        page = (await http.get("/type", params={"name": "rh-job"})).text
        assert "1 handled · 1 failed · 1 cancelled (last hour)" in page
        assert '<rect class="cancelled"' in page and "cancelled/min: 1" in page
        overview = (await http.get("/")).text
        assert "1 handled · 1 failed · 1 cancelled (last hour)" in overview


async def test_the_dashboard_cancels_one_groups_run_or_every_groups(services, wait_for) -> None:
    service = await services.start(history_interval=0.1)
    await service.register_group(RunJob, "audit")
    runs: dict[str, list[str]] = {"default": [], "audit": []}

    async def long(event: RunJob) -> None:
        delivery = current_delivery()
        assert delivery is not None
        steps = runs[delivery.group]
        steps.append(f"{event.id} started")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            steps.append(f"{event.id} cancelled")
            raise

    service.add_handler(RunJob, long)
    service.add_handler(RunJob, long, group="audit")
    assert await service.enqueue_with_delay(RunJob(id="g"), 0)
    assert await service.enqueue_with_delay(RunJob(id="later"), 3600)
    await wait_for(lambda: runs == {"default": ["g started"], "audit": ["g started"]}, timeout=10)

    def row(html: str, group: str) -> str:
        return html.split(f'class="event-group-row" data-group="{group}"')[1].split("</tr>")[0]

    async with _dashboard(service) as http:
        page = (await http.get("/event", params={"type": "rh-job", "id": "g"})).text
        assert 'id="cancel">Cancel in every group' in page and 'id="run-now"' not in page
        assert "cancel-group" in row(page, "audit") and "Cancel and stop" in row(page, "audit")
        match = re.search(r'name="csrf" value="([^"]+)"', page)
        assert match is not None
        form = {"type": "rh-job", "id": "g", "action": "cancel", "csrf": match.group(1)}
        # audit's alone: asked first, then its run stops and the default group's goes on
        r = await http.post("/actions/event", data={**form, "group": "audit"})
        assert "Cancel rh-job" in r.text and "for group audit?" in r.text
        assert "The other groups keep theirs" in r.text
        assert '<input type="hidden" name="group" value="audit">' in r.text
        r = await http.post("/actions/event", data={**form, "group": "audit", "confirm": "yes"})
        assert "was running for group audit" in r.text, r.text
        await wait_for(lambda: runs["audit"] == ["g started", "g cancelled"], timeout=5)
        info = await service.inspect(RunJob, "g")
        assert (info.groups["audit"].state, info.groups["default"].state) == ("absent", "in_flight")
        assert runs["default"] == ["g started"]

        async def audit_counted() -> bool:
            points = await service.history(RunJob, group="audit")
            return sum(p.cancelled for p in points) == 1

        await wait_for(audit_counted, timeout=10)
        assert sum(p.cancelled for p in await service.history(RunJob)) == 0
        page = (await http.get("/type", params={"name": "rh-job", "group": "audit"})).text
        assert "0 handled · 0 failed · 1 cancelled" in page
        # a scheduled one: cancel for one group from its row, the other keeps it
        page = (await http.get("/event", params={"type": "rh-job", "id": "later"})).text
        assert "run-now-group" in row(page, "default") and "cancel-group" in row(page, "default")
        r = await http.post(
            "/actions/event",
            data={**form, "id": "later", "group": "default", "confirm": "yes"},
        )
        assert "was removed for group default" in r.text
        info = await service.inspect(RunJob, "later")
        assert (info.groups["audit"].state, info.groups["default"].state) == ("scheduled", "absent")
        # every group: the default group's run stops too
        r = await http.post("/actions/event", data={**form, "confirm": "yes"})
        assert "was running: it was removed" in r.text
        await wait_for(lambda: runs["default"] == ["g started", "g cancelled"], timeout=5)
        assert (await service.inspect(RunJob, "g")).state == "absent"
