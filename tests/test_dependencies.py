"""Dependencies (``after=[...]``): a child waits for its parents, then runs, fails or is
skipped by its policy; parent and child on different slots hand completions over through
the relay (docs/WORKFLOWS.md, "Dependencies")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from delayq import Event, EventService, Parent, current_delivery, event_context, fixed
from delayq.keyspace.layout import PrefixKeys
from delayq.keyspace.shards import shard_for

FAST: dict[str, Any] = {
    "scheduling_interval": 0.2,
    "polling_timeout": 0.5,
    "visibility_timeout": 2.0,
    "retry_backoff": fixed(0.05),
    "retry_attempts": 0,
    "shutdown_grace": 1.0,
}


class Charge(Event, event_name="dep-charge", results=timedelta(hours=1)):
    fail: bool = False


class Ship(Event, event_name="dep-ship"):
    fail: bool = False


class Receipt(Event, event_name="dep-receipt"):
    pass


class Step(Event, event_name="dep-step"):
    pass


class Recorder:
    """Handlers that note what each delivery saw."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], list[tuple[Parent, ...]]] = {}

    def note(self, event: Event) -> None:
        d = current_delivery()
        assert d is not None
        self.runs.setdefault((d.event_type, event.id), []).append(d.parents)

    async def charge(self, event: Charge) -> object:
        self.note(event)
        if event.fail:
            raise RuntimeError("card declined")
        return {"amount": 42}

    async def ship(self, event: Ship) -> None:
        self.note(event)
        if event.fail:
            raise RuntimeError("no stock")

    async def plain(self, event: Event) -> None:
        self.note(event)

    def ran(self, t: type[Event], i: str) -> bool:
        return (t.event_name, i) in self.runs


async def _is(service: EventService, t: type[Event], i: str, state: str) -> bool:
    return (await service.inspect(t, i)).state == state


def _service(url: str, prefix: str, rec: Recorder) -> EventService:
    service = EventService.from_url(url, prefix=prefix, **FAST)
    service.add_handler(Charge, rec.charge)
    service.add_handler(Ship, rec.ship)
    service.add_handler(Receipt, rec.plain)
    service.add_handler(Step, rec.plain)
    return service


async def test_a_child_waits_for_its_parents_then_sees_their_outcomes(redis_url, prefix, wait_for):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        await service.enqueue_with_delay(Charge(id="o1"), 0.3)
        await service.enqueue_with_delay(Ship(id="o1"), 0.3)
        assert await service.enqueue_with_delay(
            Receipt(id="o1"), 0, after=[(Charge, "o1"), (Ship, "o1")]
        )
        info = await service.inspect(Receipt, "o1")
        assert info is not None and info.state == "waiting"
        stats = await service.stats()
        assert stats["dep-receipt"].waiting == 1
        await wait_for(lambda: rec.ran(Receipt, "o1"), timeout=10)
        (parents,) = rec.runs["dep-receipt", "o1"]
        assert [(p.event_type, p.id, p.status) for p in parents] == [
            ("dep-charge", "o1", "ok"),
            ("dep-ship", "o1", "ok"),
        ]
        assert parents[0].value == {"amount": 42}
        assert parents[1].value is None
        await wait_for(lambda: _is(service, Receipt, "o1", "absent"), timeout=5)


@pytest.mark.parametrize("policy", ["fail", "run", "skip"])
async def test_a_failed_parent_applies_the_policy(redis_url, prefix, wait_for, policy):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        await service.enqueue_with_delay(Charge(id="c", fail=True), 0.2)
        await service.enqueue_with_delay(
            Receipt(id="r"), 0, after=[(Charge, "c")], on_parent_failure=policy
        )
        await service.enqueue_with_delay(Step(id="s"), 0, after=[(Receipt, "r")])
        if policy == "run":
            await wait_for(lambda: rec.ran(Step, "s"), timeout=10)
            (parents,) = rec.runs["dep-receipt", "r"]
            assert parents[0].status == "failed" and "card declined" in (parents[0].error or "")
            return
        # fail: a dead letter with ParentFailed, and its own child then fails too
        await wait_for(lambda: _is(service, Step, "s", "dead"), timeout=10)
        step = await service.inspect(Step, "s")
        assert "ParentFailed: dep-receipt r" in (step.last_error or "")
        receipt = await service.inspect(Receipt, "r")
        assert not rec.ran(Receipt, "r")
        if policy == "fail":
            assert receipt.state == "dead"
            assert (receipt.last_error or "").startswith("ParentFailed: dep-charge c failed")
        else:
            assert receipt.state == "absent"
            assert (await service.stats())["dep-receipt"].waiting == 0
            assert "was skipped" in (step.last_error or "")


