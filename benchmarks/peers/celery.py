"""Celery adapter: ``apply_async(countdown=...)`` on the Redis transport, a prefork worker.

Celery's worker takes a delayed (ETA) task off Redis at once and holds it in
memory until it is due, which is why it is on time and why a crash loses it
(``acks_late`` is off by default). The worker runs with its defaults
(prefork pool, concurrency = number of CPUs), log level WARNING.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from celery import Celery

from . import _common as c

URL_ENV = "BENCH_REDIS_URL"
app = Celery("bench", broker=os.environ.get(URL_ENV, "redis://127.0.0.1:1"))
app.conf.task_default_queue = "bench"


@app.task(name="bench")
def bench(event_id: str, payload: str = "") -> None:
    """The task every workload sends."""
    c.REC.record(event_id)
    if c.is_crash(event_id):
        time.sleep(3600)


for _k in range(1, 30):
    app.task(name=f"bench_idle_{_k}")(bench.run)


class CeleryAdapter(c.Adapter):
    """Celery with the Redis broker."""

    library = "celery"
    distributions = ("celery", "kombu")

    def __init__(self, url: str, variant: str):
        super().__init__(url, variant)
        os.environ[URL_ENV] = url
        app.conf.broker_url = url

    def teardown(self) -> None:
        """Release the producer's broker connections."""
        app.close()

    def enqueue(self, items: Any, payload: str = "") -> list[float]:
        """``apply_async`` per task, ``countdown`` for delayed ones."""
        dues = []
        for event_id, delay in items:
            now = time.time()
            if delay > 0:
                bench.apply_async((event_id, payload), countdown=delay, task_id=event_id)
            else:
                bench.apply_async((event_id, payload), task_id=event_id)
            dues.append(now + max(0.0, delay))
        return dues

    def describe(self, workload: str, params: dict[str, Any]) -> list[str]:
        """Settings used."""
        return ["celery worker defaults (prefork, concurrency = CPUs = 2, prefetch x4)"]

    def worker_argv(self, concurrency: int, types: int) -> list[str]:
        """``celery -A benchmarks.peers.celery worker``."""
        return [
            sys.executable, "-m", "celery", "-A", "benchmarks.peers.celery", "worker",
            "--loglevel", "WARNING", "--without-mingle", "--without-gossip",
            "-n", f"bench{os.urandom(3).hex()}@%h",
        ]  # fmt: skip


if __name__ == "__main__":
    c.main(CeleryAdapter)
