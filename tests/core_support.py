"""Helpers shared by the core behaviour tests (issue 2): services, recorders, raw Redis access.

Imported by the ``test_*`` modules as ``core_support`` (pytest puts ``tests/`` on ``sys.path``).
It defines no ``Event`` classes, so importing it twice under different names is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from delayq import EventService, current_delivery, event_context
from delayq.keys import TypeKeys

# Short timings keep the tests fast; each test overrides what it is about.
FAST: dict[str, Any] = {
    "visibility_timeout": 2.0,
    "scheduling_interval": 0.2,
    "lock_timeout": 1.0,
    "polling_timeout": 1.0,
    "shutdown_grace": 2.0,
}


class ServicePool:
    """Creates EventServices (each with its own clients) on one prefix and closes them all."""

    def __init__(self, url: str, prefix: str, **defaults: Any):
        self.url = url
        self.prefix = prefix
        self.defaults = {**FAST, **defaults}
        self.services: list[EventService] = []

    def make(self, url: str | None = None, **options: Any) -> EventService:
        """An unstarted service (a producer, or one to start later)."""
        service = EventService.from_url(
            url or self.url, prefix=self.prefix, **{**self.defaults, **options}
        )
        self.services.append(service)
        return service

    async def start(self, url: str | None = None, **options: Any) -> EventService:
        """A started service."""
        service = self.make(url, **options)
        await service.start()
        return service

    def producer(self, **options: Any) -> EventService:
        """An unstarted service that never runs the scheduler (a producer-only process)."""
        return self.make(enable_scheduling=False, **options)

    async def aclose(self) -> None:
        """Close every service made here (in reverse order)."""
        for service in reversed(self.services):
            await service.aclose()
        self.services.clear()


class Recorder:
    """An async handler that records every delivery it sees.

    ``behaviour`` (optional, async) is awaited with the event inside the handler; its return
    value is the handler's (so it can return False or raise to ask for a retry).
    """

    def __init__(self, behaviour: Callable[[Any], Awaitable[Any]] | None = None):
        self.behaviour = behaviour
        self.events: list[Any] = []
        self.deliveries: list[Any] = []
        self.contexts: list[dict[str, str]] = []
        self.counts: Counter[str] = Counter()
        self.running = 0
        self.max_running = 0
        self.started = 0
        self.finished = 0

    async def __call__(self, event: Any) -> Any:
        self.started += 1
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.events.append(event)
        self.deliveries.append(current_delivery())
        self.contexts.append(dict(event_context()))
        self.counts[event.id] += 1
        try:
            if self.behaviour is not None:
                return await self.behaviour(event)
            return None
        finally:
            self.running -= 1
            self.finished += 1

    @property
    def ids(self) -> list[str]:
        """Ids in delivery order."""
        return [e.id for e in self.events]

    def handled(self, n: int) -> Callable[[], bool]:
        """A predicate for wait_for: at least ``n`` deliveries finished."""
        return lambda: self.finished >= n


def keys_of(prefix: str, type_name: str) -> TypeKeys:
    """The Redis keys of one event type under ``prefix``."""
    return TypeKeys(prefix, type_name)


async def redis_time_ms(client: aioredis.Redis) -> int:
    """Redis's clock in ms."""
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def prefix_keys(client: aioredis.Redis, prefix: str) -> list[bytes]:
    """Every key whose name contains the prefix's hash tag."""
    return sorted(await client.keys(f"{{{prefix}*"))


async def drained(service: EventService, event_type: type) -> bool:
    """True when no event of ``event_type`` is scheduled, ready or in flight."""
    c = await service.stats_for(event_type)
    return c.scheduled == 0 and c.ready == 0 and c.in_flight == 0


async def blocked_clients(client: aioredis.Redis, command: str = "brpop") -> list[dict[str, Any]]:
    """CLIENT LIST entries whose current command is ``command``."""
    clients = await client.client_list()
    return [c for c in clients if c.get("cmd") == command]


async def cancel_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for it, ignoring its outcome."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


async def run_cli(
    monkeypatch: Any, capsys: Any, url: str, prefix: str, *args: str
) -> tuple[int, str]:
    """``delayq ARGS`` against ``url`` and ``prefix``, in a thread (the command runs its own
    event loop): its exit code and what it printed (stdout, then stderr)."""
    import anyio.to_thread

    from delayq.cli.app import main as cli_main

    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("DELAYQ_PREFIX", prefix)

    def call() -> tuple[int, str]:
        code = cli_main(list(args))
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    return await anyio.to_thread.run_sync(call)
