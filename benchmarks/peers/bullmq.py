"""BullMQ (Python port) adapter: ``Queue.add`` with ``delay`` and a ``Worker`` on defaults."""

from __future__ import annotations

import asyncio
from typing import Any

from bullmq import Queue, Worker

from . import _aio
from . import _common as c


async def process(job: Any, token: str) -> None:
    """The processor of every job."""
    await _aio.handle(job.data["id"])


class BullmqAdapter(_aio.AsyncAdapter):
    """BullMQ on one queue; ``concurrency`` is BullMQ's worker option of that name."""

    library = "bullmq"
    distributions = ("bullmq",)

    async def connect(self) -> None:
        """A BullMQ ``Queue``."""
        self.queue = Queue("bench", {"connection": self.url})

    async def disconnect(self) -> None:
        """Close the queue."""
        await self.queue.close()

    async def enqueue_one(self, event_id: str, delay: float, payload: str) -> None:
        """``add`` with ``delay`` in ms and the event id as ``jobId``."""
        opts: dict[str, Any] = {"jobId": event_id}
        if delay > 0:
            opts["delay"] = round(delay * 1000)
        await self.queue.add("bench", {"id": event_id, "payload": payload}, opts)

    def describe(self, workload: str, params: dict[str, Any]) -> list[str]:
        """Settings used."""
        return [
            "Worker(concurrency=concurrency), defaults otherwise (lockDuration 30 s, "
            "stalledInterval 30 s, drainDelay 5 s); jobs kept after completion (default)"
        ]

    def run_worker(self, concurrency: int, types: int) -> None:
        """One BullMQ ``Worker`` (its processor handles every job name)."""

        async def main() -> None:
            holder: dict[str, Worker] = {}

            async def start() -> None:
                holder["w"] = Worker(
                    "bench", process, {"connection": self.url, "concurrency": concurrency}
                )

            async def stop() -> None:
                await holder["w"].close()

            await _aio.run_until_term(start, stop)

        asyncio.run(main())


if __name__ == "__main__":
    c.main(BullmqAdapter)
