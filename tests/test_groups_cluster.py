"""Delivery groups on a real 3-master Redis Cluster: fan-out, per-group retries and dead
letters, group_stats, requeue/purge per group, cancel and replace across groups,
remove_group, and a partitioned type with groups (its partitions on every master).

Every group script touches the keys of one type (one hash tag), so each runs on one
slot; these tests would fail with CROSSSLOT (or a script touching an undeclared key on
another node) if one did not.
"""

from __future__ import annotations

from collections import Counter

import pytest
import redis
from redis.crc import key_slot

from delayq import Event, EventService, fixed
from delayq.keys import PrefixKeys, TypeKeys
from delayq.partitions.shards import shards
from delayq.testing import wait_for
from delayq.testing.cluster import RedisClusterServer

FAST = {
    "visibility_timeout": 2.0,
    "scheduling_interval": 0.2,
    "lock_timeout": 1.0,
    "polling_timeout": 1.0,
    "shutdown_grace": 2.0,
    "retry_backoff": fixed(0.05),
}


class GOrder(Event, event_name="cgrp-order"):
    n: int = 0


def _hot(partitions: int) -> type[Event]:
    # one place for the class, so that a redefinition with another partition count is
    # what a deploy that changes the count does (same module and qualname)
    class Hot(Event, event_name="cgrp-hot", partitions=partitions):
        n: int = 0

    return Hot


GHot = _hot(6)


def _service(cluster: RedisClusterServer, prefix: str, **options: object) -> EventService:
    return EventService.from_url(cluster.url, cluster=True, prefix=prefix, **{**FAST, **options})


def _keys_everywhere(cluster: RedisClusterServer, prefix: str) -> list[str]:
    """Every key of the prefix on every master."""
    found: list[str] = []
    for node in cluster.nodes:
        client = redis.Redis(host=node.host, port=node.port, password=node.password)
        try:
            found.extend(k.decode() for k in client.keys(f"{{{prefix}*"))
        finally:
            client.close()
    return sorted(found)


def _leftovers(cluster: RedisClusterServer, prefix: str) -> list[str]:
    """Keys other than counters, registries, heartbeats and history (which outlive events)."""
    keep = (":types", ":meta", ":groups", ":scheduler-lock", ":workers", ":schedulers", ":format")
    return [
        k
        for k in _keys_everywhere(cluster, prefix)
        if not k.endswith(keep) and ":worker:" not in k and ":history:" not in k
    ]


