"""Batches (``async with service.batch(...)``): callbacks exactly once when every member
is done, ``on_success`` only if all succeeded, member-added members, nesting, the open
lease, ``batch_info`` and ``batches()`` (docs/WORKFLOWS.md, "Batches")."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from delayq import (
    BATCH_TYPE,
    Batch,
    BatchClosedError,
    BatchCounts,
    BatchInfo,
    Event,
    EventService,
    current_delivery,
    fixed,
)
from delayq.batches import FAILED_LISTED, FAILED_SHOWN
from delayq.keyspace.layout import PrefixKeys
from delayq.keyspace.shards import BATCH_SHARDS, batch_shard, shards

FAST: dict[str, Any] = {
    "scheduling_interval": 0.1,
    "polling_timeout": 0.5,
    "visibility_timeout": 2.0,
    "retry_backoff": fixed(0.05),
    "retry_attempts": 0,
    "shutdown_grace": 1.0,
}


class Row(Event, event_name="bt-row", results=timedelta(hours=1)):
    n: int = 0
    fail: bool = False


class Plain(Event, event_name="bt-plain"):
    fail: bool = False


class Adder(Event, event_name="bt-adder"):
    """A member that adds members to its own batch (``extra`` of them)."""

    extra: int = 0
    fail_first: bool = False


class Opener(Event, event_name="bt-opener"):
    """A member that opens a nested batch of ``extra`` rows."""

    extra: int = 0


class Done(Event, event_name="bt-done"):
    pass


class Ok(Event, event_name="bt-ok"):
    pass


class Recorder:
    """The handlers; what each callback saw."""

    def __init__(self) -> None:
        self.callbacks: dict[tuple[str, str], list[Batch | None]] = {}
        self.runs: dict[tuple[str, str], int] = {}
        self.gate: asyncio.Event | None = None
        self.parents: dict[tuple[str, str], Any] = {}

    def _ran(self, event: Event) -> None:
        key = (type(event).event_name, event.id)
        self.runs[key] = self.runs.get(key, 0) + 1

    async def row(self, event: Row) -> object:
        self._ran(event)
        if self.gate is not None:
            await self.gate.wait()
        if event.fail:
            raise RuntimeError(f"row {event.n} is bad")
        return {"n": event.n * 10}

    async def plain(self, event: Plain) -> None:
        self._ran(event)
        if event.fail:
            raise RuntimeError("plain failed")

    async def adder(self, event: Adder) -> None:
        self._ran(event)
        batch = current_delivery().batch  # type: ignore[union-attr]
        assert batch is not None and batch.member == ("bt-adder", event.id)
        await batch.enqueue_many([Row(id=f"{event.id}-{i}", n=i) for i in range(event.extra)])
        if event.fail_first and self.runs[("bt-adder", event.id)] == 1:
            raise RuntimeError("first run fails after adding")

    async def opener(self, event: Opener) -> None:
        self._ran(event)
        async with self.service.batch(name=f"child of {event.id}") as child:
            assert child.parent is not None
            await child.enqueue_many([Row(id=f"{event.id}-{i}", n=i) for i in range(event.extra)])

    async def callback(self, event: Event) -> None:
        self._ran(event)
        d = current_delivery()
        assert d is not None
        self.callbacks.setdefault((type(event).event_name, event.id), []).append(d.batch)
        self.parents[type(event).event_name, event.id] = d.parents

    service: EventService


def _service(url: str, prefix: str, rec: Recorder, **options: Any) -> EventService:
    service = EventService.from_url(url, prefix=prefix, **{**FAST, **options})
    rec.service = service
    service.add_handler(Row, rec.row, concurrency=50)
    service.add_handler(Plain, rec.plain)
    service.add_handler(Adder, rec.adder)
    service.add_handler(Opener, rec.opener)
    service.add_handler(Done, rec.callback)
    service.add_handler(Ok, rec.callback)
    return service


async def test_callbacks_once_with_counts_failed_ids_and_results(redis_url, prefix, wait_for):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        async with service.batch(
            on_complete=Done(id="d1"), on_success=Ok(id="o1"), name="import 7"
        ) as batch:
            assert isinstance(batch, Batch) and batch.name == "import 7"
            assert await batch.enqueue_with_delay(Row(id="r1", n=1), 0)
            assert await batch.enqueue_many([Row(id="r2", n=2), (Row(id="r3", n=3), 0.05)]) == [
                True,
                True,
            ]
            assert await batch.enqueue_at(Row(id="r4", n=4, fail=True), _now())
            assert not await batch.enqueue_with_delay(Row(id="r1", n=1), 0)  # a member already
            info = await service.batch_info(batch.id)
            assert info.state == "open" and info.name == "import 7" and info.total == 4
        await wait_for(lambda: ("bt-done", "d1") in rec.callbacks, timeout=10)
        (seen,) = rec.callbacks["bt-done", "d1"]
        assert seen is not None and seen.id == batch.id and seen.info is not None
        final = seen.info
        assert (final.total, final.succeeded, final.failed) == (4, 3, 1)
        assert final.failed_ids == (("bt-row", "r4"),) and final.state == "done"
        assert final.on_complete == ("bt-done", "d1") and final.on_success == ("bt-ok", "o1")
        (parent,) = rec.parents["bt-done", "d1"]
        assert (parent.event_type, parent.id, parent.status) == (BATCH_TYPE, batch.id, "failed")
        assert parent.error == "1 of 4 members failed"
        members = {m.id: m for m in await seen.members()}
        assert members["r2"].status == "ok" and members["r2"].value == {"n": 20}
        assert members["r4"].failed and "row 4 is bad" in (members["r4"].error or "")
        # on_success was skipped (a member failed): it never runs
        await wait_for(lambda: _skipped(service, Ok, "o1"), timeout=5)
        assert ("bt-ok", "o1") not in rec.runs
        # the callback's parent is the batch, failed
        info = await service.batch_info(batch.id)
        assert info.state == "done" and info.ok is False and info.done_at is not None
        assert info.expires_at is not None and info.waiting_on == ()


async def _skipped(service: EventService, t: type[Event], event_id: str) -> bool:
    return (await service.inspect(t, event_id)).state == "absent"


def _now() -> Any:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


async def test_all_succeeded_runs_both_once(redis_url, prefix, wait_for):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        async with service.batch(on_complete=Done(id="d"), on_success=Ok(id="o")) as batch:
            await batch.enqueue_many([Plain(id=f"p{i}") for i in range(20)])
        await wait_for(lambda: ("bt-ok", "o") in rec.runs and ("bt-done", "d") in rec.runs)
        (ok,) = rec.callbacks["bt-ok", "o"]
        assert ok is not None and ok.info is not None and ok.info.ok
        assert ok.info.succeeded == 20 and ok.info.failed == 0
        d = current_delivery()
        assert d is None
        await asyncio.sleep(0)  # (nothing else runs later: checked below with the counts)
        assert rec.runs["bt-ok", "o"] == 1 and rec.runs["bt-done", "d"] == 1


async def test_an_empty_batch_completes_at_once(redis_url, prefix, wait_for):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        async with service.batch(on_complete=Done(id="e"), on_success=Ok(id="e")) as batch:
            pass
        await wait_for(lambda: ("bt-ok", "e") in rec.runs and ("bt-done", "e") in rec.runs)
        info = await service.batch_info(batch.id)
        assert info.state == "done" and info.total == 0 and info.ok


async def test_a_block_that_raises_still_closes_the_batch(redis_url, prefix, wait_for):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        with pytest.raises(ZeroDivisionError):
            async with service.batch(on_complete=Done(id="r")) as batch:
                await batch.enqueue_with_delay(Plain(id="x"), 0)
                1 / 0  # noqa: B018
        await wait_for(lambda: ("bt-done", "r") in rec.runs)
        info = await service.batch_info(batch.id)
        assert info.total == 1 and info.state == "done"
        with pytest.raises(BatchClosedError):
            await batch.enqueue_with_delay(Plain(id="late"), 0)


async def test_member_added_members_count_once_even_when_retried(redis_url, prefix, wait_for):
    rec = Recorder()
    async with _service(redis_url, prefix, rec, retry_attempts=2) as service:
        async with service.batch(on_complete=Done(id="m")) as batch:
            await batch.enqueue_with_delay(Adder(id="a", extra=5, fail_first=True), 0)
        await wait_for(lambda: ("bt-done", "m") in rec.runs, timeout=10)
        (seen,) = rec.callbacks["bt-done", "m"]
        assert seen is not None and seen.info is not None
        assert (seen.info.total, seen.info.succeeded, seen.info.failed) == (6, 6, 0)
        assert rec.runs["bt-adder", "a"] == 2
        assert all(rec.runs[("bt-row", f"a-{i}")] == 1 for i in range(5))


async def test_nested_batches_two_levels(redis_url, prefix, wait_for):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        async with service.batch(on_complete=Done(id="top"), on_success=Ok(id="top")) as batch:
            await batch.enqueue_many([Opener(id="o1", extra=3), Opener(id="o2", extra=2)])
            await batch.enqueue_with_delay(Plain(id="p"), 0)
        await wait_for(lambda: ("bt-ok", "top") in rec.runs, timeout=10)
        info = await service.batch_info(batch.id)
        assert (info.total, info.succeeded) == (5, 5)  # 2 openers, their 2 batches, 1 plain
        members = await rec.callbacks["bt-ok", "top"][0].members()  # type: ignore[union-attr]
        children = [m for m in members if m.event_type == BATCH_TYPE]
        assert len(children) == 2 and all(m.status == "ok" for m in children)
        for child in children:
            child_info = await service.batch_info(child.id)
            assert child_info.parent == batch.id and child_info.state == "done"
            assert child_info.name is not None and child_info.name.startswith("child of")


async def test_batches_lists_by_state(redis_url, prefix, wait_for):
    rec = Recorder()
    rec.gate = asyncio.Event()
    async with _service(redis_url, prefix, rec) as service:
        async with service.batch(name="done one") as first:
            pass
        async with service.batch(name="waiting one") as second:
            await second.enqueue_with_delay(Row(id="w"), 0)
        async with service.batch(name="open one") as third:
            listed = await service.batches()
            assert [b.id for b in listed] == [third.id, second.id, first.id]
            assert [b.id for b in await service.batches("open")] == [third.id]
            assert [b.id for b in await service.batches("waiting")] == [second.id]
            assert [b.id for b in await service.batches("done")] == [first.id]
            await wait_for(lambda: ("bt-row", "w") in rec.runs)
            stuck = await service.batches("stuck", stuck_after=0.001)
            assert [b.id for b in stuck] == [second.id]
            assert stuck[0].stuck_reason and stuck[0].waiting_on == ()
            info = await service.batch_info(second.id, members=5)
            assert info.waiting_on == (("bt-row", "w"),)
        rec.gate.set()
        await wait_for(lambda: _state(service, second.id, "done"))
        with pytest.raises(LookupError):
            await service.batch_info("nosuchbatch")
        with pytest.raises(ValueError):
            await service.batches("nope")  # type: ignore[arg-type]


async def test_a_listing_carries_a_few_failed_ids(redis_url, prefix, wait_for):
    """``batches()`` stays light: at most FAILED_LISTED failed ids per batch (``failed``
    counts all); ``batch_info()`` lists up to FAILED_SHOWN."""
    n = FAILED_LISTED + 2
    async with _service(redis_url, prefix, Recorder()) as service:
        async with service.batch() as batch:
            await batch.enqueue_many([Plain(id=f"f{i}", fail=True) for i in range(n)])
        await wait_for(lambda: _state(service, batch.id, "done"), timeout=10)
        (listed,) = await service.batches()
        info = await service.batch_info(batch.id)
    assert listed.failed == info.failed == n
    assert len(listed.failed_ids) == FAILED_LISTED
    assert listed.failed_ids == info.failed_ids[:FAILED_LISTED] and len(info.failed_ids) == n
    assert FAILED_SHOWN == 1000


async def _state(service: EventService, batch_id: str, state: str) -> bool:
    info: BatchInfo = await service.batch_info(batch_id)
    return info.state == state


def test_batch_shards_never_share_a_type_s_keys() -> None:
    keys = PrefixKeys("p")
    tags = {keys.for_shard(s).tag for s in shards(BATCH_TYPE, BATCH_SHARDS)}
    assert len(tags) == BATCH_SHARDS and all(t.startswith("{p:#batches/") for t in tags)
    assert batch_shard("abc") in shards(BATCH_TYPE, BATCH_SHARDS)


async def test_a_dead_producer_s_batch_is_closed_by_the_sweep(redis_url, prefix, wait_for):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        service._batches.lease_ms = 300
        opener = service.batch(on_complete=Done(id="dead"))
        batch = await opener.__aenter__()
        await batch.enqueue_with_delay(Plain(id="dp"), 0)
        # the producer "dies": its lease renewer stops, the block never ends
        renewer = opener._renewer  # type: ignore[attr-defined]
        renewer.cancel()
        await asyncio.wait([renewer])
        await wait_for(lambda: ("bt-done", "dead") in rec.runs, timeout=10)
        info = await service.batch_info(batch.id)
        assert info.state == "done" and info.total == 1


async def test_an_unconfirmed_add_is_settled_by_the_sweep(redis_url, prefix, wait_for):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        service._batches.grace_ms = 200
        assert service._scheduler is not None
        service._scheduler.relay.sweeper.grace_ms = 200
        async with service.batch(on_complete=Done(id="u")) as batch:
            # an add that died after its first step: the batch knows "ghost", nothing else
            code, _ = await service._store.batches.add(
                batch.id, ["bt-plain\0ghost"], grace_ms=200, adder=None
            )
            assert code == "a"
            await batch.enqueue_with_delay(Plain(id="real"), 0)
        await wait_for(lambda: ("bt-done", "u") in rec.runs, timeout=10)
        info = await service.batch_info(batch.id)
        assert (info.total, info.succeeded, info.unconfirmed) == (1, 1, 0)


async def test_a_member_the_sweep_drops_during_a_slow_add_still_counts(redis_url, prefix, wait_for):
    """An add slower than its grace: the sweep settles a member linked (``prelinked``) but
    not enqueued yet: it looks never enqueued and is dropped (unlinked). The add then
    enqueues it, finds it no longer unconfirmed, and links it again: its completion
    counts, as any member's whose completion arrives after it was dropped."""
    from delayq.operations.batches import link_members

    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        engine = service._batches
        real = engine._prelink

        async def prelinked_then_swept(batch: Batch, answers: dict[str, str]) -> set[str]:
            go = await real(batch, answers)
            refs = list(answers)
            # the sweep's settling of those adds, past their grace
            await link_members(
                service._store,
                batch.id,
                refs,
                engine.partitions,
                engine._noted.note,
                missing="drop",
            )
            return go

        async with service.batch(on_complete=Done(id="slow")) as batch:
            assert await batch.enqueue_with_delay(Plain(id="held"), 3600)  # keeps it waiting
            engine._prelink = prelinked_then_swept  # type: ignore[method-assign]
            try:
                assert await batch.enqueue_with_delay(Plain(id="slow"), 0)
            finally:
                del engine._prelink
            assert (await service.batch_info(batch.id)).total == 1  # "slow" was dropped

        async def counted() -> bool:
            return (await service.batch_info(batch.id)).succeeded == 1

        await wait_for(lambda: rec.runs.get(("bt-plain", "slow")) == 1, timeout=10)
        await wait_for(counted, timeout=10)
        await service.enqueue_with_delay(Plain(id="held"), 0, replace=True)
        await wait_for(lambda: ("bt-done", "slow") in rec.runs, timeout=10)
        info = await service.batch_info(batch.id)
        assert (info.total, info.succeeded, info.unconfirmed) == (2, 2, 0)


