"""dramatiq adapter: ``RedisBroker``, an actor sent with ``delay``, one ``Worker`` per process.

dramatiq's worker fetches delayed messages early and holds them in memory
until their ETA, checking every ``worker_timeout`` ms (default 1000). The
``worker_timeout=100`` variant is that documented knob turned down.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.worker import Worker

from . import _common as c


def bench(event_id: str, payload: str = "") -> None:
    """The actor every workload sends to."""
    c.REC.record(event_id)
    if c.is_crash(event_id):
        time.sleep(3600)


def declare(url: str, types: int = 1) -> tuple[RedisBroker, Any]:
    """The broker and the actors (extra types are extra actors on the same queue)."""
    broker = RedisBroker(url=url)
    dramatiq.set_broker(broker)
    actor = dramatiq.actor(bench, queue_name="bench", actor_name="bench", broker=broker)
    for k in range(1, types):
        dramatiq.actor(bench, queue_name="bench", actor_name=f"bench_idle_{k}", broker=broker)
    return broker, actor


class DramatiqAdapter(c.Adapter):
    """dramatiq with the Redis broker; default threads (8) per worker process."""

    library = "dramatiq"
    distributions = ("dramatiq",)
    variants = {"default": {}, "worker_timeout=100": {"worker_timeout": 100}}

    def setup(self) -> None:
        """The producer's broker and actor."""
        self.broker, self.actor = declare(self.url)

    def teardown(self) -> None:
        """Close the broker."""
        self.broker.close()

    def enqueue(self, items: Any, payload: str = "") -> list[float]:
        """``send_with_options(delay=ms)`` per message."""
        dues = []
        for event_id, delay in items:
            now = time.time()
            if delay > 0:
                self.actor.send_with_options(args=(event_id, payload), delay=round(delay * 1000))
            else:
                self.actor.send(event_id, payload)
            dues.append(now + max(0.0, delay))
        return dues

    def describe(self, workload: str, params: dict[str, Any]) -> list[str]:
        """Settings used."""
        return [f"Worker(broker, worker_threads=8 (default), {self.options or 'defaults'})"]

    def run_worker(self, concurrency: int, types: int) -> None:
        """One dramatiq ``Worker`` until SIGTERM."""
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        broker, _ = declare(self.url, types)
        worker = Worker(broker, **self.options)
        worker.start()
        done.wait()
        worker.stop(timeout=2000)


if __name__ == "__main__":
    c.main(DramatiqAdapter)
