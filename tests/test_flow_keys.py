"""Flow keys (issue 22): fair turns between keys, per-key concurrency and rate.

Fairness is counted in claims: each claim of a group takes the next number of its
``claims`` counter, so the order of starts is exact whatever the clock says.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from test_flow import FlowJob, Workers, started

from delayq import Event, EventService, FlowLimits, Rate, current_delivery
from delayq.keys import TypeKeys
from delayq.testing import wait_for

FAST = {"visibility_timeout": 5.0, "scheduling_interval": 0.2, "lock_timeout": 1.0,
        "polling_timeout": 1.0, "shutdown_grace": 2.0}  # fmt: skip


class KeyJob(Event, event_name="key-job"):
    """An event served under a flow key given at enqueue."""

    n: int = 0


class TenantJob(Event, event_name="tenant-job", flow_key="tenant"):
    """An event whose ``tenant`` field is its flow key."""

    tenant: str = ""


@pytest.fixture
def workers(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(redis_url, prefix, tmp_path)
    yield w
    w.close()


@pytest.fixture
async def service(redis_url: str, prefix: str) -> AsyncIterator[EventService]:
    svc = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False, **FAST)
    yield svc
    await svc.aclose()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, protocol=2)
    yield client
    await client.aclose()


async def test_fair_turns_bound(redis_url: str, prefix: str) -> None:
    """Key A has 100,000 ready events, key B 10: with two keys in rotation, B's j-th event
    is among the first 2·j claims (one turn per key per round)."""
    starts: list[tuple[str | None, str]] = []

    async def handle(event: KeyJob) -> None:
        d = current_delivery()
        assert d is not None
        starts.append((d.flow_key, event.id))

    async with EventService.from_url(redis_url, prefix=prefix, **FAST) as producer:
        for first in range(0, 100_000, 20_000):
            await producer.enqueue_many(
                [KeyJob(id=f"a{i:06d}") for i in range(first, first + 20_000)], key="A"
            )
        await producer.enqueue_many([KeyJob(id=f"b{i:02d}") for i in range(10)], key="B")
        assert (await producer.stats_for(KeyJob)).ready == 100_010
    async with EventService.from_url(redis_url, prefix=prefix, **FAST) as svc:
        svc.add_handler(KeyJob, handle, concurrency=4)
        await svc.start()
        await wait_for(lambda: sum(k == "B" for k, _ in starts) == 10, timeout=30)
    b_positions = [i + 1 for i, (k, _) in enumerate(starts) if k == "B"]
    for j, position in enumerate(b_positions, 1):
        assert position <= 2 * j, (j, position, starts[:30])
    # each key in its own order
    assert [e for k, e in starts if k == "B"] == [f"b{i:02d}" for i in range(10)]
    a_ids = [e for k, e in starts if k == "A"]
    assert a_ids == sorted(a_ids) and a_ids[0] == "a000000"


async def orders(raw: aioredis.Redis, prefix: str, keys: list[str]) -> dict[str, list[str]]:
    """Each key's handler starts, in order: the ids."""
    out = {}
    for key in keys:
        entries = await raw.lrange(f"{prefix}-test:order:{key}", 0, -1)
        out[key] = [e.decode().split(":")[1] for e in entries]
    return out


async def test_per_key_concurrency_one_is_ordered(
    service: EventService, workers: Workers, raw: aioredis.Redis, prefix: str
) -> None:
    """per_key_concurrency=1 over three worker processes: each key's events run one at a
    time, in the order they became ready, while different keys run side by side."""
    await service.set_limits(FlowJob, per_key_concurrency=1)
    keys = [f"t{k}" for k in range(6)]
    names = ["w1", "w2", "w3"]
    for name in names:
        workers.start(name, "work", "--ms", "15", "--concurrency", "4")
    # every worker up before the events exist: on a loaded machine the first one up
    # could otherwise handle them all before the others start
    await started(raw, prefix, names)
    # ready now, then due over the next second through the scheduler, interleaved
    for k in keys:
        await service.enqueue_many([FlowJob(id=f"{k}-{i:03d}") for i in range(10)], key=k)
    for i in range(10, 30):
        for k in keys:
            await service.enqueue_with_delay(FlowJob(id=f"{k}-{i:03d}"), 0.03 * i, key=k)

    async def all_done() -> bool:
        return int(await raw.hlen(f"{prefix}-test:done")) == 6 * 30

    await wait_for(all_done, timeout=60, message="every keyed event handled")
    kmax = {k.decode(): int(v) for k, v in (await raw.hgetall(f"{prefix}-test:kmax")).items()}
    assert kmax == dict.fromkeys(keys, 1)
    got = await orders(raw, prefix, keys)
    for k in keys:
        assert got[k] == [f"{k}-{i:03d}" for i in range(30)]
    # keys ran side by side, across processes
    assert int(await raw.get(f"{prefix}-test:max")) > 1
    assert len({e.decode().rsplit(":", 1)[1]
                for e in await raw.lrange(f"{prefix}-test:starts", 0, -1)}) > 1  # fmt: skip


