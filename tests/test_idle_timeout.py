"""Consumers block for less than Redis's idle ``timeout`` (see ``store.deliveries.limit_block``).

Redis closes a connection idle for longer than its ``timeout``. A client blocked in BRPOP is
exempt, but not one an enqueue has just unblocked, until its reply is written: a BRPOP
issued longer ago than ``timeout`` could lose the entry it popped to the idle check (the
event then waited for its lease). tests/faults/test_fault_dropped_connections.py runs the
fault; these check what the service reads and chooses.
"""

from __future__ import annotations

import logging

import pytest
import redis

from delayq import Event, EventService


class Tick(Event, event_name="idle-tick"):
    pass


async def _block(url: str, prefix: str, polling: float) -> float:
    service = EventService.from_url(url, prefix=prefix, polling_timeout=polling)

    async def handle(event: Tick) -> None:
        pass

    service.add_handler(Tick, handle)
    async with service:
        return service._store.deliveries._block_at_most


@pytest.mark.parametrize(
    ("timeout", "polling", "expected"),
    [("1", 5.0, 0.5), ("3", 5.0, 2.5), ("3", 1.0, float("inf")), ("0", 5.0, float("inf"))],
)
async def test_the_block_time_stays_under_the_servers_idle_timeout(
    redis_server_factory, prefix: str, timeout: str, polling: float, expected: float
) -> None:
    server = redis_server_factory({"timeout": timeout})
    assert await _block(server.url, prefix, polling) == expected


async def test_without_config_the_block_time_is_kept(
    redis_server_factory, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = redis_server_factory({"timeout": "1"})
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-config")
    admin.close()
    url = server.url.replace("redis://", "redis://app:pw@")
    with caplog.at_level(logging.INFO, logger="delayq"):
        assert await _block(url, prefix, 5.0) == float("inf")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "idle" in r.message]
