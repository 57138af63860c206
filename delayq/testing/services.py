"""A service for one test: its own prefix, a recorder for ``drain``, its keys removed after."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis

from ..keyspace.groups import stored_group
from ..service import EventService
from .clock import runtime_of
from .recording import Recorder

__all__ = ["TEST_OPTIONS", "isolated_service"]

TEST_OPTIONS: dict[str, Any] = {
    "heartbeat_interval": 0,
    "history_interval": 0,
    "shutdown_grace": 1.0,
}
"""Options a test service starts with unless given others: no heartbeat records, no
history rings (nothing a test reads), handlers get 1 s to finish at the end."""


@contextlib.asynccontextmanager
async def isolated_service(url: str, **options: Any) -> AsyncIterator[EventService]:
    """A started :class:`~delayq.EventService` on ``url`` for one test; closed, and every key
    under its prefix removed, on exit.

    ``options`` are ``EventService`` options over :data:`TEST_OPTIONS`; the prefix is
    unique (``dq-test-`` and 8 hex digits) unless given. Its tracing is a
    :class:`~delayq.testing.Recorder` (around a ``tracing`` given here), which
    :func:`~delayq.testing.drain` reads. Handlers added to it start at once.
    """
    opts = {**TEST_OPTIONS, "prefix": f"dq-test-{uuid.uuid4().hex[:8]}", **options}
    inner = opts.get("tracing")
    recorder = Recorder(None if inner in (None, False) else inner)
    opts["tracing"] = recorder
    service = EventService.from_url(url, **opts)
    consumers = runtime_of(service).consumers

    def most(type_name: str, group: str) -> int | None:
        consumer = consumers.get((type_name, stored_group(group)))
        return None if consumer is None else consumer.max_deliveries

    recorder.max_deliveries = most
    try:
        await service.start()
        yield service
    finally:
        await service.aclose()
        await remove_keys(url, service.options.prefix)


async def remove_keys(url: str, prefix: str) -> int:
    """Delete every key of ``prefix`` (``{prefix}:...`` and ``{prefix:Type...}:...``) on the
    Redis at ``url``; how many there were."""
    client = aioredis.Redis.from_url(url, protocol=2)
    removed = 0
    try:
        for pattern in (_glob(f"{{{prefix}}}") + "*", _glob(f"{{{prefix}:") + "*"):
            batch: list[bytes] = []
            async for key in client.scan_iter(match=pattern, count=500):
                batch.append(key)
                if len(batch) >= 500:
                    removed += await client.unlink(*batch)
                    batch = []
            if batch:
                removed += await client.unlink(*batch)
    finally:
        await client.aclose()
    return removed


def _glob(text: str) -> str:
    """``text`` as a literal SCAN MATCH pattern."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)