async def test_batch_counts_tell_stuck_batches_apart(redis_url, prefix, wait_for):
    """``batch_counts()`` from the shards' sorted sets: an open batch past its lease is
    stuck, and so is one holding an add no sweep settled (no relay runs here); their due
    sweep work is the batch shards' relay backlog."""
    service = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    try:
        assert await service.batch_counts() == BatchCounts(0, 0, 0, 0, 0, 0.0, 0)
        service._batches.lease_ms = 50
        dead = service.batch()  # its producer "dies": the lease is not renewed
        a = await dead.__aenter__()
        renewer = dead._renewer  # type: ignore[attr-defined]
        renewer.cancel()
        await asyncio.wait([renewer])
        service._batches.lease_ms = 30_000
        async with service.batch() as b:
            # an add that died after its first step (its grace: 1 ms)
            assert (
                await service._store.batches.add(b.id, ["bt-plain\0ghost"], grace_ms=1, adder=None)
            )[0] == "a"
            await b.enqueue_with_delay(Plain(id="pending"), 3600)

            async def lease_out() -> bool:
                counts = await service.batch_counts()
                return (counts.open, counts.waiting, counts.stuck) == (1, 0, 1)

            await wait_for(lease_out)
            counts = await service.batch_counts()
            # due sweep work: A's lease, B's add past its grace
            assert counts.relay_backlog == 2 and counts.relay_lag > 0
            assert counts.shards == len({batch_shard(a.id), batch_shard(b.id)})
            # the add is stale only once no sweep settled it for twice its grace and a
            # minute: asked with no margin, B counts as stuck too
            shards_ = await service._store.batches.shards_in_use()
            got = await service._store.batches.counts(
                shards_, idle_ms=3_600_000, stale_ms=0, most=10
            )
            assert (sum(c.open for c in got), sum(c.stuck for c in got)) == (0, 2)
        got = await service._store.batches.counts(shards_, idle_ms=3_600_000, stale_ms=0, most=10)
        assert [sum(c.waiting for c in got), sum(c.stuck for c in got)] == [0, 2]
        assert {x.id for x in await service.batches("stuck")} == {a.id, b.id}
    finally:
        await service.aclose()


