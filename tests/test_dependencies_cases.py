"""Dependencies, parent by parent and feature by feature (docs/WORKFLOWS.md, "Dependencies":
"What counts as done" and "How it plays with the rest"): a dead-lettered parent later
requeued, with and without delivery groups; a grouped parent done with its last group,
cancelled group by group, or deleted by ``remove_group``; a parent replaced or debounced
while its child waits, one enqueued with ``unique_for``, parents done before their child
(their results kept or not); a waiting child debounced or enqueued again; partitioned
types, flow keys and limits, and a schedule's fire as a parent. tests/test_dependencies.py
covers the rest, tests/test_dependencies_cluster.py the cluster, and
tests/postgres/test_outbox_dependencies.py the outbox.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from delayq import Event, EventService, Parent, current_delivery, fixed

FAST: dict[str, Any] = {
    "scheduling_interval": 0.2,
    "polling_timeout": 0.5,
    "visibility_timeout": 2.0,
    "retry_backoff": fixed(0.05),
    "retry_attempts": 0,
    "shutdown_grace": 1.0,
}


class Task(Event, event_name="dc-task"):
    """A parent without results and without delivery groups."""


class Kept(Event, event_name="dc-kept", results=timedelta(hours=1)):
    """A parent that keeps its results."""


class Fanned(Event, event_name="dc-fanned"):
    """A parent with two delivery groups (``default`` and ``b``)."""


class Child(Event, event_name="dc-child"):
    """A child."""

    text: str = ""


class Keyed(Event, event_name="dc-keyed", flow_key="tenant"):
    """A type whose class names a flow key field."""

    tenant: str = "t"


class Split(Event, event_name="dc-split", partitions=4):
    """A partitioned type."""


class World:
    """Handlers that note each run (type, id) -> the parents it saw, and fail on demand."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], list[tuple[Parent, ...]]] = {}
        self.events: list[Event] = []  # as handled
        self.failing: set[str] = set()
        self.failing_b: set[str] = set()  # fail in group "b" only
        self.gate = asyncio.Event()  # group "b" of Fanned waits for it
        self.gate.set()
        self.running = 0
        self.most = 0

    async def handle(self, event: Event) -> object:
        d = current_delivery()
        assert d is not None
        key = (d.event_type, event.id)
        if d.group == "b":
            key = (f"{d.event_type}/b", event.id)
            await self.gate.wait()
        self.runs.setdefault(key, []).append(d.parents)
        self.events.append(event)
        if event.id in self.failing or (d.group == "b" and event.id in self.failing_b):
            raise RuntimeError(f"{event.id} broke")
        return {"from": event.id} if isinstance(event, Kept) else None

    async def slow(self, event: Event) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.1)
            await self.handle(event)
        finally:
            self.running -= 1

    def saw(self, t: type[Event], i: str, group: str = "") -> list[tuple[str, ...]]:
        """Each run's parents, as (status, ...) tuples."""
        name = t.event_name + (f"/{group}" if group else "")
        return [tuple(p.status for p in ps) for ps in self.runs.get((name, i), [])]

    def ran(self, t: type[Event], i: str, group: str = "") -> bool:
        return bool(self.saw(t, i, group))


def _service(url: str, prefix: str, world: World, **options: Any) -> EventService:
    service = EventService.from_url(url, prefix=prefix, **{**FAST, **options})
    for t in (Task, Kept, Split, Keyed):
        service.add_handler(t, world.handle)
    service.add_handler(Fanned, world.handle)
    service.add_handler(Fanned, world.handle, group="b")
    service.add_handler(Child, world.slow, concurrency=4)
    return service


async def _state(service: EventService, t: type[Event], i: str) -> str:
    return (await service.inspect(t, i)).state


def _fast_audits(service: EventService) -> None:
    """A waiting child's audits every 0.3 s (tests only)."""
    service._dependencies.audit_ms = 300
    assert service._scheduler is not None
    service._scheduler.relay.audit_ms = 300


# -- a dead-lettered parent, later requeued ------------------------------------------------