async def _cancel_a_parent(
    service: EventService, rec: Recorder, wait_for: Any, parent: Event, child_id: str
) -> None:
    """A parent cancelled while a Receipt waits for it: the child runs (policy "run") and
    sees it "cancelled"."""
    await service.enqueue_with_delay(parent, 3600)
    await service.enqueue_with_delay(
        Receipt(id=child_id), 0, after=[(type(parent), parent.id)], on_parent_failure="run"
    )
    assert await service.cancel(type(parent), parent.id)
    await wait_for(lambda: rec.ran(Receipt, child_id), timeout=10)
    assert rec.runs["dep-receipt", child_id][0][0].status == "cancelled"


async def test_a_parent_done_missing_or_cancelled(redis_url, prefix, wait_for):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        await service.enqueue_with_delay(Charge(id="done"), 0)
        await wait_for(lambda: rec.ran(Charge, "done"), timeout=10)
        await wait_for(lambda: _is(service, Charge, "done", "absent"), timeout=5)
        # done with a kept result: applied at once; never enqueued: "missing", not a failure
        await service.enqueue_with_delay(Receipt(id="a"), 0, after=[(Charge, "done")])
        await service.enqueue_with_delay(Receipt(id="b"), 0, after=[(Ship, "nobody")])
        await wait_for(lambda: rec.ran(Receipt, "a") and rec.ran(Receipt, "b"), timeout=10)
        assert rec.runs["dep-receipt", "a"][0][0].value == {"amount": 42}
        assert rec.runs["dep-receipt", "b"][0][0].status == "missing"
        # cancelled while the child waits: the policy sees it failed
        await _cancel_a_parent(service, rec, wait_for, Ship(id="later"), "c")


async def test_a_chain_runs_in_order(redis_url, prefix, wait_for):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        await service.enqueue_with_delay(Step(id="s0"), 0.1)
        for i in range(1, 6):  # all due now: the order comes from after=
            await service.enqueue_with_delay(Step(id=f"s{i}"), 0, after=[(Step, f"s{i - 1}")])
        await wait_for(lambda: rec.ran(Step, "s5"), timeout=15)
        order = [k[1] for k in rec.runs]
        assert order == ["s0", "s1", "s2", "s3", "s4", "s5"]
        assert all(p[0].status == "ok" for k, (p,) in rec.runs.items() if k[1] != "s0")
        # a parent enqueued after its child was not there when the child linked: "missing"
        await service.enqueue_with_delay(Step(id="late-child"), 0, after=[(Step, "late-parent")])
        await service.enqueue_with_delay(Step(id="late-parent"), 0)
        await wait_for(lambda: rec.ran(Step, "late-child"), timeout=10)
        assert rec.runs["dep-step", "late-child"][0][0].status == "missing"


async def test_cancel_a_waiting_child(redis_url, prefix, redis_client: aioredis.Redis):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        await service.enqueue_with_delay(Ship(id="p"), 60)
        await service.enqueue_with_delay(Receipt(id="w"), 0, after=[(Ship, "p")])
        assert await service.cancel(Receipt, "w")
        assert (await service.inspect(Receipt, "w")).state == "absent"
        assert (await service.stats())["dep-receipt"].waiting == 0
        assert not await redis_client.exists(f"{{{prefix}:dep-receipt}}:deps")