async def test_keys_are_gone_after_the_retention(redis_url, prefix, wait_for):
    rec = Recorder()
    client = aioredis.Redis.from_url(redis_url)
    try:
        async with _service(redis_url, prefix, rec) as service:
            assert service._scheduler is not None
            service._scheduler.relay.sweeper.retention_ms = 200
            async with service.batch(on_complete=Done(id="k")) as batch:
                await batch.enqueue_with_delay(Plain(id="kp", fail=True), 0)
            await wait_for(lambda: ("bt-done", "k") in rec.runs)

            async def gone() -> bool:
                try:
                    await service.batch_info(batch.id)
                except LookupError:
                    return True
                return False

            service._scheduler.relay.wake(batch_shard(batch.id))
            await wait_for(gone, timeout=10)
            tk = PrefixKeys(prefix).for_shard(batch_shard(batch.id))
            left = [
                k
                for k in (*tk.batch(batch.id), tk.batch_index, tk.batch_done)
                if await client.exists(k)
            ]
            assert left == []
            assert await client.hlen(tk.deps) == 0
    finally:
        await client.aclose()


class Sliced(Event, event_name="bt-sliced", partitions=4):
    pass


class Grouped(Event, event_name="bt-grouped"):
    pass


async def test_cancelled_partitioned_grouped_and_envelope_members(redis_url, prefix, wait_for):
    """A cancelled member counts as failed; members of a partitioned type, of a type with
    delivery groups (done with its last group) and added as envelopes all count once."""
    rec = Recorder()
    seen: list[tuple[str, Any]] = []

    async def sliced(event: Sliced) -> None:
        d = current_delivery()
        assert d is not None and d.batch is not None
        seen.append((event.id, d.batch.name))

    groups_done: list[str] = []

    async def grouped(event: Grouped) -> None:
        d = current_delivery()
        assert d is not None
        groups_done.append(d.group)

    async with _service(redis_url, prefix, rec) as service:
        service.add_handler(Sliced, sliced)
        service.add_handler(Grouped, grouped)
        service.add_handler(Grouped, grouped, group="audit")
        from delayq.codec import Codec

        codec = Codec("msgpack", 1 << 20)
        envelope = codec.encode(Plain(id="env"), None)
        async with service.batch(
            on_complete=Done(id="mix"), on_success=Ok(id="mix"), name="mixed"
        ) as batch:
            assert await batch.enqueue_many([Sliced(id=f"s{i}") for i in range(8)], priority=3)
            assert await batch.enqueue_with_delay(Grouped(id="g"), 0)
            assert await batch.enqueue_envelopes("bt-plain", [("env", envelope, 0)]) == [1]
            assert await batch.enqueue_with_delay(Plain(id="c"), 3600)
            assert await service.cancel(Plain, "c")
        await wait_for(lambda: ("bt-done", "mix") in rec.runs, timeout=10)
        info = await service.batch_info(batch.id)
        assert (info.total, info.succeeded, info.failed) == (11, 10, 1)
        assert info.failed_ids == (("bt-plain", "c"),)
        assert sorted(g for g in groups_done) == ["audit", "default"]
        assert sorted(seen) == [(f"s{i}", "mixed") for i in range(8)]
        (cancelled,) = await rec.callbacks["bt-done", "mix"][0].members(status="cancelled")  # type: ignore[union-attr]
        assert cancelled.id == "c" and cancelled.failed
        assert len(await rec.callbacks["bt-done", "mix"][0].members(limit=3)) == 3  # type: ignore[union-attr]
        await wait_for(lambda: _skipped(service, Ok, "mix"), timeout=5)
        assert ("bt-ok", "mix") not in rec.runs
        import json

        assert json.loads(json.dumps(info.to_dict()))["failed_ids"] == [["bt-plain", "c"]]