async def test_a_dead_parent_requeued_without_groups(redis_url, prefix, wait_for):
    # its children see "failed" at once and stay so; a child enqueued after the requeue
    # waits for the requeued run, and sees its outcome
    world = World()
    world.failing.add("p")
    async with _service(redis_url, prefix, world) as service:
        await service.enqueue_with_delay(Task(id="p"), 0.3)
        await service.enqueue_with_delay(Child(id="before"), 0, after=[(Task, "p")])
        await service.enqueue_with_delay(
            Child(id="before-run"), 0, after=[(Task, "p")], on_parent_failure="run"
        )
        await wait_for(lambda: world.ran(Child, "before-run"), timeout=10)
        assert world.saw(Child, "before-run") == [("failed",)]
        assert await _state(service, Child, "before") == "dead"
        # enqueued while the parent is a dead letter: "failed" at once
        await service.enqueue_with_delay(
            Child(id="while-dead"), 0, after=[(Task, "p")], on_parent_failure="run"
        )
        await wait_for(lambda: world.ran(Child, "while-dead"), timeout=10)
        assert world.saw(Child, "while-dead") == [("failed",)]
        # requeued (in an hour): pending again, so a new child waits for that run
        world.failing.clear()
        assert await service.requeue_dead_letters(Task, ["p"], delay=3600) == 1
        await service.enqueue_with_delay(
            Child(id="after-requeue"), 0, after=[(Task, "p")], on_parent_failure="run"
        )
        info = await service.inspect(Child, "after-requeue")
        assert info.state == "waiting" and [p.status for p in info.parents] == ["pending"]
        assert await service.run_now(Task, "p")
        await wait_for(lambda: world.ran(Child, "after-requeue"), timeout=10)
        assert world.saw(Child, "after-requeue") == [("ok",)]
        # the requeued run changed nothing for the children that saw it fail
        assert world.saw(Child, "before-run") == [("failed",)]
        assert world.saw(Child, "while-dead") == [("failed",)]
        assert not world.ran(Child, "before")
        assert await _state(service, Child, "before") == "dead"
        assert world.saw(Task, "p") == [(), ()]


async def test_a_dead_parent_requeued_with_groups(redis_url, prefix, wait_for):
    # with delivery groups a dead letter is not final: the child waits until the requeued
    # run is handled in every group, then sees "ok"
    world = World()
    world.failing.add("p")
    async with _service(redis_url, prefix, world) as service:
        await service.enqueue_with_delay(Fanned(id="p"), 0.3)
        await service.enqueue_with_delay(Child(id="c"), 0, after=[(Fanned, "p")])

        async def dead_in_both() -> bool:
            return all([await service.dead_letters(Fanned, group=g) for g in ("default", "b")])

        await wait_for(dead_in_both, timeout=10)
        assert await _state(service, Child, "c") == "waiting"
        world.failing.clear()
        assert await service.requeue_dead_letters(Fanned, ["p"], group="default") == 1
        await wait_for(lambda: len(world.saw(Fanned, "p")) == 2, timeout=10)
        # handled in one group, still a dead letter in the other: still waiting
        assert await _state(service, Child, "c") == "waiting"
        assert await service.requeue_dead_letters(Fanned, ["p"], group="b") == 1
        await wait_for(lambda: world.ran(Child, "c"), timeout=10)
        assert world.saw(Child, "c") == [("ok",)]
        assert len(world.saw(Fanned, "p", "b")) == 2


async def test_a_grouped_parent_is_done_with_its_last_group(redis_url, prefix, wait_for):
    # its children wait until every group acked it; a grouped child then goes to every group
    world = World()
    world.gate.clear()
    async with _service(redis_url, prefix, world) as service:
        await service.enqueue_with_delay(Fanned(id="p"), 0)
        await service.enqueue_with_delay(Fanned(id="c"), 0, after=[(Fanned, "p")])

        async def acked_by_default_only() -> bool:
            counts = await service.group_stats(Fanned)
            ran = world.ran(Fanned, "p")
            return ran and counts["default"].in_flight == 0 and counts["b"].in_flight == 1

        await wait_for(acked_by_default_only, timeout=10)
        assert not world.ran(Fanned, "p", "b")
        assert await _state(service, Fanned, "c") == "waiting"
        world.gate.set()
        await wait_for(lambda: world.ran(Fanned, "c") and world.ran(Fanned, "c", "b"), timeout=10)
        assert world.saw(Fanned, "c") == world.saw(Fanned, "c", "b") == [("ok",)]


