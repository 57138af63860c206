"""How a failing background loop waits before it tries again (the scheduler, the
partitions' spread, the schedule firer).

A loop that retries at once loops without waiting for anything: it holds up the whole
process, or hammers Redis. One that sleeps its whole backoff resumes late after Redis
comes back. So: the backoff, cut short by the loop's wake-up event (set when its
subscription is back, among others), but never before :data:`MIN_RETRY`.
"""

from __future__ import annotations

import anyio

__all__ = ["MIN_RETRY", "wait_to_retry"]

MIN_RETRY = 0.1
"""Seconds a failed pass waits at least, whatever wakes its loop meanwhile."""


async def wait_to_retry(wake: anyio.Event, backoff: float) -> None:
    """Wait ``backoff`` seconds, or until ``wake`` is set once :data:`MIN_RETRY` has passed."""
    first = min(backoff, MIN_RETRY)
    await anyio.sleep(first)
    with anyio.move_on_after(backoff - first):
        await wake.wait()
