"""The application ``benchmarks/worker_cli.py`` runs with ``delayq worker``: a no-op handler."""

from __future__ import annotations

import os

from delayq import Event, EventService


class BenchJob(Event, event_name="cli-bench"):
    """An event with nothing to do."""


service = EventService.from_url(
    os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
    prefix=os.environ.get("DELAYQ_PREFIX", "delayq"),
)


async def handle(event: BenchJob) -> None:
    return None


service.add_handler(BenchJob, handle, concurrency=256)
