"""rq adapter: ``enqueue_in`` and a ``Worker`` with its built-in scheduler.

rq's default ``Worker`` forks a work horse per job and runs one job at a time;
a second process is a second worker. Its scheduler (``with_scheduler=True``)
checks every second and scores jobs in whole seconds. The worker's per-job
INFO logging is turned down to WARNING, as for every library here.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from redis import Redis
from rq import Queue, Worker

from . import _common as c

JOB = "benchmarks.peers.rq.bench"


def bench(event_id: str, payload: str = "") -> None:
    """The job every workload enqueues (imported by name in the work horse)."""
    c.REC.record(event_id)
    if c.is_crash(event_id):
        time.sleep(3600)


class RqAdapter(c.Adapter):
    """rq on one queue."""

    library = "rq"
    distributions = ("rq",)

    def setup(self) -> None:
        """The queue."""
        self.redis = Redis.from_url(self.url)
        self.queue = Queue("bench", connection=self.redis)

    def teardown(self) -> None:
        """Close the connection."""
        self.redis.close()

    def enqueue(self, items: Any, payload: str = "") -> list[float]:
        """``enqueue_in`` per delayed job; ``enqueue_many`` (one pipeline) for due-now batches."""
        if all(d <= 0 for _, d in items):
            now = time.time()
            self.queue.enqueue_many(
                [Queue.prepare_data(JOB, (i, payload), job_id=i) for i, _ in items]
            )
            return [now] * len(items)
        dues = []
        for event_id, delay in items:
            now = time.time()
            if delay > 0:
                self.queue.enqueue_in(
                    timedelta(seconds=delay), JOB, event_id, payload, job_id=event_id
                )
            else:
                self.queue.enqueue(JOB, event_id, payload, job_id=event_id)
            dues.append(now + max(0.0, delay))
        return dues

    def describe(self, workload: str, params: dict[str, Any]) -> list[str]:
        """Settings used."""
        return ["Worker (fork per job, one job at a time per process), with_scheduler=True"]

    def run_worker(self, concurrency: int, types: int) -> None:
        """One rq worker with its scheduler (``types`` is moot: one queue, any function)."""
        redis = Redis.from_url(self.url)
        worker = Worker([Queue("bench", connection=redis)], connection=redis)
        worker.work(with_scheduler=True, logging_level="WARNING")


if __name__ == "__main__":
    c.main(RqAdapter)
