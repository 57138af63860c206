"""Delivery groups (issue 13): every registered group gets each due event once, with its own
retries, dead letters and stats; cancel, replace and remove_group act across groups; nothing
is left in Redis once every group is done. Against a real Redis."""

from __future__ import annotations

import asyncio

import pytest
from core_support import Recorder, ServicePool, prefix_keys

from delayq import CancelResult, EventService, InMemoryMetrics, fixed
from delayq.events import Event
from delayq.keys import TypeKeys


class Order(Event, event_name="grp-order"):
    """The event type of these tests."""

    n: int = 0


class Plain(Event, event_name="grp-plain"):
    """A type whose handlers never name a group."""


@pytest.fixture
async def services(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix, retry_backoff=fixed(0.05))
    yield pool
    await pool.aclose()


def keys(prefix: str) -> TypeKeys:
    return TypeKeys(prefix, Order.event_name)


async def leftovers(redis_client, prefix: str) -> list[str]:
    """Keys of the prefix other than counters, registries and the format mark (which outlive
    events), and the running services' heartbeats and history."""
    names = [k.decode() for k in await prefix_keys(redis_client, prefix)]
    keep = (":types", ":meta", ":groups", ":scheduler-lock", ":workers", ":format")
    return [
        k for k in names if not k.endswith(keep) and ":worker:" not in k and ":history:" not in k
    ]


async def settled(service: EventService) -> bool:
    stats = await service.group_stats(Order)
    return all(c.scheduled == c.ready == c.in_flight == 0 for c in stats.values())


async def test_two_groups_each_get_every_event_once_and_nothing_is_left(
    services, redis_client, prefix, wait_for
) -> None:
    metrics = InMemoryMetrics()
    service = await services.start(metrics=metrics)
    assert await service.groups(Order) == ["default"]
    assert await service.register_group(Order, "audit")
    assert not await service.register_group(Order, "audit")  # already there
    assert await service.groups(Order) == ["audit", "default"]
    billing, audit = Recorder(), Recorder()
    service.add_handler(Order, billing, concurrency=4)
    service.add_handler(Order, audit, concurrency=4, group="audit")
    n = 60
    assert all(
        await service.enqueue_many([(Order(id=f"o{i}", n=i), (i % 6) / 10) for i in range(n)])
    )
    await wait_for(lambda: billing.finished >= n and audit.finished >= n, timeout=15)
    await wait_for(lambda: settled(service), timeout=10)
    assert sorted(billing.counts.values()) == [1] * n
    assert sorted(audit.counts.values()) == [1] * n
    assert {d.group for d in billing.deliveries} == {"default"}
    assert {d.group for d in audit.deliveries} == {"audit"}
    assert all(d.attempt == 1 for d in audit.deliveries)
    # the envelope went with the last group's ack: no key left behind
    assert await redis_client.hlen(keys(prefix).events) == 0
    assert await leftovers(redis_client, prefix) == []
    # metrics: the default group's calls as before, the named group's labelled
    assert metrics.counters["succeeded", Order.event_name] == 2 * n
    assert metrics.group_counters["succeeded", Order.event_name, "audit"] == n
    assert metrics.counters["moved", Order.event_name] == 2 * n


async def test_two_named_groups_and_no_default(services, redis_client, prefix, wait_for) -> None:
    service = await services.start()
    await service.register_group(Order, "billing")
    await service.register_group(Order, "audit")
    assert await service.remove_group(Order, "default")
    assert await service.groups(Order) == ["audit", "billing"]
    billing, audit = Recorder(), Recorder()
    service.add_handler(Order, billing, group="billing", concurrency=8)
    service.add_handler(Order, audit, group="audit", concurrency=8)
    # due now: through the schedule, so both groups get them
    assert all(await service.enqueue_many([Order(id=f"n{i}") for i in range(40)]))
    await wait_for(lambda: billing.finished >= 40 and audit.finished >= 40, timeout=15)
    await wait_for(lambda: settled(service), timeout=10)
    assert sorted(billing.counts.values()) == sorted(audit.counts.values()) == [1] * 40
    assert await leftovers(redis_client, prefix) == []
    assert await service.remove_group(Order, "billing")  # stops this process's handler too
    with pytest.raises(ValueError, match="last delivery group"):
        await service.remove_group(Order, "audit")