async def test_sigkilled_worker_frees_its_key_within_the_lease(
    service: EventService, workers: Workers, raw: aioredis.Redis, prefix: str
) -> None:
    """A worker SIGKILLed while it holds a key's only slot: the key comes back when the
    lease runs out, the killed event first (it was first in line), then the rest in order."""
    await service.set_limits(FlowJob, per_key_concurrency=1)
    workers.start("hang", "hang", "--visibility", "2")
    await started(raw, prefix, ["hang"])
    await service.enqueue_many([FlowJob(id=f"k-{i}") for i in range(5)], key="K")

    async def hung() -> bool:
        return int(await raw.llen(f"{prefix}-test:hung")) == 1

    await wait_for(hung, timeout=20, message="the hanging worker took the key's first event")
    workers.procs["hang"].send_signal(signal.SIGKILL)
    workers.procs["hang"].wait()
    workers.start("w", "work", "--ms", "5")
    await started(raw, prefix, ["hang", "w"])

    async def all_done() -> bool:
        return int(await raw.hlen(f"{prefix}-test:done")) == 5

    await wait_for(all_done, timeout=30, message="the key came back after the lease")
    assert (await orders(raw, prefix, ["K"]))["K"] == [f"k-{i}" for i in range(5)]
    assert int(await raw.hget(f"{prefix}-test:kmax", "K")) == 1


async def test_per_key_rate(
    service: EventService, workers: Workers, raw: aioredis.Redis, prefix: str
) -> None:
    """per_key_rate="10/s" (burst 1) over three processes: each key's starts are spaced at
    least ~100 ms apart on Redis's clock (the GCRA bound), keys run side by side, and a
    key waiting for its token does not hold the others up."""
    limits = await service.set_limits(FlowJob, per_key_rate="10/s")
    assert limits.per_key_rate == Rate(10, 1000, 1)
    keys = ["r0", "r1", "r2"]
    for k in keys:
        await service.enqueue_many([FlowJob(id=f"{k}-{i:02d}") for i in range(12)], key=k)
    await service.enqueue_many([FlowJob(id=f"free-{i}") for i in range(30)], key=None)
    names = ["w1", "w2", "w3"]
    for name in names:
        workers.start(name, "work", "--ms", "2")
    await started(raw, prefix, names)

    async def all_done() -> bool:
        return int(await raw.hlen(f"{prefix}-test:done")) == 3 * 12 + 30

    await wait_for(all_done, timeout=60, message="every event handled")
    per_key: dict[str, list[int]] = {}
    for entry in await raw.lrange(f"{prefix}-test:starts", 0, -1):
        us, rest = entry.decode().split(":", 1)
        per_key.setdefault(rest.split("-", 1)[0], []).append(int(us))
    for k in keys:
        times = sorted(per_key[k])
        assert len(times) == 12
        # GCRA with burst 1: in any window of w ms at most 1 + w * 10 / 1000 starts
        # (claimed_us is the claim's Redis time; 1 ms of slack for its rounding)
        for i in range(len(times)):
            for j in range(i + 1, len(times)):
                w_ms = (times[j] - times[i]) / 1000 + 1
                assert j - i + 1 <= 1 + w_ms * 10 / 1000, (k, i, j, times)
    # the events without a key (their own shared key '') are held to the same rate
    free = sorted(per_key["free"])
    assert (free[-1] - free[0]) / 1e6 >= 2.8


async def test_keys_with_groups(redis_url: str, prefix: str) -> None:
    """Each delivery group rotates over the keys on its own: both groups get every event,
    each key in order, and a big key does not hold a small one up in either group."""
    starts: dict[str, list[tuple[str | None, str]]] = {"default": [], "audit": []}

    async def record(event: KeyJob) -> None:
        d = current_delivery()
        assert d is not None
        starts[d.group].append((d.flow_key, event.id))

    async with EventService.from_url(redis_url, prefix=prefix, **FAST) as svc:
        svc.add_handler(KeyJob, record, concurrency=2)
        svc.add_handler(KeyJob, record, concurrency=2, group="audit")
        await svc.start()
        await svc.enqueue_many([KeyJob(id=f"a{i:04d}") for i in range(2000)], key="A")
        await svc.enqueue_many([KeyJob(id=f"b{i}") for i in range(5)], key="B")

        def b_done() -> bool:
            return all(sum(k == "B" for k, _ in s) == 5 for s in starts.values())

        await wait_for(b_done, timeout=30)
    for group, got in starts.items():
        b = [e for k, e in got if k == "B"]
        assert b == [f"b{i}" for i in range(5)], group
        a = [e for k, e in got if k == "A"]
        assert a == sorted(a), group
        # once B is in rotation, each round gives each key one turn (in either order):
        # B's j-th start comes at most 2(j-1) + 1 starts after its first
        positions = [i for i, (k, _) in enumerate(got) if k == "B"]
        for j, position in enumerate(positions, 1):
            assert position - positions[0] <= 2 * (j - 1) + 1, (group, positions, got[:15])


