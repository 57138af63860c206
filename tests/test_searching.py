"""The ready list, id prefix search and dead-letter search by error text, on a real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from core_support import ServicePool

from delayq import Event, EventService


class Job(Event, event_name="search-job"):
    """A plain event."""


class Split(Event, event_name="search-split", partitions=3):
    """A partitioned event."""


class Fails(Event, event_name="search-fails"):
    """Fails with its id in the message."""


async def _fail(event: Fails) -> None:
    raise RuntimeError(f"Timeout talking to {event.id}" if event.id.startswith("t") else "Refused")


@pytest.fixture
async def pool(redis_url: str, prefix: str) -> AsyncIterator[ServicePool]:
    p = ServicePool(redis_url, prefix, retry_attempts=0)
    try:
        yield p
    finally:
        await p.aclose()


async def test_ready_list_in_order_and_cancel(pool: ServicePool, wait_for) -> None:
    service = await pool.start(heartbeat_interval=0)  # scheduler, no handler: events wait ready
    await service.enqueue_many([Job(id=f"r{i}") for i in range(5)])
    await service.enqueue_with_delay(Job(id="later"), 3600)

    async def all_ready() -> bool:
        return (await service.stats_for(Job)).ready == 5

    await wait_for(all_ready, timeout=10)
    page = await service.ready(Job, limit=3)
    assert [e.id for e in page] == ["r0", "r1", "r2"]
    assert [e.id for e in await service.ready("search-job", limit=3, offset=3)] == ["r3", "r4"]
    assert page[0].enqueued_at is not None and not page[0].popped and page[0].attempts == 0
    assert await service.cancel(Job, "r1")
    assert [e.id for e in await service.ready(Job)] == ["r0", "r2", "r3", "r4"]
    with pytest.raises(ValueError):
        await service.ready(Job, limit=0)
    with pytest.raises(ValueError):
        await service.ready(Job, offset=2**63)


async def test_ready_list_of_a_partitioned_type(pool: ServicePool, wait_for) -> None:
    service = await pool.start(heartbeat_interval=0)
    await service.enqueue_many([Split(id=f"p{i}") for i in range(7)])

    async def all_ready() -> bool:
        return (await service.stats_for(Split)).ready == 7

    await wait_for(all_ready, timeout=10)
    ids = [e.id for e in await service.ready(Split, limit=1000)]
    assert sorted(ids) == [f"p{i}" for i in range(7)]
    assert len(await service.ready(Split, limit=2, offset=6)) == 1


async def test_find_ids_by_prefix_in_every_state(pool: ServicePool) -> None:
    service: EventService = pool.producer(heartbeat_interval=0)
    await service.enqueue_many([Job(id=f"order-{i}") for i in range(30)], delay=3600)
    await service.enqueue_many([Job(id="other"), Job(id="ord*er"), Job(id="ord[x]")], delay=3600)
    found = await service.find_ids(Job, "order-1", limit=50)
    assert found.complete
    assert [m.id for m in found.matches] == ["order-1", *(f"order-1{i}" for i in range(10))]
    assert {(m.state, m.group) for m in found.matches} == {("scheduled", "default")}
    # glob characters are matched literally
    assert [m.id for m in (await service.find_ids(Job, "ord*")).matches] == ["ord*er"]
    assert [m.id for m in (await service.find_ids(Job, "ord[")).matches] == ["ord[x]"]
    few = await service.find_ids(Job, "order-", limit=5)
    assert len(few.matches) == 5 and not few.complete
    assert (await service.find_ids(Job, "zzz")).matches == []
    with pytest.raises(ValueError):
        await service.find_ids(Job, "")


async def test_find_dead_letters_by_error_text(pool: ServicePool, wait_for, monkeypatch) -> None:
    worker = await pool.start(heartbeat_interval=0)
    worker.add_handler(Fails, _fail)
    await worker.enqueue_many([Fails(id=f"t{i}") for i in range(6)] + [Fails(id="x1")])

    async def dead() -> bool:
        return (await worker.stats_for(Fails)).dead == 7

    await wait_for(dead, timeout=10)
    found = await worker.find_dead_letters(Fails, "TIMEOUT talking")
    assert sorted(d.id for d in found.items) == [f"t{i}" for i in range(6)]
    assert found.complete and found.next_offset == 7
    assert "Timeout" in found.items[0].error
    # bounded: look at 3 dead letters at a time and continue where the last call stopped
    seen: list[str] = []
    offset, rounds = 0, 0
    while True:
        part = await worker.find_dead_letters(Fails, "refused", offset=offset, scan=3)
        seen += [d.id for d in part.items]
        offset, rounds = part.next_offset, rounds + 1
        if part.complete:
            break
    assert seen == ["x1"] and rounds == 3
    # several short script calls make one search (each looks at _FIND_CHUNK at most)
    import delayq.views.searching

    monkeypatch.setattr(delayq.views.searching, "_FIND_CHUNK", 2)
    chunked = await worker.find_dead_letters(Fails, "timeout", scan=5)
    first5 = [d.id for d in await worker.dead_letters(Fails, limit=5)]
    assert [d.id for d in chunked.items] == [i for i in first5 if i.startswith("t")]
    assert chunked.next_offset == 5 and not chunked.complete
    rest = await worker.find_dead_letters(Fails, "timeout", offset=5)
    assert len(chunked.items) + len(rest.items) == 6 and rest.complete and rest.next_offset == 7
    two = await worker.find_dead_letters(Fails, "timeout", limit=2)
    assert len(two.items) == 2 and not two.complete and two.next_offset < 7
    with pytest.raises(ValueError):
        await worker.find_dead_letters(Fails, "x", scan=10_000)