@pytest.mark.parametrize("failing", ["audit", "default"])
async def test_a_failing_group_dead_letters_without_rerunning_the_other(
    services, redis_client, prefix, wait_for, failing
) -> None:
    service = await services.start()
    await service.register_group(Order, "audit", retry_attempts=2)

    async def boom(event: Order) -> None:
        raise RuntimeError("nope")

    good, bad = Recorder(), Recorder(boom)
    handlers = {"default": good, "audit": good}
    handlers[failing] = bad
    service.add_handler(Order, handlers["default"], concurrency=4, retry_attempts=2)
    service.add_handler(
        Order, handlers["audit"], concurrency=4, group="audit", retry_attempts=2,
        retry_backoff=fixed(0.05),
    )  # fmt: skip
    ids = [f"f{i}" for i in range(10)]
    assert all(await service.enqueue_many([Order(id=i) for i in ids]))
    group = None if failing == "default" else "audit"

    async def all_dead() -> bool:
        return len(await service.dead_letters(Order, group=group)) == len(ids)

    await wait_for(all_dead, timeout=15)
    await wait_for(lambda: settled(service), timeout=10)
    assert sorted(good.counts.values()) == [1] * len(ids)  # never re-run by the failures
    assert sorted(bad.counts.values()) == [3] * len(ids)  # 1 + retry_attempts
    other = "audit" if failing == "default" else None
    assert await service.dead_letters(Order, group=other) == []
    dead = await service.dead_letters(Order, group=group)
    assert {d.id for d in dead} == set(ids)
    assert all(d.attempts == 3 and d.error == "RuntimeError: nope" for d in dead)
    assert all(d.event == Order(id=d.id) for d in dead)  # the dead letter keeps the envelope
    stats = await service.group_stats(Order)
    assert (
        stats[failing].dead == len(ids)
        and stats["audit" if failing == "default" else "default"].dead == 0
    )

    # requeue for the failing group alone: it now succeeds; the other group is not re-run
    bad.behaviour = None
    assert await service.requeue_dead_letters(Order, ids[:5], group=group) == 5
    await wait_for(lambda: bad.finished >= 3 * len(ids) + 5, timeout=10)
    await wait_for(lambda: settled(service), timeout=10)
    assert sorted(good.counts.values()) == [1] * len(ids)
    # purge the rest: the last holder gone, so is the envelope
    assert await service.purge_dead_letters(Order, group=group) == 5
    assert await redis_client.hlen(keys(prefix).events) == 0
    assert await leftovers(redis_client, prefix) == []


async def test_a_group_with_no_process_gets_its_events_when_one_starts(
    services, redis_client, prefix, wait_for
) -> None:
    producer = services.producer()
    await producer.register_group(Order, "audit")
    first = await services.start()
    billing = Recorder()
    first.add_handler(Order, billing, concurrency=4)
    assert all(await producer.enqueue_many([(Order(id=f"w{i}", n=i), 0.05) for i in range(20)]))
    await wait_for(billing.handled(20), timeout=10)

    async def waiting() -> bool:
        return (await first.group_stats(Order))["audit"].ready == 20

    await wait_for(waiting, timeout=10)
    assert await redis_client.hlen(keys(prefix).events) == 20  # held for audit
    second = await services.start()
    audit = Recorder()
    second.add_handler(Order, audit, concurrency=4, group="audit")
    await wait_for(audit.handled(20), timeout=10)
    await wait_for(lambda: settled(first), timeout=10)
    assert sorted(audit.counts.values()) == [1] * 20
    assert sorted(billing.counts.values()) == [1] * 20
    assert sorted(e.n for e in audit.events) == list(range(20))
    assert await leftovers(redis_client, prefix) == []


async def test_a_group_registered_late_gets_what_becomes_due_after(
    services, redis_client, prefix, wait_for
) -> None:
    service = await services.start()
    billing, audit = Recorder(), Recorder()
    service.add_handler(Order, billing, concurrency=4)
    assert await service.enqueue_with_delay(Order(id="early"), 0)
    assert await service.enqueue_with_delay(Order(id="later"), 1.0)  # enqueued before audit
    await wait_for(billing.handled(1), timeout=10)
    # no groups so far: the type's keys as always, no registry
    assert await redis_client.exists(keys(prefix).groups, keys(prefix).pending) == 0
    service.add_handler(Order, audit, concurrency=4, group="audit")  # registers "audit"

    async def registered() -> bool:
        return "audit" in await service.groups(Order)

    await wait_for(registered, timeout=5)
    await wait_for(lambda: billing.finished >= 2 and audit.finished >= 1, timeout=10)
    await wait_for(lambda: settled(service), timeout=10)
    assert audit.ids == ["later"]
    assert sorted(billing.ids) == ["early", "later"]
    assert await leftovers(redis_client, prefix) == []


