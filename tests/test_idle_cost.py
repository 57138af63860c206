"""An idle service sends Redis only a few commands per second (issue 2, behaviour 6).

Counted with MONITOR on a raw socket: it shows what clients send (one line per command,
pipelined ones included) and marks commands run inside scripts as ``[... lua]``, which are
left out. ``INFO commandstats`` would count those too.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter

import pytest
from core_support import ServicePool, blocked_clients

from delayq import Event
from delayq.testing import RedisServer


class Idle1(Event, event_name="core-idle-1"):
    """Idle type 1."""


class Idle2(Event, event_name="core-idle-2"):
    """Idle type 2."""


class Idle3(Event, event_name="core-idle-3"):
    """Idle type 3."""


class Idle4(Event, event_name="core-idle-4"):
    """Idle type 4."""


class Idle5(Event, event_name="core-idle-5"):
    """Idle type 5."""


TYPES = [Idle1, Idle2, Idle3, Idle4, Idle5]
LIMIT_PER_SECOND = 10
# +1700000000.123456 [0 127.0.0.1:54321] "EVALSHA" "abc..." ...   or   [0 lua] for scripts
_LINE = re.compile(rb'^\+\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]+)"')


async def monitor(server: RedisServer, seconds: float) -> tuple[Counter[str], float]:
    """Commands sent by clients (not by scripts) during ``seconds``, by name."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(b"MONITOR\r\n")
        await writer.drain()
        assert await reader.readline() == b"+OK\r\n"
        counts: Counter[str] = Counter()
        start = time.monotonic()
        deadline = start + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = await asyncio.wait_for(reader.readline(), timeout=left)
            except asyncio.TimeoutError:
                break
            match = _LINE.match(line)
            assert match, line
            source, command = match.groups()
            if source != b"lua":
                counts[command.decode().upper()] += 1
        return counts, time.monotonic() - start
    finally:
        writer.close()
        await writer.wait_closed()


async def test_idle_service_sends_few_commands(
    private_server: RedisServer, prefix: str, wait_for
) -> None:
    # default options: what a user gets
    pool = ServicePool(private_server.url, prefix)
    pool.defaults = {}
    try:
        service = await pool.start()
        for event_type in TYPES:
            service.add_handler(event_type, _never_called, concurrency=4)
        # some history, so the types exist under the prefix
        for event_type in TYPES:
            assert await service.enqueue_with_delay(event_type(id="x"), 3600)
        checker = pool.producer()

        async def idle() -> bool:
            return service.is_scheduler_leader and len(
                await blocked_clients(checker.store.redis)
            ) == len(TYPES)

        await wait_for(idle, timeout=15)
        counts, seconds = await monitor(private_server, 6.0)
    finally:
        await pool.aclose()
    total = sum(counts.values())
    rate = total / seconds
    print(
        f"\nidle service, {len(TYPES)} handler types, default options: {total} commands in "
        f"{seconds:.1f} s = {rate:.1f}/s: {dict(counts.most_common())}"
    )
    assert rate <= LIMIT_PER_SECOND, counts


async def _never_called(event: Event) -> None:
    pytest.fail(f"no event should be due: {event!r}")
