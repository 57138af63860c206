"""Mixed-version deploys: the stored-data format under a prefix (delayq/storage/format.py).

A service records its format at its first start; one that meets a newer format refuses to
start with both numbers in the message, one that meets an older format it still reads runs,
and enqueueing never touches the key. Against a real Redis.
"""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from delayq import Event, EventService, FormatVersionError
from delayq.storage import format as fmt


class Ping(Event, event_name="format-ping"):
    pass


async def _noop(event: Ping) -> None:
    return None


def _service(redis_url: str, prefix: str) -> EventService:
    service = EventService.from_url(redis_url, prefix=prefix, heartbeat_interval=0)
    service.add_handler(Ping, _noop)
    return service


async def test_the_first_start_records_the_format(
    redis_client: aioredis.Redis, redis_url: str, prefix: str
) -> None:
    key = fmt.format_key(prefix)
    service = _service(redis_url, prefix)
    await service.enqueue_with_delay(Ping(id="p-1"), 60)
    assert await redis_client.get(key) is None  # enqueueing (the per-event path) never reads it
    async with service:
        assert await redis_client.get(key) == str(fmt.FORMAT).encode()
    async with _service(redis_url, prefix):  # a second start reads it and runs
        pass


async def test_a_newer_format_is_refused_naming_both(
    redis_client: aioredis.Redis, redis_url: str, prefix: str
) -> None:
    await redis_client.set(fmt.format_key(prefix), fmt.FORMAT + 1)
    service = _service(redis_url, prefix)
    try:
        with pytest.raises(FormatVersionError) as caught:
            await service.start()
        message = str(caught.value)
        assert f"format {fmt.FORMAT + 1}" in message and f"format {fmt.FORMAT})" in message
        assert repr(prefix) in message
        assert not service.is_running
    finally:
        await service.aclose()
    assert await redis_client.get(fmt.format_key(prefix)) == str(fmt.FORMAT + 1).encode()


async def test_an_older_format_it_reads_is_accepted_and_kept(
    redis_client: aioredis.Redis, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release whose format is 2 and that still reads 1 (as the next format change will be,
    with its migration) runs on data in format 1 and leaves the number as it is."""
    monkeypatch.setattr(fmt, "FORMAT", 2)
    monkeypatch.setattr(fmt, "OLDEST_READ", 1)
    await redis_client.set(fmt.format_key(prefix), 1)
    async with _service(redis_url, prefix) as service:
        assert service.is_running
    assert await redis_client.get(fmt.format_key(prefix)) == b"1"


async def test_a_format_older_than_it_reads_is_refused(
    redis_client: aioredis.Redis, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fmt, "FORMAT", 3)
    monkeypatch.setattr(fmt, "OLDEST_READ", 2)
    await redis_client.set(fmt.format_key(prefix), 1)
    service = _service(redis_url, prefix)
    try:
        with pytest.raises(FormatVersionError, match=r"format 1, older .* \(formats 2 to 3\)"):
            await service.start()
    finally:
        await service.aclose()


async def test_a_foreign_value_is_refused(
    redis_client: aioredis.Redis, redis_url: str, prefix: str
) -> None:
    await redis_client.set(fmt.format_key(prefix), "v2")
    service = _service(redis_url, prefix)
    try:
        with pytest.raises(FormatVersionError, match="not a stored-data format number"):
            await service.start()
    finally:
        await service.aclose()


async def test_on_a_cluster_the_check_runs_on_the_prefix_slot(cluster, prefix: str) -> None:
    service = EventService.from_url(cluster.url, cluster=True, prefix=prefix, heartbeat_interval=0)
    service.add_handler(Ping, _noop)
    async with service:
        client = aioredis.RedisCluster.from_url(cluster.url)
        try:
            assert await client.get(fmt.format_key(prefix)) == str(fmt.FORMAT).encode()
            await client.set(fmt.format_key(prefix), fmt.FORMAT + 1)
        finally:
            await client.aclose()
    refused = EventService.from_url(cluster.url, cluster=True, prefix=prefix)
    try:
        with pytest.raises(FormatVersionError):
            await refused.start()
    finally:
        await refused.aclose()
