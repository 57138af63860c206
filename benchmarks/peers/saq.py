"""saq adapter: a Redis ``Queue`` and a ``Worker`` with its documented defaults.

saq moves scheduled jobs every ``timers["schedule"]`` seconds (default 1).
That timer is also the TTL of a ``SETEX`` lock, so Redis refuses anything
below one whole second: there is no faster documented setting to try.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from saq import Queue, Worker

from . import _aio
from . import _common as c


async def bench(ctx: dict[str, Any], *, event_id: str, payload: str = "") -> None:
    """The job every workload enqueues."""
    await _aio.handle(event_id)


class SaqAdapter(_aio.AsyncAdapter):
    """saq on one Redis queue."""

    library = "saq"
    distributions = ("saq",)

    async def connect(self) -> None:
        """A saq queue on the benchmark Redis."""
        self.queue = Queue.from_url(self.url, name="bench")
        await self.queue.connect()

    async def disconnect(self) -> None:
        """Close the queue."""
        await self.queue.disconnect()

    async def enqueue_one(self, event_id: str, delay: float, payload: str) -> None:
        """``enqueue`` with ``scheduled`` = epoch seconds (saq's own unit)."""
        await self.queue.enqueue(
            "bench",
            key=event_id,
            scheduled=time.time() + delay if delay > 0 else 0,
            event_id=event_id,
            payload=payload,
        )

    def describe(self, workload: str, params: dict[str, Any]) -> list[str]:
        """Settings used."""
        return ["Worker(concurrency=concurrency), default timers (schedule 1 s, sweep 60 s)"]

    def run_worker(self, concurrency: int, types: int) -> None:
        """One saq ``Worker``; extra types are extra registered function names."""

        async def main() -> None:
            queue = Queue.from_url(self.url, name="bench")
            functions: list[Any] = [("bench", bench)]
            functions += [(f"bench_idle_{k}", bench) for k in range(1, types)]
            worker = Worker(queue, functions=functions, concurrency=concurrency, **self.options)
            await worker.start()  # returns on SIGTERM (saq installs its own handlers)

        asyncio.run(main())


if __name__ == "__main__":
    c.main(SaqAdapter)