async def test_a_grouped_parent_cancelled_group_by_group(redis_url, prefix, wait_for):
    # a cancel for one group changes nothing for the children; the last group's does.
    # A grouped child whose parent failed goes to the default group's dead letters.
    world = World()
    async with _service(redis_url, prefix, world) as service:
        await service.enqueue_with_delay(Fanned(id="p"), 3600)
        await service.enqueue_with_delay(
            Child(id="c"), 0, after=[(Fanned, "p")], on_parent_failure="run"
        )
        await service.enqueue_with_delay(Fanned(id="g"), 0, after=[(Fanned, "p")])
        assert await service.cancel(Fanned, "p", group="default")
        assert await _state(service, Child, "c") == "waiting"
        assert await service.cancel(Fanned, "p", group="b")
        await wait_for(lambda: world.ran(Child, "c"), timeout=10)
        assert world.saw(Child, "c") == [("cancelled",)]

        async def in_default_dead_letters() -> bool:
            return [d.id for d in await service.dead_letters(Fanned, group="default")] == ["g"]

        await wait_for(in_default_dead_letters, timeout=10)
        assert not await service.dead_letters(Fanned, group="b")
        assert not world.ran(Fanned, "g") and not world.ran(Fanned, "g", "b")


async def test_removing_the_group_that_holds_a_parent(redis_url, prefix, wait_for):
    # handled by the default group, a dead letter in "b": remove_group("b") deletes it
    # without a completion, and the child's audit finds it "vanished"
    world = World()
    world.failing_b.add("p")
    async with _service(redis_url, prefix, world) as service:
        _fast_audits(service)
        await service.enqueue_with_delay(Fanned(id="p"), 0.3)
        await service.enqueue_with_delay(
            Child(id="c"), 0, after=[(Fanned, "p")], on_parent_failure="run"
        )
        await wait_for(lambda: service.dead_letters(Fanned, group="b"), timeout=10)
        assert world.ran(Fanned, "p")
        assert await _state(service, Child, "c") == "waiting"
        assert await service.remove_group(Fanned, "b")
        await wait_for(lambda: world.ran(Child, "c"), timeout=10)
        assert world.saw(Child, "c") == [("vanished",)]


async def test_a_waiting_child_debounced_or_enqueued_again(redis_url, prefix, wait_for):
    # enqueued again: kept as it is (False); debounced: its payload replaced, still waiting
    # for the same parent
    world = World()
    async with _service(redis_url, prefix, world) as service:
        await service.enqueue_with_delay(Task(id="p"), 3600)
        assert await service.enqueue_with_delay(Child(id="c", text="1"), 0, after=[(Task, "p")])
        assert not await service.enqueue_with_delay(
            Child(id="c", text="2"), 0, after=[(Task, "other")]
        )
        assert await service.enqueue_with_delay(Child(id="c", text="3"), 0, debounce=60)
        info = await service.inspect(Child, "c")
        assert info.state == "waiting" and [p.id for p in info.parents] == ["p"]
        assert await service.run_now(Task, "p")
        await wait_for(lambda: world.ran(Child, "c"), timeout=10)
        assert world.saw(Child, "c") == [("ok",)]
        assert [e for e in world.events if isinstance(e, Child)] == [Child(id="c", text="3")]


# -- parents replaced, debounced, unique_for, done before -----------------------------------


async def test_a_parent_replaced_or_debounced_while_its_child_waits(redis_url, prefix, wait_for):
    world = World()
    async with _service(redis_url, prefix, world) as service:
        await service.enqueue_with_delay(Task(id="r"), 3600)
        await service.enqueue_with_delay(Task(id="d"), 3600, debounce=7200)
        await service.enqueue_with_delay(Child(id="cr"), 0, after=[(Task, "r")])
        await service.enqueue_with_delay(Child(id="cd"), 0, after=[(Task, "d")])
        # a new version of each parent: the children wait for its run
        assert await service.enqueue_with_delay(Task(id="r"), 0.2, replace=True)
        assert await service.enqueue_with_delay(Task(id="d"), 0.2, debounce=7200)
        assert await _state(service, Child, "cr") == "waiting"
        assert await _state(service, Child, "cd") == "waiting"
        await wait_for(lambda: world.ran(Child, "cr") and world.ran(Child, "cd"), timeout=10)
        assert world.saw(Child, "cr") == world.saw(Child, "cd") == [("ok",)]
        assert world.saw(Task, "r") == world.saw(Task, "d") == [()]


async def test_a_unique_for_parent(redis_url, prefix, wait_for):
    # a parent enqueued with unique_for is a parent like any; a refused enqueue of its id
    # (done, within its ttl) changes nothing for a child: the parent is done, "missing"
    world = World()
    async with _service(redis_url, prefix, world) as service:
        assert await service.enqueue_with_delay(Task(id="u"), 0.3, unique_for=3600)
        await service.enqueue_with_delay(Child(id="c1"), 0, after=[(Task, "u")])
        assert not await service.enqueue_with_delay(Task(id="u"), 0, unique_for=3600)
        await wait_for(lambda: world.ran(Child, "c1"), timeout=10)
        assert world.saw(Child, "c1") == [("ok",)]
        assert not await service.enqueue_with_delay(Task(id="u"), 0, unique_for=3600)
        await service.enqueue_with_delay(Child(id="c2"), 0, after=[(Task, "u")])
        await wait_for(lambda: world.ran(Child, "c2"), timeout=10)
        assert world.saw(Child, "c2") == [("missing",)]
        assert world.saw(Task, "u") == [()]


