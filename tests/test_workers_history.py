"""Worker heartbeats and the handled/failed/lateness history (issue 12, library parts)."""

from __future__ import annotations

import asyncio
import os

from core_support import ServicePool

from delayq import Event, EventService
from delayq.runtime.heartbeat import Heartbeat
from delayq.runtime.history import COARSE_SLOTS, MINUTE_SLOTS, HistoryRecorder, percentile


class Beat(Event, event_name="wh-beat"):
    """An event for these tests."""

    fail: bool = False


async def _handle(event: Beat) -> None:
    if event.fail:
        raise RuntimeError("asked to fail")


async def test_heartbeat_lists_live_workers_and_removes_on_close(
    redis_url: str, prefix: str, wait_for
):
    pool = ServicePool(redis_url, prefix)
    try:
        service = pool.make(heartbeat_interval=0.1)
        service.add_handler(Beat, _handle, concurrency=3)
        await service.start()
        viewer = pool.producer()
        workers = await wait_for(viewer.workers, timeout=5)
        assert [w.id for w in workers] == [service.worker_id]
        (w,) = workers
        assert w.pid == os.getpid() and w.types == {"wh-beat": 3}
        assert w.in_flight == {"wh-beat": 0} and w.version and w.host
        assert w.ttl == 0.3
        await service.aclose()
        assert await viewer.workers() == []
    finally:
        await pool.aclose()


async def test_a_worker_that_stops_beating_vanishes_after_its_ttl(
    redis_url: str, prefix: str, wait_for
):
    pool = ServicePool(redis_url, prefix)
    try:
        viewer = pool.producer()
        ghost = Heartbeat(viewer.store, 0.1, lambda: {"wh-beat": (1, 0)})
        # one beat, then nothing: as if the process had been killed
        await viewer.store.workers.heartbeat(ghost.worker_id, ghost.record(), ghost.ttl_ms)
        assert [w.id for w in await viewer.workers()] == [ghost.worker_id]

        async def gone() -> bool:
            return await viewer.workers() == []

        await wait_for(gone, timeout=5)
        # the index entry goes at the next beat of anyone
        live = Heartbeat(viewer.store, 1, dict)
        await viewer.store.workers.heartbeat(live.worker_id, live.record(), live.ttl_ms)
        members = await viewer.store.redis.zrange(viewer.store.keys.workers, 0, -1)
        assert members == [live.worker_id.encode()]
    finally:
        await pool.aclose()


async def test_idle_service_with_heartbeat_off_writes_no_record(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix)
    try:
        service = await pool.start(heartbeat_interval=0)
        assert service.worker_id is None
        assert await service.workers() == []
    finally:
        await pool.aclose()


async def test_history_counts_handled_failed_and_lateness(redis_url: str, prefix: str, wait_for):
    pool = ServicePool(redis_url, prefix, retry_attempts=0)
    try:
        service = pool.make(history_interval=0.1)
        service.add_handler(Beat, _handle, concurrency=4)
        await service.start()
        await service.enqueue_many([Beat(id=f"ok-{i}") for i in range(5)])
        await service.enqueue_with_delay(Beat(id="bad", fail=True))

        async def recorded() -> EventService | None:
            points = await service.history("wh-beat")
            return points if sum(p.handled for p in points) == 5 else None

        points = await wait_for(recorded, timeout=10)
        assert len(points) == MINUTE_SLOTS
        assert sum(p.failed for p in points) == 1
        busy = [p for p in points if p.handled]
        assert busy and all(p.lateness_p50 is not None for p in busy)
        assert all(0 <= p.lateness_p99 < 60 for p in busy)  # type: ignore[operator]
        day = await service.history("wh-beat", "day")
        assert len(day) == COARSE_SLOTS and sum(p.handled for p in day) == 5
        # bounded: one field per ring slot at most
        redis = service.store.redis
        assert await redis.hlen(service.store.keys.history("wh-beat", "minute")) <= MINUTE_SLOTS
        assert await redis.hlen(service.store.keys.history("wh-beat", "coarse")) <= COARSE_SLOTS
    finally:
        await pool.aclose()


async def test_history_from_two_processes_adds_up(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix)
    try:
        a, b = pool.producer(), pool.producer()
        for service, n in ((a, 3), (b, 4)):
            recorder = HistoryRecorder()
            recorder.increment("succeeded", n, event_type="wh-beat")
            recorder.gauge("lateness_ms", 7.0, event_type="wh-beat")
            from delayq.runtime.history import HistoryWriter

            writer = HistoryWriter(service.store, recorder, 10)
            await writer.flush()
            await writer.flush()  # nothing new: nothing sent
        points = await a.history("wh-beat")
        assert sum(p.handled for p in points) == 7
    finally:
        await pool.aclose()


async def test_cancelled_runs_add_up_with_slots_written_without_the_column(
    redis_url: str, prefix: str
):
    # a process that counted no cancelled run writes the slot as before the column was
    # added (as an older worker does): the merge keeps the column and the counts add up
    import msgspec

    from delayq.runtime.history import CANCELLED_COLUMN, HistoryWriter

    pool = ServicePool(redis_url, prefix)
    try:
        service = pool.producer()
        ring = service.store.keys.history("wh-beat", "minute")

        async def widths() -> set[int]:
            slots = (await service.store.redis.hgetall(ring)).values()
            return {len(msgspec.msgpack.decode(v)) for v in slots}

        for handled, cancelled in ((4, 0), (3, 2), (0, 1)):
            recorder = HistoryRecorder()
            if handled:
                recorder.increment("succeeded", handled, event_type="wh-beat")
            recorder.lateness_row("wh-beat")[CANCELLED_COLUMN] += cancelled
            await HistoryWriter(service.store, recorder, 10).flush()
            if not cancelled and handled:  # [period, handled, failed, buckets]: as before
                assert await widths() == {1 + CANCELLED_COLUMN}
        assert 2 + CANCELLED_COLUMN in await widths()
        for window in ("hour", "day"):
            points = await service.history("wh-beat", window)
            assert sum(p.handled for p in points) == 7
            assert sum(p.cancelled for p in points) == 3
            assert sum(p.failed for p in points) == 0
    finally:
        await pool.aclose()


def test_percentile_and_observe_take_over_from_the_gauge():
    r = HistoryRecorder()
    r.gauge("lateness_ms", 3, event_type="t")
    r.observe("lateness", 0.003, event_type="t")
    r.gauge("lateness_ms", 3, event_type="t")  # ignored once observe is used
    (row,) = r.take().values()
    assert sum(row[2:]) == 2
    assert percentile([0] * 19, 0.5) is None
    buckets = [0] * 19
    buckets[2] = 10  # 2..5 ms
    assert 2 <= percentile(buckets, 0.5) <= 5  # type: ignore[operator]


async def test_concurrent_loops_end_on_close(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix)
    try:
        service = await pool.start(heartbeat_interval=0.05, history_interval=0.05)
        await asyncio.sleep(0)
        await asyncio.wait_for(service.aclose(), timeout=10)
    finally:
        await pool.aclose()
