"""A producer base for adapters of asyncio libraries: one event loop, gathered enqueues."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from . import _common as c


class AsyncAdapter(c.Adapter):
    """Runs the producer's coroutines on a private event loop."""

    loop: asyncio.AbstractEventLoop

    def setup(self) -> None:
        """Create the loop and connect (see :meth:`connect`)."""
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.connect())

    def teardown(self) -> None:
        """Disconnect and close the loop."""
        self.loop.run_until_complete(self.disconnect())
        self.loop.close()

    async def connect(self) -> None:
        """Open the producer's connections."""

    async def disconnect(self) -> None:
        """Close the producer's connections."""

    async def enqueue_one(self, event_id: str, delay: float, payload: str) -> None:
        """Enqueue one event (``delay`` <= 0: run now)."""
        raise NotImplementedError

    def enqueue(self, items: Sequence[tuple[str, float]], payload: str = "") -> list[float]:
        """The batch's enqueue calls run concurrently (like a busy web app's requests)."""
        now = time.time()

        async def go() -> None:
            await asyncio.gather(*(self.enqueue_one(i, d, payload) for i, d in items))

        self.loop.run_until_complete(go())
        return [now + max(0.0, d) for _, d in items]


async def handle(event_id: str) -> None:
    """The benchmark handler: record the start; crash events never finish."""
    c.REC.record(event_id)
    if c.is_crash(event_id):
        await asyncio.sleep(3600)


async def run_until_term(
    start: Callable[[], Awaitable[Any]], stop: Callable[[], Awaitable[Any]]
) -> None:
    """Start a worker, wait for SIGTERM/SIGINT, stop it."""
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    await start()
    await done.wait()
    await stop()