async def test_options_that_do_not_go_with_after(redis_url, prefix):
    rec = Recorder()
    service = _service(redis_url, prefix, rec)
    with pytest.raises(ValueError):
        await service.enqueue_with_delay(Receipt(id="x"), 0, after=[(Ship, "p")], replace=True)
    with pytest.raises(ValueError):
        await service.enqueue_with_delay(Receipt(id="x"), 0, after=[])
    with pytest.raises(ValueError):
        await service.enqueue_with_delay(
            Receipt(id="x"), 0, after=[(Ship, "p")], on_parent_failure="maybe"
        )
    with pytest.raises(TypeError):
        await service.enqueue_with_delay(Receipt(id="x"), 0, after=[Ship])
    await service.aclose()


# -- every route to a dead letter, delivery groups, replace, and no cost when unused ------


class Note(Event, event_name="dep-note"):
    text: str = ""


class Audit(Event, event_name="dep-audit"):
    fail: bool = False


async def test_a_plain_type_is_not_marked(redis_url, prefix, wait_for, redis_client):
    # a type without dependencies gets no dedup set nor mark: its acks send main's keys
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        await service.enqueue_with_delay(Step(id="plain"), 0)
        await wait_for(lambda: _is(service, Step, "plain", "absent"), timeout=10)
        assert not await redis_client.exists(f"{{{prefix}:dep-step}}:dedup")
        assert not await redis_client.hexists(f"{{{prefix}:dep-step}}:meta", "deps")
        assert not await redis_client.exists(f"{{{prefix}:dep-step}}:deps")


async def test_a_lease_expiring_on_a_parents_last_delivery_tells_its_children(
    redis_url, prefix, wait_for, redis_client
):
    # the worker holding the parent died on its last delivery: the scheduler's move makes
    # it a dead letter, and its children learn it then (not at their next audit)
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        await service.enqueue_with_delay(Ship(id="lost"), 3600)
        await service.enqueue_with_delay(
            Receipt(id="after-lost"), 0, after=[(Ship, "lost")], on_parent_failure="run"
        )
        k = f"{{{prefix}:dep-ship}}"
        async with redis_client.pipeline(transaction=True) as pipe:
            pipe.zrem(f"{k}:scheduled", "lost")
            pipe.zadd(f"{k}:inflight", {"lost": 1})
            pipe.hset(f"{k}:leases", "lost", "1")
            pipe.hset(f"{k}:attempts", "lost", 1)
            await pipe.execute()
        await wait_for(lambda: rec.ran(Receipt, "after-lost"), timeout=4)
        (parents,) = rec.runs["dep-receipt", "after-lost"]
        assert parents[0].status == "failed"
        assert (parents[0].error or "").startswith("LeaseExpired")
        assert (await service.inspect(Ship, "lost")).state == "dead"


def _grouped(url: str, prefix: str, rec: Recorder) -> EventService:
    service = EventService.from_url(url, prefix=prefix, **FAST)
    service.add_handler(Audit, rec.audit)
    service.add_handler(Audit, rec.audit, group="b")
    service.add_handler(Note, rec.plain)
    service.add_handler(Note, rec.plain, group="b")
    service.add_handler(Receipt, rec.plain)
    return service


async def _audit(rec: Recorder, event: Audit) -> None:
    rec.note(event)
    if event.fail:
        raise RuntimeError("audit failed")


Recorder.audit = _audit  # type: ignore[attr-defined]


