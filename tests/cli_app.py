"""The application the CLI tests run with ``delayq worker cli_app:service``.

Configured by environment variables: REDIS_URL, DELAYQ_PREFIX, CLI_GRACE (shutdown_grace), CLI_RETRIES (retry_attempts),
CLI_CONCURRENCY. Each handled event is recorded in the queue's Redis under
``{prefix}-done`` (a HASH id -> times handled), so tests can check every event ran.
"""

from __future__ import annotations

import asyncio
import os

from delayq import Event, EventService, fixed


class CliJob(Event, event_name="cli-job"):
    """A test event: sleeps ``sleep_ms``; fails when ``fail`` is set."""

    n: int = 0
    sleep_ms: int = 0
    fail: bool = False


PREFIX = os.environ.get("DELAYQ_PREFIX", "delayq")
service = EventService.from_url(
    os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
    prefix=PREFIX,
    shutdown_grace=float(os.environ.get("CLI_GRACE", "10")),
    polling_timeout=1.0,
    scheduling_interval=0.2,
    retry_attempts=int(os.environ.get("CLI_RETRIES", "3")),
    retry_backoff=fixed(0.05),
)


async def handle(event: CliJob) -> None:
    if event.sleep_ms:
        await asyncio.sleep(event.sleep_ms / 1000)
    if event.fail:
        raise RuntimeError(f"planned failure of {event.id}")
    await service.store.redis.hincrby(f"{PREFIX}-done", event.id, 1)


service.add_handler(CliJob, handle, concurrency=int(os.environ.get("CLI_CONCURRENCY", "32")))


def make_service() -> EventService:
    """For --factory."""
    return service


async def make_service_async() -> EventService:
    """For --factory, async."""
    return service


not_a_service = 42