class Recorder:
    """Counts deliveries per id; ``fail`` makes it raise."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.counts: Counter[str] = Counter()
        self.versions: list[tuple[str, int]] = []

    async def __call__(self, event: GOrder | GHot) -> None:
        self.counts[event.id] += 1
        self.versions.append((event.id, event.n))
        if self.fail:
            raise RuntimeError("nope")

    @property
    def total(self) -> int:
        return sum(self.counts.values())


async def _settled(service: EventService, event_type: type[Event]) -> bool:
    stats = await service.group_stats(event_type)
    return all(c.scheduled == c.ready == c.in_flight == 0 for c in stats.values())


async def test_fan_out_retries_and_dead_letters_per_group_on_a_cluster(
    cluster: RedisClusterServer, prefix: str
) -> None:
    # the group keys share the type's hash tag: one slot for every script
    tk = TypeKeys(prefix, GOrder.event_name)
    slots = {key_slot(k.encode()) for k in (*tk.view("audit"), *tk.group_keys("audit"))}
    assert slots == {key_slot(tk.events.encode())}
    service = _service(cluster, prefix)
    billing, audit, reports = Recorder(), Recorder(fail=True), Recorder()
    try:
        await service.register_group(GOrder, "audit", retry_attempts=2)
        await service.register_group(GOrder, "reports")
        assert await service.groups(GOrder) == ["audit", "default", "reports"]
        service.add_handler(GOrder, billing, concurrency=4)
        service.add_handler(GOrder, audit, concurrency=4, group="audit", retry_attempts=2)
        service.add_handler(GOrder, reports, concurrency=4, group="reports")
        await service.start()
        ids = [f"o{i}" for i in range(40)]
        assert all(await service.enqueue_many([(GOrder(id=i), (n % 4) / 10) for n, i in
                                               enumerate(ids)]))  # fmt: skip

        async def audit_dead() -> bool:
            return (await service.group_stats(GOrder))["audit"].dead == len(ids)

        await wait_for(audit_dead, timeout=20)
        await wait_for(lambda: _settled(service, GOrder), timeout=10)
        # every group got each event; audit's failures re-ran audit alone
        assert billing.counts == reports.counts == Counter({i: 1 for i in ids})
        assert audit.counts == Counter({i: 3 for i in ids})  # 1 + retry_attempts
        stats = await service.group_stats(GOrder)
        assert {g: (c.ready, c.in_flight, c.dead) for g, c in stats.items()} == {
            "audit": (0, 0, 40), "default": (0, 0, 0), "reports": (0, 0, 0),
        }  # fmt: skip
        assert await service.dead_letters(GOrder) == []
        dead = await service.dead_letters(GOrder, group="audit", limit=100)
        assert sorted(d.id for d in dead) == sorted(ids)
        assert all(d.error == "RuntimeError: nope" and d.event == GOrder(id=d.id) for d in dead)

        # requeue some for audit alone: they succeed now, the other groups are not re-run
        audit.fail = False
        assert await service.requeue_dead_letters(GOrder, ids[:10], group="audit") == 10
        await wait_for(lambda: audit.total == 3 * len(ids) + 10, timeout=10)
        await wait_for(lambda: _settled(service, GOrder), timeout=10)
        assert billing.counts == reports.counts == Counter({i: 1 for i in ids})
        assert (await service.group_stats(GOrder))["audit"].dead == 30
        # purge the rest: the last holder gone, so are the envelopes and every key
        assert await service.purge_dead_letters(GOrder, group="audit") == 30
        assert await service.dead_letters(GOrder, group="audit") == []
        assert _leftovers(cluster, prefix) == []
    finally:
        await service.aclose()


async def test_cancel_replace_and_remove_group_on_a_cluster(
    cluster: RedisClusterServer, prefix: str
) -> None:
    service = _service(cluster, prefix)
    billing = Recorder()
    try:
        await service.register_group(GOrder, "audit")  # no process: its events wait
        await service.register_group(GOrder, "reports")
        service.add_handler(GOrder, billing, concurrency=4)
        await service.start()
        assert await service.enqueue_with_delay(GOrder(id="future"), 60)
        assert await service.enqueue_with_delay(GOrder(id="replaced", n=1), 0)
        assert await service.enqueue_with_delay(GOrder(id="gone"), 0)
        assert all(await service.enqueue_many([GOrder(id=f"w{i}") for i in range(20)]))
        await wait_for(lambda: billing.total == 22, timeout=10)

        async def held() -> bool:
            s = await service.group_stats(GOrder)
            return s["audit"].ready == s["reports"].ready == 22

        await wait_for(held, timeout=10)
        # cancel across groups: the schedule, and every group's ready list
        assert await service.cancel(GOrder, "future")
        assert await service.cancel(GOrder, "gone")
        assert not await service.cancel(GOrder, "gone")
        # cancel for one group: audit's copy of w0 goes, reports keeps its own
        assert await service.cancel(GOrder, "w0", group="audit")
        info = await service.inspect(GOrder, "w0")
        assert (info.groups["audit"].state, info.groups["reports"].state) == ("absent", "ready")
        # replace across groups: the groups that still hold it get the new version
        assert await service.enqueue_with_delay(GOrder(id="replaced", n=2), 0, replace=True)
        info = await service.inspect(GOrder, "replaced")
        assert info.event == GOrder(id="replaced", n=2)
        # remove one group: its deliveries go, the other still holds the events
        assert await service.remove_group(GOrder, "reports")
        assert not await service.remove_group(GOrder, "reports")
        assert await service.groups(GOrder) == ["audit", "default"]
        audit = Recorder()
        service.add_handler(GOrder, audit, concurrency=4, group="audit")
        await wait_for(lambda: audit.total == 20, timeout=10)
        await wait_for(lambda: _settled(service, GOrder), timeout=10)
        assert sorted(audit.versions) == sorted(
            [("replaced", 2)] + [(f"w{i}", 0) for i in range(1, 20)]
        )
        assert ("replaced", 2) not in billing.versions  # billing had handled it already
        assert _leftovers(cluster, prefix) == []
        assert await service.remove_group(GOrder, "audit")
        with pytest.raises(ValueError, match="last delivery group"):
            await service.remove_group(GOrder, "default")
    finally:
        await service.aclose()


async def test_a_partitioned_type_with_groups_on_a_cluster(
    cluster: RedisClusterServer, prefix: str
) -> None:
    service = _service(cluster, prefix, retry_attempts=1)
    billing, audit = Recorder(), Recorder()
    bad_ids = {f"h{i}" for i in range(0, 60, 10)}

    async def picky(event: GHot) -> None:
        await audit(event)
        if event.id in bad_ids:
            raise RuntimeError("nope")

    try:
        await service.register_group(GHot, "audit")
        service.add_handler(GHot, billing, concurrency=6)
        service.add_handler(GHot, picky, concurrency=6, group="audit")
        await service.start()
        ids = [f"h{i}" for i in range(60)]
        assert all(await service.enqueue_many([(GHot(id=i), (n % 5) / 10) for n, i in
                                               enumerate(ids)]))  # fmt: skip
        # the group's keys exist in every partition, on every master
        client = redis.cluster.RedisCluster.from_url(cluster.url)
        try:
            ports = {
                client.get_node_from_key(PrefixKeys(prefix).for_shard(s).groups).port
                for s in shards(GHot.event_name, 6)
                if client.hexists(PrefixKeys(prefix).for_shard(s).groups, "audit")
            }
        finally:
            client.close()
        assert len(ports) == 3

        async def audit_dead() -> bool:
            return (await service.group_stats(GHot))["audit"].dead == len(bad_ids)

        await wait_for(audit_dead, timeout=20)
        await wait_for(lambda: _settled(service, GHot), timeout=10)
        assert billing.counts == Counter({i: 1 for i in ids})
        assert audit.counts == Counter({i: 2 if i in bad_ids else 1 for i in ids})
        stats = await service.group_stats(GHot)  # summed over the six partitions
        assert {g: c.dead for g, c in stats.items()} == {"audit": 6, "default": 0}
        dead = await service.dead_letters(GHot, group="audit")
        assert {d.id for d in dead} == bad_ids
        # by id (each to its partition) and all (every partition)
        assert await service.purge_dead_letters(GHot, ["h0"], group="audit") == 1
        assert await service.requeue_dead_letters(GHot, group="audit") == 5
        await wait_for(lambda: audit.total == 60 + 6 + 5 + 5, timeout=10)
        await wait_for(_dead_is(service, GHot, 5), timeout=10)
        assert await service.purge_dead_letters(GHot, group="audit") == 5
        # cancel for one group, on the id's partition: the other group keeps it
        assert await service.enqueue_with_delay(GHot(id="later"), 3600)
        assert await service.cancel(GHot, "later", group="audit")
        info = await service.inspect(GHot, "later")
        assert (info.groups["audit"].state, info.groups["default"].state) == (
            "absent",
            "scheduled",
        )
        assert await service.cancel(GHot, "later", group="default")
        assert (await service.inspect(GHot, "later")).state == "absent"
        assert await service.remove_group(GHot, "audit")
        assert await service.groups(GHot) == ["default"]
        assert _leftovers(cluster, prefix) == []
    finally:
        await service.aclose()
    # repartitioning a type with groups is refused (not supported yet): a deploy with
    # another partition count, as a fresh process sees it
    other = _service(cluster, prefix)
    try:
        with pytest.raises(ValueError, match="delivery groups"):
            await other.repartition(_hot(3), wait=1)
    finally:
        await other.aclose()


def _dead_is(service: EventService, event_type: type[Event], n: int):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return (await service.group_stats(event_type))["audit"].dead == n

    return check


async def test_group_views_and_run_now_on_a_cluster(
    cluster: RedisClusterServer, prefix: str
) -> None:
    """inspect in every group, run_now for all groups or one, and the per-group views
    (scheduled, due_histogram, in_flight, group_stats) of a partitioned type."""
    service = _service(cluster, prefix)
    billing, audit = Recorder(), Recorder()
    try:
        await service.register_group(GHot, "audit")
        ids = [f"v{i}" for i in range(12)]
        assert all(await service.enqueue_many([(GHot(id=i), 3600) for i in ids]))
        info = await service.inspect(GHot, "v0")
        assert info.state == "scheduled"
        assert {g: s.state for g, s in info.groups.items()} == {
            "audit": "scheduled",
            "default": "scheduled",
        }
        assert len(await service.scheduled(GHot, group="audit", limit=100)) == 12
        assert (await service.due_histogram(GHot, group="audit")).counts["next hour"] == 12
        # every group now, or one group (the other at its due time)
        assert await service.run_now(GHot, "v0")
        assert await service.run_now(GHot, "v1", group="audit")
        info = await service.inspect(GHot, "v1")
        assert {g: s.state for g, s in info.groups.items()} == {
            "audit": "ready",
            "default": "scheduled",
        }
        stats = await service.group_stats(GHot)
        assert (stats["audit"].ready, stats["default"].ready) == (2, 1)
        assert (stats["audit"].scheduled, stats["default"].scheduled) == (10, 11)
        assert len(await service.scheduled(GHot, group="default", limit=100)) == 11
        assert len(await service.scheduled(GHot, limit=100)) == 10  # the type's schedule
        await _dashboard_pages(service)
        service.add_handler(GHot, billing)
        service.add_handler(GHot, audit, group="audit")
        await service.start()
        await wait_for(lambda: audit.total == 2 and billing.total == 1, timeout=10)
        assert sorted(audit.counts) == ["v0", "v1"] and list(billing.counts) == ["v0"]
        assert await service.in_flight(GHot, group="audit") == []
        for i in ids[2:]:
            assert await service.cancel(GHot, i)
        assert await service.run_now(GHot, "v1", group="default")
        await wait_for(lambda: billing.total == 2, timeout=10)
        await wait_for(lambda: _settled(service, GHot), timeout=10)
        assert (await service.inspect(GHot, "v1")).state == "absent"
        assert _leftovers(cluster, prefix) == []
    finally:
        await service.aclose()


async def _dashboard_pages(service: EventService) -> None:
    """The dashboard's pages of a partitioned type with groups, read from the cluster."""
    import httpx

    from delayq.dashboard import create_app

    transport = httpx.ASGITransport(app=create_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as http:
        for params in ({}, {"group": "audit"}, {"group": "default"}):
            page = await http.get("/type", params={"name": GHot.event_name, **params})
            assert page.status_code == 200
        assert 'class="upcoming-row" data-id="v2"' in page.text
        page = await http.get("/event", params={"type": GHot.event_name, "id": "v1"})
        assert page.status_code == 200
        assert 'class="event-group-row" data-group="audit"' in page.text
        assert (await http.get("/")).status_code == 200
