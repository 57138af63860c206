"""``EventService.enqueue_envelopes``: pre-encoded envelopes through the normal enqueue script."""

from __future__ import annotations

import pytest

from delayq import Event, EventService, InMemoryMetrics, current_delivery
from delayq.codec import Codec


class Envy(Event, event_name="envy"):
    n: int = 0


async def test_codes_dedup_and_delivery(redis_url: str, prefix: str, wait_for) -> None:
    metrics = InMemoryMetrics()
    service = EventService.from_url(redis_url, prefix=prefix, metrics=metrics)
    codec = Codec()
    a, b = codec.encode(Envy(id="a", n=1)), codec.encode(Envy(id="b", n=2), {"k": "v"})
    got: list[tuple[int, str, str]] = []

    async def handler(event: Envy) -> None:
        d = current_delivery()
        assert d is not None
        got.append((event.n, dict(d.context).get("k", ""), d.version))

    try:
        assert await service.enqueue_envelopes("envy", [("a", a, 0), ("b", b, 3600_000)]) == [1, 1]
        assert await service.enqueue_envelopes("envy", [("a", a, 0)]) == [0]
        assert await service.enqueue_envelopes("envy", [("b", b, 0)], replace=True) == [2]
        assert await service.enqueue_envelopes("envy", []) == []
        for bad in ([("a", "text", 0)], [("", a, 0)], [("a", a, 1.5)], [("a", a)]):
            with pytest.raises(TypeError):
                await service.enqueue_envelopes("envy", bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await service.enqueue_envelopes("envy", [("a", a, -1)])
        with pytest.raises(ValueError):
            await service.enqueue_envelopes("bad name", [("a", a, 0)])
        service.add_handler(Envy, handler)
        await service.start()
        await wait_for(lambda: len(got) == 2, timeout=10)
        assert sorted(g[:2] for g in got) == [(1, ""), (2, "v")]
        assert len({g[2] for g in got}) == 2
        assert metrics.counters[("enqueued", "envy")] == 2
        assert metrics.counters[("kept", "envy")] == 1
        assert metrics.counters[("replaced", "envy")] == 1
    finally:
        await service.aclose()
