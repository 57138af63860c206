"""The testing kit (delayq.testing: advance, drain, enqueued and its assertions) on a real
server: time moves for everything compared with Redis's clock, and nothing sleeps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from delayq import EventService, events
from delayq.testing import (
    advance,
    assert_enqueued,
    assert_not_enqueued,
    drain,
    enqueued,
    now,
    isolated_service,
)


class Nudge(events.Event, event_name="kit-nudge"):
    text: str = ""


@pytest.fixture
async def service(redis_url: str) -> AsyncIterator[EventService]:
    async with isolated_service(redis_url) as svc:
        yield svc


async def test_an_event_three_hours_away_runs_after_advance(service: EventService) -> None:
    seen: list[str] = []

    async def handle(event: Nudge) -> None:
        seen.append(event.id)

    service.add_handler(Nudge, handle)
    await service.enqueue_with_delay(Nudge(id="n1", text="hi"), timedelta(hours=3))
    assert await drain(service) == []
    await assert_enqueued(service, Nudge, id="n1", due_in=timedelta(hours=3))
    await advance(service, timedelta(hours=2, minutes=59))
    assert await drain(service) == []
    await advance(service, timedelta(minutes=1))
    runs = await drain(service)
    assert [(r.type, r.id, r.attempt, r.outcome) for r in runs] == [("kit-nudge", "n1", 1, "success")]
    assert seen == ["n1"]
    await assert_not_enqueued(service, Nudge)