async def test_remove_group_drops_its_pending_deliveries(
    services, redis_client, prefix, wait_for
) -> None:
    service = await services.start()
    await service.register_group(Order, "audit")
    await service.register_group(Order, "reports")
    billing = Recorder()
    service.add_handler(Order, billing, concurrency=4)
    assert all(await service.enqueue_many([Order(id=f"r{i}") for i in range(30)]))
    await wait_for(billing.handled(30), timeout=10)

    async def held() -> bool:
        s = await service.group_stats(Order)
        return s["audit"].ready == s["reports"].ready == 30

    await wait_for(held, timeout=10)
    assert await redis_client.hlen(keys(prefix).events) == 30
    assert await service.remove_group(Order, "audit")
    assert not await service.remove_group(Order, "audit")
    assert await service.groups(Order) == ["default", "reports"]
    assert await redis_client.hlen(keys(prefix).events) == 30  # reports still holds them
    assert await service.remove_group(Order, "reports")
    assert await redis_client.hlen(keys(prefix).events) == 0
    assert await leftovers(redis_client, prefix) == []
    # a later event reaches the one group left
    assert await service.enqueue_with_delay(Order(id="after"), 0)
    await wait_for(billing.handled(31), timeout=10)
    with pytest.raises(ValueError, match="last delivery group"):
        await service.remove_group(Order, "default")


async def test_cancel_across_groups(services, redis_client, prefix, wait_for) -> None:
    service = await services.start()
    await service.register_group(Order, "audit")  # no audit process yet
    billing = Recorder()
    service.add_handler(Order, billing, concurrency=2)
    assert await service.enqueue_with_delay(Order(id="future"), 60)
    assert await service.enqueue_with_delay(Order(id="now"), 0)
    await wait_for(billing.handled(1), timeout=10)

    async def audit_holds() -> bool:
        return (await service.group_stats(Order))["audit"].ready == 1

    await wait_for(audit_holds, timeout=10)
    assert await service.cancel(Order, "future")  # not fanned out yet
    assert await service.cancel(Order, "now")  # waiting in audit's ready list
    assert not await service.cancel(Order, "now")
    assert await redis_client.hlen(keys(prefix).events) == 0
    audit = Recorder()
    service.add_handler(Order, audit, group="audit")
    assert await service.enqueue_with_delay(Order(id="marker"), 0)
    await wait_for(audit.handled(1), timeout=10)
    await wait_for(lambda: settled(service), timeout=10)
    assert audit.ids == ["marker"]
    assert sorted(billing.ids) == ["marker", "now"]
    assert await leftovers(redis_client, prefix) == []


async def test_cancel_for_one_group_leaves_the_others_delivery(
    services, redis_client, prefix, wait_for
) -> None:
    service = await services.start()
    await service.register_group(Order, "audit")  # and the default group: no process yet
    # not fanned out yet: the other group keeps it, due at its time
    assert await service.enqueue_with_delay(Order(id="future"), 3600)
    due = (await service.inspect(Order, "future")).due_at
    assert await service.cancel(Order, "future", group="audit") is CancelResult.REMOVED
    assert await service.cancel(Order, "future", group="audit") is CancelResult.UNKNOWN
    assert await service.cancel(Order, "future", group="no-such-group") is CancelResult.UNKNOWN
    info = await service.inspect(Order, "future")
    assert {g: s.state for g, s in info.groups.items()} == {
        "audit": "absent",
        "default": "scheduled",
    }
    assert info.groups["default"].due_at == due
    # fanned out (waiting in both ready lists): the default group's copy alone goes
    assert await service.enqueue_with_delay(Order(id="now"), 0)

    async def both_ready() -> bool:
        stats = await service.group_stats(Order)
        return stats["audit"].ready == stats["default"].ready == 1

    await wait_for(both_ready, timeout=10)
    assert await service.cancel(Order, "now", group="default") is CancelResult.REMOVED
    info = await service.inspect(Order, "now")
    assert (info.groups["audit"].state, info.groups["default"].state) == ("ready", "absent")
    billing, audit = Recorder(), Recorder()
    service.add_handler(Order, billing)
    service.add_handler(Order, audit, group="audit")
    await wait_for(audit.handled(1), timeout=10)
    assert audit.ids == ["now"]
    # the last group to let go of an event removes it
    assert await service.cancel(Order, "future", group="default") is CancelResult.REMOVED
    assert (await service.inspect(Order, "future")).state == "absent"
    await wait_for(lambda: settled(service), timeout=10)
    assert billing.ids == []
    assert await leftovers(redis_client, prefix) == []
    # a type without named groups has the default group alone
    assert await service.enqueue_with_delay(Plain(id="p"), 3600)
    assert await service.cancel(Plain, "p", group="audit") is CancelResult.UNKNOWN
    assert await service.cancel(Plain, "p", group="default") is CancelResult.REMOVED
    assert (await service.inspect(Plain, "p")).state == "absent"