async def test_parents_done_before_their_child(redis_url, prefix, wait_for):
    # done with a result kept: "ok" with it (or "failed"); done without: "missing"
    world = World()
    world.failing.add("bad")
    async with _service(redis_url, prefix, world) as service:
        await service.enqueue_with_delay(Kept(id="good"), 0)
        await service.enqueue_with_delay(Kept(id="bad"), 0)
        await service.enqueue_with_delay(Task(id="plain"), 0)

        async def all_done() -> bool:
            states = [await _state(service, t, i) for t, i in [(Kept, "good"), (Task, "plain")]]
            return states == ["absent", "absent"] and await _state(service, Kept, "bad") == "dead"

        await wait_for(all_done, timeout=10)
        after = [(Kept, "good"), (Kept, "bad"), (Task, "plain")]
        await service.enqueue_with_delay(Child(id="c"), 0, after=after, on_parent_failure="run")
        await wait_for(lambda: world.ran(Child, "c"), timeout=10)
        (parents,) = world.runs["dc-child", "c"]
        assert [p.status for p in parents] == ["ok", "failed", "missing"]
        assert parents[0].value == {"from": "good"}
        assert "bad broke" in (parents[1].error or "")


# -- partitions, flow keys and limits, schedules --------------------------------------------


async def test_partitioned_parents_and_children(redis_url, prefix, wait_for):
    # ids spread over the partitions of both types: each child waits for its own parent
    world = World()
    async with _service(redis_url, prefix, world) as service:
        ids = [f"s{i}" for i in range(8)]
        for i in ids:
            await service.enqueue_with_delay(Split(id=i), 0.3)
        for i in ids:
            await service.enqueue_with_delay(Split(id=f"{i}-next"), 0, after=[(Split, i)])
        assert (await service.stats_for(Split)).waiting == 8
        await wait_for(lambda: all(world.ran(Split, f"{i}-next") for i in ids), timeout=15)
        assert all(world.saw(Split, f"{i}-next") == [("ok",)] for i in ids)
        order = [k[1] for k in world.runs]
        assert all(order.index(i) < order.index(f"{i}-next") for i in ids)


async def test_flow_keys_and_limits(redis_url, prefix, wait_for):
    world = World()
    async with _service(redis_url, prefix, world) as service:
        # a child has no flow key yet: key= or a class flow_key field with after= raise
        with pytest.raises(ValueError, match="flow key"):
            await service.enqueue_with_delay(Child(id="x"), 0, after=[(Task, "p")], key="k")
        with pytest.raises(ValueError, match="flow key"):
            await service.enqueue_with_delay(Keyed(id="x"), 0, after=[(Task, "p")])
        for option in ({"debounce": 5}, {"unique_for": 5}, {"priority": 1}):
            with pytest.raises(ValueError, match="does not go with"):
                await service.enqueue_with_delay(Child(id="x"), 0, after=[(Task, "p")], **option)
        assert await _state(service, Child, "x") == "absent"
        # a parent with a flow key is a parent like any; released children obey limits
        await service.set_limits(Child, concurrency=1)
        await service.enqueue_with_delay(Task(id="p"), 0.3, key="tenant-a")
        await service.enqueue_many([Child(id=f"c{i}") for i in range(4)], 0, after=[(Task, "p")])
        await wait_for(lambda: all(world.ran(Child, f"c{i}") for i in range(4)), timeout=15)
        assert world.most == 1


async def test_a_schedules_fire_as_a_parent(redis_url, prefix, wait_for):
    world = World()
    async with _service(redis_url, prefix, world) as service:
        await service.pause(Kept)  # the fire stays pending while its child is enqueued
        await service.schedule("nightly", Kept, every=timedelta(days=1))
        fire = await service.trigger_schedule("nightly")
        assert fire is not None
        await service.enqueue_with_delay(Child(id="c"), 0, after=[(Kept, fire)])
        assert await _state(service, Child, "c") == "waiting"
        await service.resume(Kept)
        await wait_for(lambda: world.ran(Child, "c"), timeout=10)
        (parents,) = world.runs["dc-child", "c"]
        assert parents[0].status == "ok" and parents[0].value == {"from": fire}
