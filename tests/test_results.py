"""Kept results (``results=``): written with the ack, read and waited for by ``result()``."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

import delayq
from delayq import Event, EventFailed, EventService, Outcome, Result, fixed
from delayq.keys import PrefixKeys
from delayq.operations import results as results_module
from delayq.testing.cluster import RedisClusterServer

FAST: dict[str, Any] = {
    "scheduling_interval": 0.2,
    "polling_timeout": 0.5,
    "visibility_timeout": 2.0,
    "retry_backoff": fixed(0.05),
    "shutdown_grace": 1.0,
}


class Thumb(Event, event_name="res-thumb", results=timedelta(hours=1)):
    path: str = ""
    fail: bool = False


class Plain(Event, event_name="res-plain"):
    pass


class Brief(Event, event_name="res-brief", results=timedelta(milliseconds=300)):
    pass


class Spread(Event, event_name="res-spread", partitions=4, results=timedelta(hours=1)):
    n: int = 0


async def _thumb(event: Thumb) -> object:
    if event.fail:
        raise RuntimeError(f"cannot read {event.path}")
    if event.path == "false":
        return Result(False)
    if event.path == "true":
        return Result(True)
    if event.path == "bare-true":
        return True
    if event.path == "none":
        return None
    return {"path": event.path, "size": [64, 64]}


def test_the_class_option_is_checked() -> None:
    assert Thumb.event_results_ms == 3_600_000
    assert Plain.event_results_ms is None
    with pytest.raises(ValueError, match="positive"):

        class Zero(Event, event_name="res-zero", results=timedelta(0)):
            pass

    with pytest.raises(TypeError, match="timedelta"):

        class Secs(Event, event_name="res-secs", results=3600):  # type: ignore[call-arg]
            pass


async def test_result_values_booleans_failures_and_lookups(redis_url: str, prefix: str) -> None:
    service = EventService.from_url(redis_url, prefix=prefix, retry_attempts=0, **FAST)
    service.add_handler(Thumb, _thumb, concurrency=4)
    async with service:
        paths = ["a.png", "false", "true", "bare-true", "none"]
        await service.enqueue_many([Thumb(id=p, path=p) for p in paths])
        await service.enqueue_with_delay(Thumb(id="bad", path="x.png", fail=True), 0)
        assert await service.result(Thumb, "a.png", timeout=10) == {
            "path": "a.png",
            "size": [64, 64],
        }
        assert await service.result(Thumb, "false", timeout=10) is False
        assert await service.result(Thumb, "true", timeout=10) is True
        assert await service.result(Thumb, "bare-true", timeout=10) is None
        assert await service.result(Thumb, "none", timeout=10) is None
        with pytest.raises(EventFailed) as failed:
            await service.result(Thumb, "bad", timeout=10)
        assert failed.value.error == "RuntimeError: cannot read x.png"
        assert failed.value.event_id == "bad"
        with pytest.raises(LookupError):
            await service.result(Thumb, "never-enqueued", timeout=1)
        # pending: a far-future event; timeout
        await service.enqueue_with_delay(Thumb(id="later"), timedelta(hours=1))
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await service.result(Thumb, "later", timeout=0.3)
        assert time.monotonic() - started < 5
        many = await service.results(Thumb, ["a.png", "bad", "later", "nope", "false"])
        assert list(many) == ["a.png", "bad", "later", "nope", "false"]
        assert many["a.png"] == Outcome("ok", {"path": "a.png", "size": [64, 64]})
        assert many["bad"] == Outcome("failed", error="RuntimeError: cannot read x.png")
        assert many["later"] == Outcome("pending")
        assert many["nope"] == Outcome("missing")
        assert many["false"] == Outcome("ok", False)
        # the dead letter purged: its failure record is still the outcome
        assert await service.purge_dead_letters(Thumb, ["bad"]) == 1
        assert (await service.results(Thumb, ["bad"]))["bad"].status == "failed"
        # cancelled: no outcome
        await service.cancel(Thumb, "later")
        assert (await service.results(Thumb, ["later"]))["later"].status == "missing"
        with pytest.raises(ValueError, match="keeps no results"):
            await service.result(Plain, "x")  # type: ignore[arg-type]
        info = await service.inspect(Thumb, "a.png")
        assert info.state == "absent" and info.outcome == "ok"
        assert info.to_dict()["outcome"] == "ok"
        assert (await service.inspect(Thumb, "bad")).outcome == "failed"
        assert (await service.inspect(Thumb, "nope")).outcome is None


async def test_result_and_ack_are_one_step(redis_url: str, prefix: str) -> None:
    """At every moment: the event is still stored, or its result is kept; never both
    gone, never a result beside a stored event (read in one script)."""
    service = EventService.from_url(redis_url, prefix=prefix, **FAST)
    keys = PrefixKeys(prefix).for_type(Thumb.event_name)
    seen: list[tuple[bool, bool]] = []
    client = aioredis.from_url(redis_url)
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            async with client.pipeline(transaction=True) as pipe:
                pipe.hexists(keys.events, "e-7")
                pipe.hexists(keys.results, "e-7")
                stored, kept = await pipe.execute()
            seen.append((bool(stored), bool(kept)))
            await asyncio.sleep(0)

    service.add_handler(Thumb, _thumb)
    try:
        async with service:
            await service.enqueue_with_delay(Thumb(id="e-7", path="p"), 0.2)
            watcher = asyncio.create_task(watch())
            try:
                await service.result(Thumb, "e-7", timeout=10)
                await asyncio.sleep(0.05)
            finally:
                stop.set()
                await watcher
    finally:
        await client.aclose()
    assert (True, False) in seen and (False, True) in seen
    assert (True, True) not in seen and (False, False) not in seen


async def test_result_wakes_up_on_the_ack_without_polling(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results_module, "RECHECK", 30.0)
    service = EventService.from_url(redis_url, prefix=prefix, **FAST)
    reads = 0
    store_outcomes = service._store.results.outcomes

    async def counted(shard: str, ids: Any) -> Any:
        nonlocal reads
        reads += 1
        return await store_outcomes(shard, ids)

    monkeypatch.setattr(service._store.results, "outcomes", counted)
    gate = asyncio.Event()

    async def slow(event: Thumb) -> str:
        await gate.wait()
        return "done"

    service.add_handler(Thumb, slow)
    async with service:
        await service.enqueue_with_delay(Thumb(id="w"), 0)
        waiter = asyncio.create_task(service.result(Thumb, "w", timeout=20))
        await asyncio.sleep(1.0)  # the waiter waits: it must not read meanwhile
        assert reads == 1
        released = time.monotonic()
        gate.set()
        assert await waiter == "done"
        assert time.monotonic() - released < 3  # far below the 30 s re-check
        assert reads == 2


async def test_results_expire_on_redis_time(redis_url: str, prefix: str, wait_for: Any) -> None:
    service = EventService.from_url(redis_url, prefix=prefix, **FAST)
    keys = PrefixKeys(prefix).for_type(Brief.event_name)

    async def handle(event: Brief) -> int:
        return 7

    service.add_handler(Brief, handle)
    client = aioredis.from_url(redis_url)
    try:
        async with service:
            await service.enqueue_with_delay(Brief(id="one"), 0)
            assert await service.result(Brief, "one", timeout=10) == 7
            await asyncio.sleep(0.4)  # past the 300 ms on Redis's clock too
            with pytest.raises(LookupError):
                await service.result(Brief, "one", timeout=1)
            # the next ack sweeps the expired record
            await service.enqueue_with_delay(Brief(id="two"), 0)
            assert await service.result(Brief, "two", timeout=10) == 7
            assert not await client.hexists(keys.results, "one")
            assert await client.zcard(keys.rexp) == 1
    finally:
        await client.aclose()


async def test_replace_waits_for_the_new_run(redis_url: str, prefix: str) -> None:
    service = EventService.from_url(redis_url, prefix=prefix, **FAST)
    service.add_handler(Thumb, _thumb)
    async with service:
        await service.enqueue_with_delay(Thumb(id="r", path="first"), 0)
        assert (await service.result(Thumb, "r", timeout=10))["path"] == "first"
        await service.enqueue_with_delay(Thumb(id="r", path="second"), 0.3, replace=True)
        assert (await service.results(Thumb, ["r"]))["r"].status == "pending"
        assert (await service.result(Thumb, "r", timeout=10))["path"] == "second"


async def test_a_partitioned_type(redis_url: str, prefix: str) -> None:
    service = EventService.from_url(redis_url, prefix=prefix, **FAST)

    async def handle(event: Spread) -> int:
        return event.n * 2

    service.add_handler(Spread, handle, concurrency=8)
    async with service:
        await service.enqueue_many([Spread(id=f"s{i}", n=i) for i in range(20)])
        values = await asyncio.gather(
            *(service.result(Spread, f"s{i}", timeout=15) for i in range(20))
        )
        assert values == [2 * i for i in range(20)]
        many = await service.results(Spread, [f"s{i}" for i in range(20)])
        assert [o.value for o in many.values()] == values


async def test_plain_types_keep_nothing(redis_url: str, prefix: str, wait_for: Any) -> None:
    service = EventService.from_url(redis_url, prefix=prefix, **FAST)
    done: list[str] = []

    async def handle(event: Plain) -> str:
        done.append(event.id)
        return "ignored"

    service.add_handler(Plain, handle)
    client = aioredis.from_url(redis_url)
    try:
        async with service:
            await service.enqueue_with_delay(Plain(id="p"), 0)
            await wait_for(lambda: done == ["p"], timeout=10)
            await wait_for(lambda: True, timeout=1)
        keys = PrefixKeys(prefix).for_type(Plain.event_name)
        assert not await client.exists(keys.results, keys.rexp)
    finally:
        await client.aclose()


async def test_results_on_a_cluster(cluster: RedisClusterServer, prefix: str) -> None:
    service = EventService.from_url(cluster.url, cluster=True, prefix=prefix, **FAST)

    async def handle(event: Spread) -> int:
        if event.n == 3:
            raise ValueError("three")
        return event.n

    service.add_handler(Spread, handle, concurrency=8)
    service2 = EventService.from_url(cluster.url, cluster=True, prefix=prefix, retry_attempts=0)
    service.add_handler(Thumb, _thumb)
    async with service:
        await service.enqueue_many([Spread(id=f"c{i}", n=i) for i in range(8)])
        await service.enqueue_with_delay(Thumb(id="t", path="q"), 0)
        assert await service.result(Thumb, "t", timeout=15) == {"path": "q", "size": [64, 64]}
        for i in (0, 1, 2, 4, 7):
            assert await service.result(Spread, f"c{i}", timeout=15) == i
        async with service2:
            many = await service2.results(Spread, [f"c{i}" for i in range(8)])
        assert many["c5"].value == 5
        assert many["c3"].status in ("pending", "failed")


def test_public_names() -> None:
    assert delayq.Result(False).value is False
    assert issubclass(delayq.EventFailed, delayq.DelayqError)


async def test_a_requeued_dead_letter_is_waited_for(redis_url: str, prefix: str) -> None:
    service = EventService.from_url(redis_url, prefix=prefix, retry_attempts=0, **FAST)
    fixed_now = asyncio.Event()

    async def handle(event: Thumb) -> str:
        if not fixed_now.is_set():
            raise RuntimeError("broken")
        return "repaired"

    service.add_handler(Thumb, handle)
    async with service:
        await service.enqueue_with_delay(Thumb(id="d"), 0)
        with pytest.raises(EventFailed):
            await service.result(Thumb, "d", timeout=10)
        fixed_now.set()
        assert await service.requeue_dead_letters(Thumb, ["d"], delay=0.3) == 1
        assert (await service.results(Thumb, ["d"]))["d"].status == "pending"
        assert await service.result(Thumb, "d", timeout=10) == "repaired"


async def test_with_delivery_groups_the_last_group_finishes_the_event(
    redis_url: str, prefix: str
) -> None:
    service = EventService.from_url(redis_url, prefix=prefix, **FAST)
    slow_gate = asyncio.Event()

    async def fast(event: Thumb) -> str:
        return "fast"

    async def slow(event: Thumb) -> str:
        await slow_gate.wait()
        return "slow"

    service.add_handler(Thumb, fast)  # the default group is a group too
    service.add_handler(Thumb, fast, group="fast")
    service.add_handler(Thumb, slow, group="slow")
    async with service:
        await service.enqueue_with_delay(Thumb(id="g"), 0)
        waiter = asyncio.create_task(service.result(Thumb, "g", timeout=20))
        with pytest.raises(TimeoutError):  # two groups are done, the slow one is not
            await service.result(Thumb, "g", timeout=1.0)
        assert not waiter.done()
        slow_gate.set()
        assert await waiter == "slow"


def test_delayq_inspect_shows_a_kept_result(
    redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from delayq.cli.app import main

    async def handled() -> None:
        service = EventService.from_url(redis_url, prefix=prefix, **FAST)
        service.add_handler(Thumb, _thumb)
        async with service:
            await service.enqueue_with_delay(Thumb(id="cli", path="c.png"), 0)
            await service.result(Thumb, "cli", timeout=10)

    asyncio.run(handled())
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DELAYQ_PREFIX", prefix)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["inspect", Thumb.event_name, "cli"]) == 0
    out = capsys.readouterr().out
    assert "result" in out and "kept" in out
    assert main(["inspect", Thumb.event_name, "cli", "--json"]) == 0
    assert '"outcome": "ok"' in capsys.readouterr().out


async def test_stats_count_the_kept_results(redis_url: str, prefix: str) -> None:
    service = EventService.from_url(redis_url, prefix=prefix, **FAST)
    service.add_handler(Thumb, _thumb, concurrency=4)
    async with service:
        await service.enqueue_many([Thumb(id=f"k{i}", path="p") for i in range(5)])
        for i in range(5):
            await service.result(Thumb, f"k{i}", timeout=10)
        assert (await service.stats_for(Thumb)).results_kept == 5
        assert (await service.stats_for(Plain)).results_kept == 0


async def test_a_value_that_cannot_be_kept_fails_the_delivery(redis_url: str, prefix: str) -> None:
    service = EventService.from_url(redis_url, prefix=prefix, retry_attempts=0, **FAST)

    async def handle(event: Thumb) -> object:
        return object()  # no serializer encodes it

    service.add_handler(Thumb, handle)
    async with service:
        await service.enqueue_with_delay(Thumb(id="odd"), 0)
        with pytest.raises(EventFailed) as failed:
            await service.result(Thumb, "odd", timeout=10)
        assert failed.value.error.startswith("ResultNotKept: ")