async def test_replace_across_groups(services, redis_client, prefix, wait_for) -> None:
    service = await services.start()
    await service.register_group(Order, "audit")
    billing = Recorder()
    service.add_handler(Order, billing, concurrency=2)
    # not due yet: every group gets the new version
    assert await service.enqueue_with_delay(Order(id="a", n=1), 60)
    assert await service.enqueue_with_delay(Order(id="a", n=2), 0.1, replace=True)
    # already handled by billing, waiting for audit: audit gets the new version, billing
    # (which handled it) not again
    assert await service.enqueue_with_delay(Order(id="b", n=1), 0)
    await wait_for(lambda: billing.finished >= 2, timeout=10)

    async def audit_holds() -> bool:
        return (await service.group_stats(Order))["audit"].ready == 2

    await wait_for(audit_holds, timeout=10)
    assert await service.enqueue_with_delay(Order(id="b", n=2), 0.2, replace=True)
    assert not await service.enqueue_with_delay(Order(id="b", n=3), 0)  # kept, as ever
    audit = Recorder()
    service.add_handler(Order, audit, group="audit", concurrency=2)
    await wait_for(audit.handled(2), timeout=10)
    await wait_for(lambda: settled(service), timeout=10)
    assert sorted((e.id, e.n) for e in billing.events) == [("a", 2), ("b", 1)]
    assert sorted((e.id, e.n) for e in audit.events) == [("a", 2), ("b", 2)]
    assert await leftovers(redis_client, prefix) == []


async def test_replace_while_a_group_runs_the_old_version(
    services, redis_client, prefix, wait_for
) -> None:
    service = await services.start()
    await service.register_group(Order, "audit")
    release = asyncio.Event()

    async def slow(event: Order) -> None:
        if event.n == 1:
            await release.wait()

    billing, audit = Recorder(), Recorder(slow)
    service.add_handler(Order, billing)
    service.add_handler(Order, audit, group="audit")
    assert await service.enqueue_with_delay(Order(id="x", n=1), 0)
    await wait_for(lambda: billing.finished == 1 and audit.started == 1, timeout=10)
    assert await service.enqueue_with_delay(Order(id="x", n=2), 0, replace=True)
    release.set()  # the old run ends; its ack is stale and changes nothing
    await wait_for(audit.handled(2), timeout=10)
    await wait_for(lambda: settled(service), timeout=10)
    assert [e.n for e in audit.events] == [1, 2]
    assert [e.n for e in billing.events] == [1]  # billing had handled it already
    assert await leftovers(redis_client, prefix) == []


async def test_without_groups_no_group_key_ever_appears(
    services, redis_client, prefix, wait_for
) -> None:
    service = await services.start()

    async def flaky(event: Plain) -> bool:
        return event.id not in ("p1", "p2") or recorder.counts[event.id] > 1  # two retries

    recorder = Recorder(flaky)
    service.add_handler(Plain, recorder, concurrency=2)
    assert all(await service.enqueue_many([(Plain(id=f"p{i}"), i / 20) for i in range(8)]))
    await wait_for(lambda: recorder.finished == 10, timeout=15)
    names = {k.decode() for k in await prefix_keys(redis_client, prefix)}
    assert not any(":g:" in k or k.endswith((":groups", ":pending")) for k in names), names


