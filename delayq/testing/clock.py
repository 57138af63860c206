"""Time travel on the real server: :func:`advance` moves a service's clock forward.

delayq compares every due time with Redis's clock inside its scripts, so moving time
means moving that clock for the service under test: :func:`advance` raises the store's
clock offset (the scripts are sent again with the offset in their source, see
:mod:`delayq.lua.shift`) and wakes the loops whose sleeps were computed from the old
time. Nothing sleeps and nothing is mocked: the same scripts run on the same server,
with a later "now". docs/TESTING.md lists what moves and what does not.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from ..durations import delay_ms, due_unix_ms

if TYPE_CHECKING:
    from ..runtime.runtime import Runtime
    from ..service import EventService

__all__ = ["advance", "now"]


async def now(service: EventService) -> datetime:
    """The service's clock (Redis's, plus what :func:`advance` added) as an aware UTC datetime."""
    return _utc(await service.store.browsing.server_time_ms())


async def advance(service: EventService, by: timedelta | float | datetime) -> datetime:
    """Move ``service``'s clock forward ``by`` (a ``timedelta`` or seconds), or to ``by``
    (an aware ``datetime``); return the new time.

    Everything the service compares with Redis's clock behaves as if that much time had
    passed: due events and retries become due, leases of running handlers run out (as if
    the process had stalled), debounce windows, ``unique_for`` marks and rate-limit
    buckets move on, and schedules fire their missed slots per their catch-up policy. A
    started service's scheduler, schedule firer and flow-limit waits look again at once;
    due work then runs as it would (``await drain(service)`` waits for it). Only this
    service's clock moves: other services and processes on the same prefix keep Redis's
    own (give a test one service). Raises ``ValueError`` for a time in the past.
    """
    store = service.store
    current = await store.browsing.server_time_ms()
    if isinstance(by, datetime):
        target = due_unix_ms(by)
        if target < current:
            raise ValueError(
                f"advance() moves the clock forward only: {by.isoformat()} is "
                f"{_utc(current) - _utc(target)} before the service's clock ({_utc(current)})"
            )
        step = target - current
    else:
        try:
            step = delay_ms(by, "advance()'s step")
        except ValueError:
            raise ValueError(
                f"advance() moves the clock forward only, by a finite step >= 0: not {by!r}"
            ) from None
    if step:
        store.set_clock_offset(store.clock_offset_ms + step)
    loops = runtime_of(service)
    if service.is_running:
        loops.clock_moved()
    return _utc(current + step)


def runtime_of(service: EventService) -> Runtime:
    """The service's loops (the kit looks at them; the service keeps them private)."""
    return service._runtime


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)
