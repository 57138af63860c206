"""The relay's audits of waiting children (docs/WORKFLOWS.md, "Across slots, never stuck")
go together: the audits read in one call are linked with one script call per parent
shard, not a round trip per child, so a parent's many waiting children do not hold the
relay (and every other shard's completions) while they are audited."""

from __future__ import annotations

from typing import Any

from delayq import Event, EventService


class Hub(Event, event_name="ra-hub"):
    """The parent."""


class Spoke(Event, event_name="ra-spoke"):
    """Its children."""


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