async def test_group_names_are_checked(services) -> None:
    service = services.make()

    async def handler(event: Order) -> None:
        pass

    for bad in ("a:b", "", "x y", "{t}", 3):
        with pytest.raises((ValueError, TypeError)):
            service.add_handler(Order, handler, group=bad)  # type: ignore[arg-type]
    service.add_handler(Order, handler, group="audit")
    service.add_handler(Order, handler, group="default")  # the default group
    with pytest.raises(ValueError, match="already has a handler"):
        service.add_handler(Order, handler)
    with pytest.raises(ValueError):
        service.add_handler(Order, handler, group="other", retry_attempts=-1)


async def test_run_now_fans_out_to_every_group_or_runs_for_one(
    services, redis_client, prefix, wait_for
) -> None:
    """run_now of an event not fanned out yet reaches every group (it used to go to the
    default group's ready list alone, and the other groups never got it)."""
    service = await services.start()
    await service.register_group(Order, "audit")
    billing, audit = Recorder(), Recorder()
    assert await service.enqueue_with_delay(Order(id="all"), 3600)
    assert await service.enqueue_with_delay(Order(id="one", n=1), 3600)
    assert await service.run_now(Order, "all")
    assert not await service.run_now(Order, "all")  # not scheduled any more
    # for audit alone: the default group still gets it at its due time
    assert await service.run_now(Order, "one", group="audit")
    assert not await service.run_now(Order, "one", group="audit")
    assert not await service.run_now(Order, "nobody")
    assert not await service.run_now(Order, "one", group="no-such-group")
    info = await service.inspect(Order, "one")
    assert {g: s.state for g, s in info.groups.items()} == {
        "audit": "ready",
        "default": "scheduled",
    }
    assert info.state == "ready"  # the most active group's
    assert info.groups["default"].due_at is not None
    assert info.groups["default"].due_at > info.checked_at
    service.add_handler(Order, billing, concurrency=2)
    service.add_handler(Order, audit, concurrency=2, group="audit")
    await wait_for(lambda: billing.finished >= 1 and audit.finished >= 2, timeout=10)
    assert sorted(audit.ids) == ["all", "one"] and billing.ids == ["all"]
    # the default group's copy now runs too, when asked
    assert await service.run_now(Order, "one", group="default")
    await wait_for(billing.handled(2), timeout=10)
    await wait_for(lambda: settled(service), timeout=10)
    assert sorted(billing.ids) == ["all", "one"]
    assert await leftovers(redis_client, prefix) == []
    assert (await service.inspect(Order, "one")).state == "absent"