async def test_a_callback_id_in_use_is_refused(redis_url, prefix):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        await service.enqueue_with_delay(Ok(id="taken"), 3600)
        with pytest.raises(ValueError, match="unused id"):
            async with service.batch(on_complete=Done(id="t"), on_success=Ok(id="taken")):
                raise AssertionError("not reached")
        # the on_complete enqueued before the refusal was removed again
        assert (await service.inspect(Done, "t")).state == "absent"
        with pytest.raises(TypeError):
            service.batch(on_complete="nope")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await service.batch_info("no such id!")


async def test_a_member_s_context_hides_the_batch(redis_url, prefix, wait_for):
    from delayq import event_context

    contexts: list[dict[str, str]] = []

    async def plain(event: Plain) -> None:
        contexts.append(dict(event_context()))

    async with EventService.from_url(redis_url, prefix=prefix, **FAST) as service:
        service.add_handler(Plain, plain)
        async with service.batch(name="ctx") as batch:
            await batch.enqueue_with_delay(Plain(id="x"), 0, context={"tenant": "t1"})
        await wait_for(lambda: contexts)
        assert contexts == [{"tenant": "t1"}]


async def test_an_event_may_wait_for_a_batch(redis_url, prefix, wait_for):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        async with service.batch() as batch:
            await batch.enqueue_with_delay(Plain(id="w1"), 0)
            await service.enqueue_with_delay(Done(id="after"), 0, after=[(BATCH_TYPE, batch.id)])
            assert (await service.inspect(Done, "after")).state == "waiting"
        await wait_for(lambda: ("bt-done", "after") in rec.runs)
        (parent,) = rec.parents["bt-done", "after"]
        assert (parent.event_type, parent.id, parent.status) == (BATCH_TYPE, batch.id, "ok")
        # a plain child of a batch is not its callback: its batch is read all the same
        (seen,) = rec.callbacks["bt-done", "after"]
        assert seen is not None and seen.info is not None and seen.info.total == 1


