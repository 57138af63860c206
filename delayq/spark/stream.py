"""stream_sink: a Structured Streaming sink (``writeStream.foreachBatch``) that schedules
one event per row, once per (sink, micro-batch, row id), across Spark's replays.

Each micro-batch runs the two passes of :func:`~delayq.spark.enqueue_dataframe`
(same column mapping, validation and rejects), but the write pass goes through
``sink_enqueue.lua``: the enqueue of an id and its entry in the sink's ledger
(``TypeKeys.sink(name)``, a ZSET id -> batch id per type partition) are one
script, so a replayed batch (driver restarted from its checkpoint), a retried
task (executor lost) or a speculative copy finds what it already wrote and
skips it, even when those events have been handled and deleted since.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import DataFrame

from ..codec import Serializer
from ..events import Event, check_event_type, validate_name
from ..keys import TypeKeys
from ..metrics import Metrics, NoopMetrics, as_metrics
from .clients import resolve_cluster
from .enqueue import run_job
from .plan import DEFAULT_MAX_PAYLOAD, plan_job
from .report import EnqueueReport

__all__ = ["StreamSink", "stream_sink"]

log = logging.getLogger("delayq.spark")

RejectsCallback = Callable[[DataFrame, int], None]
"""``on_rejects(rejects, batch_id)``: the batch's rejected rows (``id``, ``reason``, ``row_json``)."""