async def test_delivery_groups_cancel_and_purge(redis_url, prefix, wait_for, redis_client):
    rec = Recorder()
    async with _grouped(redis_url, prefix, rec) as service:
        # a cancelled grouped parent: its children are handed "cancelled"
        await _cancel_a_parent(service, rec, wait_for, Audit(id="p1"), "c1")
        # a waiting child of a grouped type: "waiting", and a cancel removes it whole
        await service.enqueue_with_delay(Audit(id="p2"), 3600)
        await service.enqueue_with_delay(Note(id="n2"), 0, after=[(Audit, "p2")])
        info = await service.inspect(Note, "n2")
        assert info.state == "waiting" and [p.status for p in info.parents] == ["pending"]
        assert not await service.cancel(Note, "n2", group="b")  # in no group yet
        assert await service.cancel(Note, "n2")
        assert (await service.inspect(Note, "n2")).state == "absent"
        assert not await redis_client.zscore(f"{{{prefix}:dep-note}}:waiting", "n2")
        assert not [
            f
            for f in await redis_client.hkeys(f"{{{prefix}:dep-note}}:deps")
            if f.split(b":", 1)[1].startswith(b"n2")
        ]
        # a grouped parent dead in both groups: its children wait (a requeue may still
        # save it) until the last dead letter is purged: then a failure, not "missing"
        await service.enqueue_with_delay(Audit(id="p3", fail=True), 0.2)
        await service.enqueue_with_delay(
            Receipt(id="c3"), 0, after=[(Audit, "p3")], on_parent_failure="run"
        )

        async def dead_in_both() -> bool:
            return all([await service.dead_letters(Audit, group=g) for g in ("default", "b")])

        await wait_for(dead_in_both, timeout=10)
        assert (await service.inspect(Receipt, "c3")).state == "waiting"
        assert await service.purge_dead_letters(Audit, ["p3"], group="default") == 1
        assert (await service.inspect(Receipt, "c3")).state == "waiting"
        assert await service.purge_dead_letters(Audit, ["p3"], group="b") == 1
        await wait_for(lambda: rec.ran(Receipt, "c3"), timeout=5)
        (parents,) = rec.runs["dep-receipt", "c3"]
        assert parents[0].status == "failed" and "audit failed" in (parents[0].error or "")


async def test_a_purged_parentfailed_child_leaves_no_records(
    redis_url, prefix, wait_for, redis_client
):
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        await service.enqueue_with_delay(Ship(id="bad", fail=True), 0)
        await service.enqueue_with_delay(Receipt(id="victim"), 0, after=[(Ship, "bad")])
        await wait_for(lambda: _is(service, Receipt, "victim", "dead"), timeout=10)
        assert await service.purge_dead_letters(Receipt, ["victim"]) == 1
        assert await service.purge_dead_letters(Ship, ["bad"]) == 1

        async def no_records() -> bool:
            return not await redis_client.hkeys(
                f"{{{prefix}:dep-receipt}}:deps"
            ) and not await redis_client.hkeys(f"{{{prefix}:dep-ship}}:deps")

        await wait_for(no_records, timeout=5)


@pytest.mark.parametrize(
    ("serializer", "context"), [("msgpack", None), ("json", None), ("msgpack", {"who": "ops"})]
)
async def test_a_replace_keeps_a_waiting_child_waiting(
    redis_url, prefix, wait_for, serializer, context
):
    rec = Recorder()
    seen: list[tuple[str, tuple[tuple[str, str, str], ...], dict[str, str]]] = []

    async def note(event: Note) -> None:
        d = current_delivery()
        assert d is not None
        parents = tuple((p.event_type, p.id, p.status) for p in d.parents)
        seen.append((event.text, parents, dict(event_context())))

    service = EventService.from_url(redis_url, prefix=prefix, serializer=serializer, **FAST)
    service.add_handler(Ship, rec.ship)
    service.add_handler(Note, note)
    async with service:
        await service.enqueue_with_delay(Ship(id="slow"), 0.5)
        await service.enqueue_with_delay(Note(id="n", text="first"), 0, after=[(Ship, "slow")])
        # a plain replace changes the payload only: the child still waits for its parent,
        # and its handler sees that parent whatever the replacing envelope carries
        assert await service.enqueue_with_delay(
            Note(id="n", text="second"), 0, replace=True, context=context
        )
        info = await service.inspect(Note, "n")
        assert info.state == "waiting" and [p.id for p in info.parents] == ["slow"]
        assert info.event == Note(id="n", text="second")
        await wait_for(lambda: seen, timeout=10)
        assert seen == [("second", (("dep-ship", "slow", "ok"),), context or {})]
        assert rec.ran(Ship, "slow")