async def test_flow_key_field_cancel_replace_and_counts(
    service: EventService, raw: aioredis.Redis, prefix: str
) -> None:
    """The class's flow_key field supplies the key; cancel and replace of a keyed event
    leave nothing behind; counts include events waiting in their keys' lists."""
    tk = TypeKeys(prefix, "tenant-job")
    assert TenantJob.event_flow_key == "tenant"
    with pytest.raises(TypeError):

        class Bad(Event, event_name="bad-flow-key", flow_key="nope"):
            pass

    await service.enqueue_with_delay(TenantJob(id="x", tenant="acme"), 0)
    await service.enqueue_with_delay(TenantJob(id="y", tenant="acme"), 60)
    await service.enqueue_with_delay(TenantJob(id="z", tenant="zeta"), 0, key="other")
    # '' -> 1: the type uses keys (ids are never empty)
    assert await raw.hgetall(tk.fkeys) == {
        b"": b"1", b"x": b"acme", b"y": b"acme", b"z": b"other"}  # fmt: skip
    counts = await service.stats_for(TenantJob)
    assert (counts.ready, counts.scheduled) == (2, 1)
    assert await raw.lrange(tk.ready, 0, -1) == [b"k:other", b"k:acme"]
    # replaced without a key: its key goes; the stale entry in acme's list is skipped
    await service.enqueue_with_delay(TenantJob(id="x", tenant=""), 0, replace=True)
    assert await service.cancel(TenantJob, "z")
    assert await raw.hgetall(tk.fkeys) == {b"": b"1", b"y": b"acme"}
    assert (await service.stats_for(TenantJob)).ready == 1
    for bad in ("x" * 201, "a\0b", ""):
        with pytest.raises(ValueError):
            await service.enqueue_with_delay(TenantJob(id="w"), 0, key=bad)
    with pytest.raises(TypeError):
        await service.enqueue_with_delay(TenantJob(id="w"), 0, key=1.5)  # type: ignore[arg-type]


async def test_unkeyed_type_keeps_its_layout(
    service: EventService, raw: aioredis.Redis, prefix: str
) -> None:
    """A type that never used keys: no marker, no key list, no keyed flag."""
    await service.enqueue_many([FlowJob(id=f"p{i}") for i in range(3)])
    tk = TypeKeys(prefix, "flow-job")
    assert await raw.hget(tk.meta, "keyed") is None
    assert all(e[:1].isdigit() for e in await raw.lrange(tk.ready, 0, -1))
    assert await raw.keys(f"{tk.tag}:ready:*") == []
    assert await service.limits(FlowJob) == FlowLimits()


