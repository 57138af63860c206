"""taskiq + taskiq-redis adapter: ``RedisStreamBroker`` and ``ListRedisScheduleSource``.

A delayed task is a one-off schedule (``schedule_by_time``) that the separate
``taskiq scheduler`` process sends when due. By default that process reloads
schedules once a minute (``--update-interval``) and checks them every second;
the ``update_interval=1`` variant reloads every second. Workers run with
``taskiq worker --workers 1 --max-async-tasks <concurrency>``.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from taskiq import TaskiqScheduler
from taskiq_redis import ListRedisScheduleSource, RedisStreamBroker

from . import _aio
from . import _common as c

URL_ENV = "BENCH_REDIS_URL"


async def bench(event_id: str, payload: str = "") -> None:
    """The task every workload sends."""
    await _aio.handle(event_id)


def declare(url: str, types: int = 1) -> tuple[Any, Any, Any, Any]:
    """Broker, the task, the schedule source and the scheduler on ``url``."""
    broker_ = RedisStreamBroker(url=url)
    task = broker_.register_task(bench, task_name="bench")
    for k in range(1, types):
        broker_.register_task(bench, task_name=f"bench_idle_{k}")
    source_ = ListRedisScheduleSource(url)
    return broker_, task, source_, TaskiqScheduler(broker_, sources=[source_])


# what the taskiq CLI imports (in worker and scheduler processes)
broker, _task, source, scheduler = declare(
    os.environ.get(URL_ENV, "redis://127.0.0.1:1"), int(os.environ.get("BENCH_TYPES", "1"))
)


class TaskiqAdapter(_aio.AsyncAdapter):
    """taskiq with taskiq-redis's stream broker (the one with acknowledgements)."""

    library = "taskiq"
    distributions = ("taskiq", "taskiq-redis")
    variants = {"default": {}, "update_interval=1": {"update_interval": 1}}
    lateness_grace = 150.0

    def __init__(self, url: str, variant: str):
        super().__init__(url, variant)
        os.environ[URL_ENV] = url

    async def connect(self) -> None:
        """Start the producer's broker and schedule source."""
        self.broker, self.task, self.source, _ = declare(self.url)
        await self.broker.startup()
        await self.source.startup()

    async def disconnect(self) -> None:
        """Shut them down."""
        await self.source.shutdown()
        await self.broker.shutdown()

    async def enqueue_one(self, event_id: str, delay: float, payload: str) -> None:
        """``kiq`` now, or ``schedule_by_time`` for a delayed task."""
        if delay > 0:
            when = datetime.now(timezone.utc) + timedelta(seconds=delay)
            await self.task.schedule_by_time(self.source, when, event_id, payload)
        else:
            await self.task.kiq(event_id, payload)

    def enqueue(self, items: Any, payload: str = "") -> list[float]:
        """As the base class, but due times from the same clock read as the schedule's."""
        now = time.time()
        super().enqueue(items, payload)
        return [now + max(0.0, d) for _, d in items]

    def describe(self, workload: str, params: dict[str, Any]) -> list[str]:
        """Settings used."""
        return [
            "RedisStreamBroker + ListRedisScheduleSource; taskiq worker --workers 1 "
            f"--max-async-tasks concurrency; taskiq scheduler {self._scheduler_flags() or '(defaults)'}"
        ]

    def _scheduler_flags(self) -> list[str]:
        interval = self.options.get("update_interval")
        return ["--update-interval", str(interval)] if interval else []

    def worker_argv(self, concurrency: int, types: int) -> list[str]:
        """``taskiq worker``, one worker process."""
        os.environ["BENCH_TYPES"] = str(types)
        return [
            sys.executable, "-m", "taskiq", "worker", "benchmarks.peers.taskiq:broker",
            "--workers", "1", "--max-async-tasks", str(concurrency), "--log-level", "WARNING",
        ]  # fmt: skip

    def helper_argvs(self) -> list[list[str]]:
        """The ``taskiq scheduler`` process that sends due schedules."""
        argv = [sys.executable, "-m", "taskiq", "scheduler", "benchmarks.peers.taskiq:scheduler"]
        return [[*argv, "--log-level", "WARNING", *self._scheduler_flags()]]


if __name__ == "__main__":
    c.main(TaskiqAdapter)