async def test_a_parent_that_vanishes_releases_its_child_by_policy(
    redis_url, prefix, wait_for, redis_client
):
    # a parent gone without a completion (its last delivery group removed, its type
    # repartitioned, deleted by hand): the child's audit finds it "vanished", a failure
    rec = Recorder()
    async with _service(redis_url, prefix, rec) as service:
        _fast_audits(service)
        await service.enqueue_with_delay(Ship(id="gone"), 3600)
        await service.enqueue_with_delay(
            Receipt(id="run"), 0, after=[(Ship, "gone")], on_parent_failure="run"
        )
        await service.enqueue_with_delay(Receipt(id="fail"), 0, after=[(Ship, "gone")])
        k = f"{{{prefix}:dep-ship}}"
        await redis_client.zrem(f"{k}:scheduled", "gone")
        await redis_client.hdel(f"{k}:events", "gone")
        await wait_for(lambda: rec.ran(Receipt, "run"), timeout=10)
        assert rec.runs["dep-receipt", "run"][0][0].status == "vanished"
        await wait_for(lambda: _is(service, Receipt, "fail", "dead"), timeout=10)
        info = await service.inspect(Receipt, "fail")
        assert "ParentFailed: dep-ship gone vanished" in (info.last_error or "")
        # the parent's link records went with the answer
        assert not [
            f for f in await redis_client.hkeys(f"{k}:deps") if f.startswith((b"k:", b"l:"))
        ]


def _resized(name: str, partitions: int) -> type[Event]:
    # the same class redefined with another partition count: what a deploy does
    class Resized(Event, event_name=name, partitions=partitions):
        pass

    return Resized


def _redeployed(url: str, prefix: str, rec: Recorder, new: type[Event]) -> EventService:
    """The service after a deploy that changed ``new``'s partition count."""
    service = _service(url, prefix, rec)
    service.add_handler(new, rec.plain)
    return service


async def _before_the_deploy(
    url: str, prefix: str, rec: Recorder, parent: Event, child: Event
) -> None:
    """With the old code: ``parent`` due in an hour, ``child`` waiting for it."""
    async with _service(url, prefix, rec) as service:
        await service.enqueue_with_delay(parent, 3600)
        assert await service.enqueue_with_delay(child, 0, after=[(type(parent), parent.id)])


def _fast_audits(service: EventService) -> None:
    """A waiting child's audits every 0.3 s (tests only)."""
    service._dependencies.audit_ms = 300
    assert service._scheduler is not None
    service._scheduler.relay.audit_ms = 300


async def test_a_layout_is_not_retired_under_a_waiting_child(redis_url, prefix, wait_for):
    rec = Recorder()
    await _before_the_deploy(
        redis_url, prefix, rec, Ship(id="slow"), _resized("dep-resized", 2)(id="c")
    )
    new = _resized("dep-resized", 4)
    async with _redeployed(redis_url, prefix, rec, new) as service:
        result = await service.repartition(new, wait=0.3)
        assert result.retired == () and result.remaining == {2: 1}
        # released in its old layout, still served: it runs, then the layout retires
        assert await service.run_now(Ship, "slow")
        await wait_for(lambda: rec.ran(new, "c"), timeout=10)
        result = await service.repartition(new, wait=5)
        assert result.retired == (2,)


async def test_a_parent_type_repartitioned_while_a_child_waits(
    redis_url, prefix, wait_for, redis_client
):
    # the child linked its parent in the old layout; once the parent moves, the child's
    # audit links it in the new one, and the parent's completion there reaches it
    rec = Recorder()
    old = _resized("dep-resized-parent", 2)
    await _before_the_deploy(redis_url, prefix, rec, old(id="p"), Receipt(id="c"))
    new = _resized("dep-resized-parent", 4)
    async with _redeployed(redis_url, prefix, rec, new) as service:
        _fast_audits(service)
        result = await service.repartition(new, wait=5)
        assert result.retired == (2,) and result.moved == 1
        home = PrefixKeys(prefix).for_shard(shard_for("dep-resized-parent", "p", 4)).deps

        async def linked_in_the_new_layout() -> bool:
            return any(f.startswith(b"l:p\0") for f in await redis_client.hkeys(home))

        await wait_for(linked_in_the_new_layout, timeout=10)
        assert (await service.inspect(Receipt, "c")).state == "waiting"
        assert await service.run_now(new, "p")
        await wait_for(lambda: rec.ran(Receipt, "c"), timeout=10)
        assert rec.runs["dep-receipt", "c"][0][0].status == "ok"