class StreamSink:
    """The function to pass to ``writeStream.foreachBatch``; see :func:`stream_sink`."""

    def __init__(
        self,
        event_type: type[Event],
        *,
        name: str,
        redis_url: str,
        prefix: str,
        id_col: str = "id",
        due_col: str | None = None,
        delay_col: str | None = None,
        context_cols: Sequence[str] = (),
        replace: bool = False,
        batch_size: int = 1000,
        rejects_path: str | None = None,
        on_rejects: RejectsCallback | None = None,
        on_batch: Callable[[EnqueueReport], None] | None = None,
        metrics: Metrics | None = None,
        serializer: Serializer = "msgpack",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        cluster: bool | None = None,
        priority_col: str | None = None,
    ):
        self.event_type = check_event_type(event_type)
        self.name = validate_name(name, "sink name")
        TypeKeys(prefix, self.event_type.event_name).sink(name)  # validates prefix and name
        if rejects_path is not None and on_rejects is not None:
            raise ValueError("give rejects_path or on_rejects, not both")
        self.redis_url = redis_url
        self.prefix = prefix
        self.options: dict[str, Any] = {
            "id_col": id_col,
            "due_col": due_col,
            "delay_col": delay_col,
            "context_cols": tuple(context_cols),
            "replace": replace,
            "batch_size": batch_size,
            "serializer": serializer,
            "max_payload_bytes": max_payload_bytes,
            "priority_col": priority_col,
        }
        self.rejects_path = rejects_path
        self.on_rejects = on_rejects
        self.on_batch = on_batch
        self.metrics: Metrics = NoopMetrics() if metrics is None else as_metrics(metrics)
        # asked once (INFO cluster), not once per batch
        self.cluster = resolve_cluster(redis_url, cluster)
        self.last: EnqueueReport | None = None
        """The report of the latest batch."""

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Schedule one event per row of the micro-batch ``df`` (``foreachBatch`` calls this)."""
        started = time.perf_counter()
        batch_id = int(batch_id)
        type_name = self.event_type.event_name
        job, prepared = plan_job(
            df,
            self.event_type,
            redis_url=self.redis_url,
            prefix=self.prefix,
            cluster=self.cluster,
            **self.options,
        )
        job = dataclasses.replace(job, sink=self.name, batch_id=batch_id)
        sc = df.sparkSession.sparkContext
        # names the batch's two jobs in the Spark UI
        sc.setJobDescription(f"delayq sink {self.name!r} ({type_name}) batch {batch_id}")
        path = None if self.rejects_path is None else f"{self.rejects_path}/batch={batch_id}"
        try:
            report = run_job(job, prepared, strict=False, rejects_path=path, started=started)
        finally:
            sc.setJobDescription(None)  # type: ignore[arg-type]
        try:
            if report.rejects is not None and report.rejected and self.on_rejects is not None:
                self.on_rejects(report.rejects, batch_id)
        finally:
            if report.rejects is not None:
                report.rejects.unpersist()
        self._report(report)
        self.last = report
        if self.on_batch is not None:
            self.on_batch(report)

    def _report(self, report: EnqueueReport) -> None:
        m, t = self.metrics, report.event_type
        for name, value in (
            ("sink_scheduled", report.scheduled),
            ("sink_kept", report.kept),
            ("sink_replaced", report.replaced),
            ("sink_skipped", report.skipped),
            ("sink_rejected", report.rejected),
        ):
            if value:
                m.increment(name, value, event_type=t)
        m.observe("sink_batch", report.seconds, event_type=t)
        log.info(
            "sink %r batch %s: %d rows, %d scheduled, %d kept, %d replaced, %d skipped "
            "(already written), %d rejected in %.2fs",
            self.name,
            report.batch_id,
            report.rows,
            report.scheduled,
            report.kept,
            report.replaced,
            report.skipped,
            report.rejected,
            report.seconds,
        )


def stream_sink(
    event_type: type[Event],
    *,
    name: str,
    redis_url: str,
    prefix: str,
    id_col: str = "id",
    due_col: str | None = None,
    delay_col: str | None = None,
    context_cols: Sequence[str] = (),
    replace: bool = False,
    batch_size: int = 1000,
    rejects_path: str | None = None,
    on_rejects: RejectsCallback | None = None,
    on_batch: Callable[[EnqueueReport], None] | None = None,
    metrics: Metrics | None = None,
    serializer: Serializer = "msgpack",
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
    cluster: bool | None = None,
    priority_col: str | None = None,
) -> StreamSink:
    """A ``foreachBatch`` function scheduling one ``event_type`` event per row, exactly once
    per (``name``, micro-batch, row id), across replays of a batch.

    ``stream.writeStream.foreachBatch(stream_sink(...)).option("checkpointLocation", ...)``.
    Columns, times, context, priority levels (``priority_col``), validation, dedup and
    ``replace`` are those of :func:`~delayq.spark.enqueue_dataframe`. ``name`` identifies the sink's ledger
    in Redis: keep it for as long as the query's checkpoint (a new checkpoint
    needs a new name, or the ledger keys deleted).

    Each batch's rejected rows are written whole to nothing in Redis; they go to
    ``on_rejects(rejects_df, batch_id)`` (the DataFrame is unpersisted after the
    call) or as Parquet to ``{rejects_path}/batch={batch_id}`` (overwritten when the
    batch is replayed). ``on_batch(report)`` gets every batch's
    :class:`~delayq.spark.EnqueueReport` (``batch_id`` and ``skipped`` set).
    ``metrics`` (a :class:`delayq.metrics.Metrics` sink, e.g.
    ``delayq.prometheus.PrometheusMetrics``) gets the counters ``sink_scheduled``,
    ``sink_kept``, ``sink_replaced``, ``sink_skipped`` and ``sink_rejected`` and the
    duration ``sink_batch`` of every batch, labelled with the type.
    """
    return StreamSink(
        event_type,
        name=name,
        redis_url=redis_url,
        prefix=prefix,
        id_col=id_col,
        due_col=due_col,
        delay_col=delay_col,
        context_cols=context_cols,
        replace=replace,
        batch_size=batch_size,
        rejects_path=rejects_path,
        on_rejects=on_rejects,
        on_batch=on_batch,
        metrics=metrics,
        serializer=serializer,
        max_payload_bytes=max_payload_bytes,
        cluster=cluster,
        priority_col=priority_col,
    )
