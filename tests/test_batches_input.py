"""A batch's ``enqueue_many`` refuses the items the service's refuses, with the same
errors (one parser of ``(event, delay)`` items, ``delayq.events.item_due``), before
anything is written: no member is added, no event enqueued."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from delayq import Event, EventService


class InputRow(Event, event_name="bi-row"):
    """A member."""


ROW = InputRow(id="r1")
BAD: list[Any] = [
    (ROW,),  # not a pair
    (ROW, 1, 2),  # nor this (a batch took its first two)
    (ROW, -1),  # a negative delay
    (ROW, float("nan")),
    (ROW, timedelta(seconds=-1)),
    (ROW, "soon"),  # not a delay
    (ROW, True),
    "r2",  # not an event
    ("r2", 1),
    InputRow(id=""),  # an empty id (refused before the batch learns of it)
]


@pytest.mark.parametrize("bad", BAD, ids=repr)
async def test_bad_items_are_refused_as_the_service_refuses_them(
    redis_url: str, prefix: str, bad: Any
) -> None:
    async with EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False) as service:
        with pytest.raises((TypeError, ValueError)) as by_service:
            await service.enqueue_many([InputRow(id="r0"), bad])
        async with service.batch() as batch:
            with pytest.raises((TypeError, ValueError)) as by_batch:
                await batch.enqueue_many([InputRow(id="r0"), bad])
        assert (by_batch.type, str(by_batch.value)) == (by_service.type, str(by_service.value))
        info = await service.batch_info(batch.id)
        assert (info.state, info.total) == ("done", 0)  # nothing was added
        assert (await service.stats()).get("bi-row") is None  # nor enqueued