async def test_each_group_has_its_views(services, redis_client, prefix, wait_for) -> None:
    """inspect per group, in_flight / scheduled / due_histogram / history / group_stats
    with group=, on a type where "audit" retries while the default group is done."""
    service = await services.start(history_interval=0.2)
    await service.register_group(Order, "audit", retry_attempts=5)
    release = asyncio.Event()

    async def slow(event: Order) -> None:
        await release.wait()

    async def failing(event: Order) -> None:
        raise RuntimeError("audit is down")

    billing = Recorder()
    service.add_handler(Order, billing, concurrency=2)
    service.add_handler(
        Order, Recorder(failing), group="audit", retry_attempts=5, retry_backoff=fixed(7200)
    )
    assert await service.enqueue_with_delay(Order(id="r"), 0)
    assert await service.enqueue_with_delay(Order(id="later"), 600)

    async def retrying() -> bool:
        info = await service.inspect(Order, "r")
        return info.groups.get("audit") is not None and info.groups["audit"].attempts == 1

    await wait_for(retrying, timeout=10)
    await wait_for(billing.handled(1), timeout=10)

    async def default_acked() -> bool:  # acks are sent in batches, after the handler returns
        return (await service.inspect(Order, "r")).groups["default"].state == "absent"

    await wait_for(default_acked, timeout=10)
    info = await service.inspect(Order, "r")
    assert info.state == "scheduled"  # not "stranded": audit holds it, waiting for a retry
    assert {g: s.state for g, s in info.groups.items()} == {
        "audit": "scheduled",
        "default": "absent",
    }
    assert info.groups["audit"].last_error == "RuntimeError: audit is down"
    assert info.last_error == "RuntimeError: audit is down" and info.attempts == 1
    assert info.to_dict()["groups"]["audit"]["state"] == "scheduled"
    later = await service.inspect(Order, "later")  # not fanned out: every group gets it
    assert later.state == "scheduled"
    assert {s.state for s in later.groups.values()} == {"scheduled"}

    # upcoming: the type's schedule; with a group, its retries too
    assert [e.id for e in await service.scheduled(Order)] == ["later"]
    assert [e.id for e in await service.scheduled(Order, group="default")] == ["later"]
    audit_page = await service.scheduled(Order, group="audit")
    assert [(e.id, e.attempts) for e in audit_page] == [("later", 0), ("r", 1)]
    assert [e.id for e in await service.scheduled(Order, group="audit", offset=1)] == ["r"]
    assert [e.id for e in await service.scheduled(Order, group="audit", limit=1)] == ["later"]
    hist = await service.due_histogram(Order)
    assert hist.counts["next hour"] == 1 and sum(hist.counts.values()) == 1
    hist = await service.due_histogram(Order, group="audit")
    assert hist.counts["next hour"] == 1 and hist.counts["next day"] == 1
    stats = await service.group_stats(Order)
    assert (stats["audit"].scheduled, stats["default"].scheduled) == (2, 1)
    assert stats["audit"].next_due_at == later.due_at  # the earlier of the two schedules

    # in flight per group
    service.add_handler(Order, Recorder(slow), group="slow")
    assert await service.enqueue_with_delay(Order(id="s"), 0)

    async def slow_runs() -> bool:
        return [e.id for e in await service.in_flight(Order, group="slow")] == ["s"]

    await wait_for(slow_runs, timeout=10)

    async def default_done() -> bool:  # billing's ack may still be on its way
        return "s" not in [e.id for e in await service.in_flight(Order)]

    await wait_for(default_done, timeout=10)
    assert billing.counts["s"] == 1
    assert (await service.inspect(Order, "s")).groups["slow"].state == "in_flight"
    assert (await service.inspect(Order, "s")).state == "in_flight"

    # history per group (kept under "type:group" by the history writer)
    async def audit_history() -> bool:
        points = await service.history(Order, group="audit")
        return sum(p.failed for p in points) >= 1

    await wait_for(audit_history, timeout=10)
    assert sum(p.failed for p in await service.history(Order)) == 0
    assert sum(p.handled for p in await service.history(Order, group="default")) >= 1
    with pytest.raises(ValueError):
        await service.in_flight(Order, group="a:b")
    release.set()


def _slow_group_registration(service: EventService, monkeypatch, seconds: float = 0.5) -> None:
    """Make the consumer's own registration of its group late (as on a busy loop or a slow
    Redis): whatever it races with loses deterministically unless it waits for it."""
    register = service.store.groups.register_group

    async def slow(*args, **kwargs):
        await asyncio.sleep(seconds)
        return await register(*args, **kwargs)

    monkeypatch.setattr(service.store.groups, "register_group", slow)


async def test_add_handler_on_a_running_service_is_in_effect_for_the_next_enqueue(
    services, monkeypatch, wait_for
) -> None:
    service = await services.start()
    _slow_group_registration(service, monkeypatch)
    audit = Recorder()
    service.add_handler(Order, audit, group="audit")
    # due now, enqueued at once: the group must get it (issue 23: it silently did not)
    assert await service.enqueue_with_delay(Order(id="now"), 0)
    assert not service._runtime.pending.any  # registered once: later enqueues do not wait
    assert "audit" in await service.groups(Order)
    await wait_for(lambda: audit.finished == 1, timeout=10)
    assert list(audit.counts) == ["now"]


async def test_groups_of_handlers_added_before_start_are_in_effect_at_once(
    services, monkeypatch, wait_for
) -> None:
    service = services.make()
    _slow_group_registration(service, monkeypatch)
    audit = Recorder()
    service.add_handler(Order, audit, group="audit")
    await service.start()
    assert await service.enqueue_many([Order(id="a"), Order(id="b")]) == [True, True]
    await wait_for(lambda: audit.finished == 2, timeout=10)


async def test_a_removed_handler_leaves_no_registration_pending(services, monkeypatch) -> None:
    service = await services.start()
    _slow_group_registration(service, monkeypatch, seconds=5)
    service.add_handler(Order, Recorder(), group="audit")
    assert await service.remove_handler(Order, group="audit")
    await service.enqueue_with_delay(Order(id="x"), 60)  # does not wait 5 s for a registration
    assert await service.groups(Order) == ["default"]