async def test_a_member_gone_without_a_completion_counts_as_vanished(redis_url, prefix, wait_for):
    """The audit of a closed batch's pending members: one deleted by hand (no completion
    will ever come) is handed "vanished", a failure, and the batch completes."""
    rec = Recorder()
    client = aioredis.Redis.from_url(redis_url)
    try:
        async with _service(redis_url, prefix, rec) as service:
            service._batches.audit_ms = 200
            assert service._scheduler is not None
            service._scheduler.relay.sweeper.audit_ms = 200
            async with service.batch(on_complete=Done(id="van")) as batch:
                await batch.enqueue_with_delay(Plain(id="gone"), 3600)
                await batch.enqueue_with_delay(Plain(id="here"), 0)
            keys = PrefixKeys(prefix).for_type("bt-plain")
            await client.hdel(keys.events, "gone")
            await client.zrem(keys.scheduled, "gone")
            await wait_for(lambda: ("bt-done", "van") in rec.runs, timeout=15)
            info = await service.batch_info(batch.id)
            assert (info.total, info.succeeded, info.failed) == (2, 1, 1)
            (gone,) = await rec.callbacks["bt-done", "van"][0].members(status="vanished")  # type: ignore[union-attr]
            assert gone.id == "gone"
    finally:
        await client.aclose()