async def test_key_backlog_api_and_dashboard(
    service: EventService, raw: aioredis.Redis, prefix: str
) -> None:
    """The biggest per-key backlogs, through the API and on the dashboard's type page
    (keys come from producers: escaped), read-only."""
    import httpx

    from delayq.dashboard import create_app

    evil = "<script>alert(1)</script>"
    await service.enqueue_many([KeyJob(id=f"a{i}") for i in range(30)], key="big")
    await service.enqueue_many([KeyJob(id=f"e{i}") for i in range(3)], key=evil)
    await service.enqueue_with_delay(KeyJob(id="plain"), 0, key="small")
    await service.set_limits(KeyJob, per_key_concurrency=2)
    got = await service.key_backlog(KeyJob, limit=2)
    assert (got.in_rotation, got.parked, got.scanned) == (3, 0, 3)
    assert [(k.key, k.ready, k.running, k.parked_until) for k in got.keys] == [
        ("big", 30, 0, None), (evil, 3, 0, None)]  # fmt: skip
    with pytest.raises(ValueError):
        await service.key_backlog(KeyJob, limit=0)

    async def state() -> list[tuple[bytes, object]]:
        keys = sorted(k for k in await raw.keys(f"*{prefix}*") if not k.endswith(b":wake"))
        return [(k, await raw.dump(k)) for k in keys]

    before = await state()
    app = create_app(service, read_only=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash.test") as http:  # fmt: skip
        page = await http.get("/type", params={"name": "key-job"})
    assert page.status_code == 200
    assert 'id="flow-keys"' in page.text and 'id="limit-key-concurrency">2<' in page.text
    assert evil not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert await state() == before
    # an unkeyed type has no such section
    assert (await service.key_backlog(FlowJob)).keys == []


async def test_marker_of_a_dead_consumer_comes_back(
    redis_url: str, prefix: str, raw: aioredis.Redis
) -> None:
    """A consumer that popped a key's marker and died before claiming: the scheduler puts the
    key back after the visibility timeout (as it does for entries), nothing is lost."""
    tk = TypeKeys(prefix, "key-job")
    done: set[str] = set()

    async def handle(event: KeyJob) -> None:
        done.add(event.id)

    opts = {**FAST, "visibility_timeout": 1.0}
    async with EventService.from_url(redis_url, prefix=prefix, **opts) as producer:
        await producer.enqueue_many([KeyJob(id=f"x{i}") for i in range(5)], key="X")
        await producer.enqueue_many([KeyJob(id=f"y{i}") for i in range(5)], key="Y")
        assert await raw.rpop(tk.ready) == b"k:X"  # popped, never claimed: a dead consumer
        assert (await producer.inspect(KeyJob, "x0")).state == "ready"
    async with EventService.from_url(redis_url, prefix=prefix, **opts) as svc:
        svc.add_handler(KeyJob, handle)
        await svc.start()
        await wait_for(lambda: len(done) == 10, timeout=30, message="X came back")


async def test_every_enqueue_route_takes_a_key(
    service: EventService, raw: aioredis.Redis, prefix: str
) -> None:
    """enqueue_at, enqueue_with_delay, enqueue_many and enqueue_envelopes all carry keys."""
    from datetime import datetime, timedelta, timezone

    from delayq.codec import Codec

    tk = TypeKeys(prefix, "key-job")
    when = datetime.now(timezone.utc) + timedelta(hours=1)
    assert await service.enqueue_at(KeyJob(id="at"), when, key="k-at")
    assert await service.enqueue_with_delay(KeyJob(id="wd"), 10, key=42)  # type: ignore[arg-type]
    assert await service.enqueue_many([KeyJob(id="m1"), (KeyJob(id="m2"), 5)], key="k-many")
    env = Codec().encode(KeyJob(id="env"), None)
    codes = await service.enqueue_envelopes(
        "key-job", [("env", env, 0), ("env2", env, 0)], keys=["k-env", None]
    )
    assert codes == [1, 1]
    with pytest.raises(ValueError):
        await service.enqueue_envelopes("key-job", [("x", env, 0)], keys=["a", "b"])
    assert await raw.hgetall(tk.fkeys) == {
        b"": b"1", b"at": b"k-at", b"wd": b"42", b"m1": b"k-many", b"m2": b"k-many",
        b"env": b"k-env"}  # fmt: skip
    # due now: m1, env and env2 (no key: the key "")
    got = await service.key_backlog(KeyJob)
    assert {(k.key, k.ready) for k in got.keys} == {("k-many", 1), ("k-env", 1), ("", 1)}


async def test_per_key_concurrency_of_one_group(redis_url: str, prefix: str) -> None:
    """A group's per-key limit is its own: group "audit" runs each key's events one at a
    time and in order, while the default group (no limit) runs a key's events side by side."""
    running: dict[tuple[str, str | None], int] = {}
    peak: dict[tuple[str, str | None], int] = {}
    order: dict[tuple[str, str | None], list[str]] = {}

    async def handle(event: KeyJob) -> None:
        d = current_delivery()
        assert d is not None
        k = (d.group, d.flow_key)
        running[k] = running.get(k, 0) + 1
        peak[k] = max(peak.get(k, 0), running[k])
        order.setdefault(k, []).append(event.id)
        await asyncio.sleep(0.01)
        running[k] -= 1

    async with EventService.from_url(redis_url, prefix=prefix, **FAST) as svc:
        svc.add_handler(KeyJob, handle, concurrency=8)
        svc.add_handler(KeyJob, handle, concurrency=8, group="audit")
        await svc.set_limits(KeyJob, per_key_concurrency=1, group="audit")
        assert (await svc.limits(KeyJob)).per_key_concurrency is None
        for k in ("p", "q"):
            await svc.enqueue_many([KeyJob(id=f"{k}{i:02d}") for i in range(20)], key=k)
        await svc.start()

        def all_done() -> bool:
            return sum(len(v) for v in order.values()) == 2 * 2 * 20

        await wait_for(all_done, timeout=60)
    for k in ("p", "q"):
        assert peak[("audit", k)] == 1
        assert order[("audit", k)] == [f"{k}{i:02d}" for i in range(20)]
        assert peak[("default", k)] > 1
