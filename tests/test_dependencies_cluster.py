"""Dependencies on the 3-master cluster (docs/WORKFLOWS.md, "Dependencies"): a parent, its
children and their own children on three different masters; the policies ("fail", "run",
"skip") and their consequences down the chain, handed from node to node by the relay.
(tests/test_dependencies_kill.py SIGKILLs the relay and a producer there.)
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from delayq import Event, EventService, Parent, current_delivery, fixed


class Root(Event, event_name="dcl-root"):
    fail: bool = False


class Mid(Event, event_name="dcl-mid"):
    pass


class Leaf(Event, event_name="dcl-leaf"):
    pass


TYPES = (Root, Mid, Leaf)


async def _prefix_on_three_masters(url: str) -> str:
    """A prefix under which the three types' hash tags live on three different masters."""
    client = RedisCluster.from_url(url)
    try:
        await client.initialize()
        while True:
            prefix = f"t-{uuid.uuid4().hex[:8]}"
            nodes = {client.get_node_from_key(f"{{{prefix}:{t.event_name}}}").name for t in TYPES}
            if len(nodes) == len(TYPES):
                return prefix
    finally:
        await client.aclose()


@pytest.mark.parametrize("policy", ["fail", "run", "skip"])
async def test_the_policies_across_three_masters(cluster, wait_for, policy):
    runs: dict[tuple[str, str], tuple[Parent, ...]] = {}

    async def handle(event: Any) -> None:
        d = current_delivery()
        assert d is not None
        runs[d.event_type, event.id] = d.parents
        if getattr(event, "fail", False):
            raise RuntimeError("root broke")

    prefix = await _prefix_on_three_masters(cluster.url)
    service = EventService.from_url(
        cluster.url,
        cluster=True,
        prefix=prefix,
        scheduling_interval=0.2,
        polling_timeout=0.5,
        retry_attempts=0,
        retry_backoff=fixed(0.05),
        shutdown_grace=1.0,
    )
    for t in TYPES:
        service.add_handler(t, handle)
    async with service:
        await service.enqueue_with_delay(Root(id="ok"), 0.3)
        await service.enqueue_with_delay(Root(id="bad", fail=True), 0.3)
        await service.enqueue_with_delay(
            Mid(id="m"), 0, after=[(Root, "ok"), (Root, "bad")], on_parent_failure=policy
        )
        await service.enqueue_with_delay(Leaf(id="l"), 0, after=[(Mid, "m")])
        await service.enqueue_with_delay(
            Leaf(id="l-run"), 0, after=[(Mid, "m")], on_parent_failure="run"
        )
        await wait_for(lambda: ("dcl-leaf", "l-run") in runs, timeout=15)
        (m_seen,) = runs["dcl-leaf", "l-run"]
        if policy == "run":
            assert [p.status for p in runs["dcl-mid", "m"]] == ["ok", "failed"]
            assert "root broke" in (runs["dcl-mid", "m"][1].error or "")
            assert m_seen.status == "ok"
            await wait_for(lambda: ("dcl-leaf", "l") in runs, timeout=10)
            return
        assert ("dcl-mid", "m") not in runs
        mid = await service.inspect(Mid, "m")
        if policy == "fail":
            assert mid.state == "dead" and m_seen.status == "failed"
            assert (mid.last_error or "").startswith("ParentFailed: dcl-root bad failed")
        else:
            assert mid.state == "absent" and m_seen.status == "skipped"

        # the default policy down the chain: a dead letter, ParentFailed
        async def leaf_dead() -> bool:
            return (await service.inspect(Leaf, "l")).state == "dead"

        await wait_for(leaf_dead, timeout=10)
        leaf = await service.inspect(Leaf, "l")
        assert ("dcl-leaf", "l") not in runs
        assert (leaf.last_error or "").startswith("ParentFailed: dcl-mid m")
        assert (await service.stats_for(Mid)).waiting == 0
