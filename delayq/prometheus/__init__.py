"""Prometheus metrics for delayq (``pip install 'delayq[prometheus]'``).

* :class:`PrometheusMetrics`: pass it as ``EventService(metrics=...)``; counts
  and times what this process does.
* :class:`QueueDepthCollector`: the queue depth under a prefix, the live
  workers and their handler slots (busy vs capacity), and the batches not done
  yet, read from Redis at scrape time (cached a few seconds).
* :func:`make_asgi_app`: a ``/metrics`` ASGI app to mount in FastAPI or
  Starlette; :func:`serve`: a small ``/metrics`` server for worker processes.

docs/OBSERVABILITY.md lists every metric, with alert examples and a Grafana
dashboard.
"""

from .app import MetricsApp, MetricsServer, make_asgi_app, serve
from .depth import (
    QueueDepthCollector,
    read_batches,
    read_depth,
    read_group_depth,
    read_workers,
)
from .sink import DURATION_BUCKETS, LONG_BUCKETS, PrometheusMetrics

__all__ = [
    "DURATION_BUCKETS",
    "LONG_BUCKETS",
    "MetricsApp",
    "MetricsServer",
    "PrometheusMetrics",
    "QueueDepthCollector",
    "make_asgi_app",
    "read_batches",
    "read_depth",
    "read_group_depth",
    "read_workers",
    "serve",
]
