"""arq adapter: ``Worker`` with its documented defaults, ``max_jobs`` as the concurrency.

Variants: ``default`` (``poll_delay`` 0.5 s) and ``poll_delay=0.05`` (arq's
documented knob for how often a worker polls the queue's sorted set).
"""

from __future__ import annotations

from typing import Any

from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker, func

from . import _aio
from . import _common as c


async def bench(ctx: dict[str, Any], event_id: str, payload: str = "") -> None:
    """The job every workload enqueues."""
    await _aio.handle(event_id)


class ArqAdapter(_aio.AsyncAdapter):
    """arq on one queue (arq's own default queue)."""

    library = "arq"
    distributions = ("arq",)
    variants = {"default": {}, "poll_delay=0.05": {"poll_delay": 0.05}}

    async def connect(self) -> None:
        """An ``ArqRedis`` pool."""
        self.pool = await create_pool(RedisSettings.from_dsn(self.url))

    async def disconnect(self) -> None:
        """Close the pool."""
        await self.pool.aclose()

    async def enqueue_one(self, event_id: str, delay: float, payload: str) -> None:
        """``enqueue_job`` with ``_defer_by`` (arq scores jobs by the producer's clock)."""
        await self.pool.enqueue_job(
            "bench", event_id, payload, _job_id=event_id, _defer_by=delay if delay > 0 else None
        )

    def describe(self, workload: str, params: dict[str, Any]) -> list[str]:
        """Settings used."""
        return [f"Worker(max_jobs=concurrency, {self.options or 'defaults'}); enqueue_job()"]

    def run_worker(self, concurrency: int, types: int) -> None:
        """One arq ``Worker``; extra types are extra registered function names."""
        functions = [func(bench, name="bench")]
        functions += [func(bench, name=f"bench_idle_{k}") for k in range(1, types)]
        worker = Worker(
            functions=functions,
            redis_settings=RedisSettings.from_dsn(self.url),
            max_jobs=concurrency,
            handle_signals=True,
            **self.options,
        )
        worker.run()


if __name__ == "__main__":
    c.main(ArqAdapter)
