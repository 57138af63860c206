"""The relay under load (docs/WORKFLOWS.md, "Across slots, never stuck"): a parent's many
waiting children hold neither the relay nor the other shards' completions. The audits
read in one call are linked with one script call per parent shard, not a round trip per
child; and the relay reads each shard in turn, so a shard with much due work (a large
fan-out) delays the others by one read, not by all of it."""

from __future__ import annotations

from typing import Any

from delayq import Event, EventService


class Hub(Event, event_name="ra-hub"):
    """The parent."""


class Spoke(Event, event_name="ra-spoke"):
    """Its children."""


class Other(Event, event_name="rb-other"):
    """A parent of another type (its shard sorts after the hub's)."""


class OtherChild(Event, event_name="rb-other-child"):
    """Its child."""


async def test_an_audit_round_links_many_children_in_a_few_calls(redis_url, prefix, wait_for):
    n = 1500  # audited one by one: 1,500 calls; together: 6 (256 audits per read)
    ran: set[str] = set()

    async def handle(event: Event) -> None:
        ran.add(event.id)

    worker = EventService.from_url(redis_url, prefix=prefix, scheduling_interval=0.1)
    assert worker._scheduler is not None
    worker._scheduler.relay.audit_ms = 300
    worker.add_handler(Hub, handle)
    worker.add_handler(Spoke, handle, concurrency=32)
    links = worker.store.dependencies.dep_link
    calls: list[int] = []
    linked: set[str] = set()

    async def counting(shard: str, triples: Any) -> list[bytes]:  # observe only
        calls.append(len(triples))
        linked.update(cid for _, _, cid in triples)
        return await links(shard, triples)

    worker.store.dependencies.dep_link = counting  # type: ignore[method-assign]
    async with (
        EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False) as producer,
        worker,
    ):
        await producer.enqueue_with_delay(Hub(id="h"), 3600)
        spokes = [Spoke(id=f"s{i}") for i in range(n)]
        assert all(await producer.enqueue_many(spokes, after=[(Hub, "h")]))
        # every child's first audit (300 ms after its enqueue) links it again
        await wait_for(lambda: len(linked) == n, timeout=30)
        assert len(calls) <= 30, f"{len(calls)} dep_link calls for {n} audits"
        assert (await producer.stats())["ra-spoke"].waiting == n
        await producer.enqueue_with_delay(Hub(id="h"), 0, replace=True)
        await wait_for(lambda: len(ran) == n + 1, timeout=30)


async def test_a_large_fan_out_holds_other_shards_one_read(redis_url, prefix):
    """Two completions wait: the hub's (to 600 children: three reads of 256) and another
    parent's (one child). One relay pass reads the shards in turn: the other parent's
    child is released after the hub's first read, not after its last."""
    async with EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False) as producer:
        await producer.enqueue_with_delay(Hub(id="h"), 3600)
        spokes = [Spoke(id=f"s{i}") for i in range(600)]
        assert all(await producer.enqueue_many(spokes, after=[(Hub, "h")], on_parent_failure="run"))
        await producer.enqueue_with_delay(Other(id="o"), 3600)
        await producer.enqueue_with_delay(
            OtherChild(id="c"), 0, after=[(Other, "o")], on_parent_failure="run"
        )
        # cancelled parents: their completions ("cancelled") wait in the relay
        assert await producer.cancel(Hub, "h")
        assert await producer.cancel(Other, "o")

        relay_host = EventService.from_url(redis_url, prefix=prefix)  # not started
        assert relay_host._scheduler is not None
        relay = relay_host._scheduler.relay
        store = relay_host.store.dependencies
        reads: list[str] = []
        work = store.dep_work

        async def recording(shard: str, **kw: Any) -> Any:  # observe only
            reads.append(shard.split(":")[0])
            return await work(shard, **kw)

        store.dep_work = recording  # type: ignore[method-assign]
        try:
            await relay._pass()
        finally:
            await relay_host.aclose()
        # the hub's shard is read three times (256 children, 256, 88), the other parent's
        # once: between the hub's first and second reads, with every other shard's first
        hub = [i for i, shard in enumerate(reads) if shard == "ra-hub"]
        assert len(hub) == 3 and hub[0] < reads.index("rb-other") < hub[1], reads
        assert (await producer.stats())["ra-spoke"].waiting == 0
        assert (await producer.inspect(OtherChild, "c")).state != "waiting"
