"""Bulk scheduling from Apache Spark, and queue state read back as a DataFrame.

Install with ``pip install "delayq[spark]"``. Three functions:

* :func:`enqueue_dataframe` turns every row of a DataFrame into one event and
  schedules it from the executors, partition by partition, with pipelined
  calls of the very Lua ``enqueue`` script :class:`~delayq.EventService` uses.
  The dedup rule is therefore the same: re-running a job keeps the events that
  already exist (unless ``replace=True``), so it never creates duplicates.
* :func:`stream_sink` is the same for Structured Streaming
  (``writeStream.foreachBatch``): each row's event is scheduled once per
  (sink, micro-batch, row id), even when Spark replays a batch whose events
  were already handled (a ledger written by the same script as the events).
* :func:`read_queue` reads scheduled, ready, in-flight and dead events into a
  DataFrame, in parallel by type, state and index range.

Executors have no event loop, so they talk to Redis with the synchronous
``redis.Redis`` (or ``redis.cluster.RedisCluster``) client; every key of one
event type shares one hash tag, so each script call goes to one cluster node.

The event class travels to the executors inside Spark's task closure, pickled
by reference: it must be importable there (install the package that defines it
in the executors' Python, see ``docs/SPARK.md``). Event payloads themselves are
msgspec JSON or MessagePack, never pickle.

``python -m delayq.spark reconcile ...`` runs the reconciliation example job
(see :mod:`delayq.spark.demo`).

This package needs a classic (non-Connect) SparkSession: it uses RDDs. Its
modules: ``enqueue`` (rows to events, on the driver: ``plan`` checks the arguments and
picks the columns, ``report`` is what it returns), ``validate`` and
``write`` (its two passes, on the executors), ``stream`` (the streaming sink), ``read`` (queue state to rows),
``clients`` (executor-side Redis clients and the enqueue script), ``schemas``
and ``demo`` (the example job).
"""

from __future__ import annotations

from .enqueue import EnqueueReport, enqueue_dataframe
from .read import read_queue
from .schemas import QUEUE_SCHEMA, REJECTS_SCHEMA, STATES
from .stream import StreamSink, stream_sink

__all__ = [
    "QUEUE_SCHEMA",
    "REJECTS_SCHEMA",
    "STATES",
    "EnqueueReport",
    "StreamSink",
    "enqueue_dataframe",
    "read_queue",
    "stream_sink",
]
