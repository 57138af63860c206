"""enqueue_dataframe on the driver: one event per DataFrame row, and the report.

It checks the arguments and selects the columns the executors need
(:mod:`.plan`), and runs the two passes (:mod:`.validate`, then :mod:`.write`,
both on the executors); :mod:`.report` is what it returns.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Sequence
from typing import Any

from pyspark import StorageLevel
from pyspark.rdd import RDD
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..codec import Serializer
from ..events import Event
from .clients import resolve_cluster
from .plan import DEFAULT_MAX_PAYLOAD, plan_job
from .report import EnqueueReport
from .schemas import REJECTS_SCHEMA
from .validate import EnqueueJob, validate_partition
from .write import write_partition

__all__ = ["EnqueueReport", "enqueue_dataframe", "plan_job", "run_job"]

log = logging.getLogger("delayq.spark")


def enqueue_dataframe(
    df: DataFrame,
    event_type: type[Event],
    *,
    redis_url: str,
    prefix: str,
    id_col: str = "id",
    due_col: str | None = None,
    delay_col: str | None = None,
    context_cols: Sequence[str] = (),
    replace: bool = False,
    batch_size: int = 1000,
    strict: bool = False,
    rejects_path: str | None = None,
    serializer: Serializer = "msgpack",
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
    cluster: bool | None = None,
    priority_col: str | None = None,
) -> EnqueueReport:
    """Schedule one ``event_type`` event per row of ``df``; return an :class:`EnqueueReport`.

    Columns named like the Struct's fields fill them (other columns are ignored;
    a null counts as a missing field, so the field's default applies); the event
    id comes from ``id_col`` (cast to string). Each event is due at ``due_col``
    (a timestamp, or anything Spark casts to one) or after ``delay_col`` seconds
    on Redis's clock, or at once when neither is given. ``context_cols`` become
    the event context (column name -> value as string, nulls left out).
    ``priority_col`` gives each event's priority level (an int from 0, the most
    urgent, to 9; a null takes the class's ``priority=``; anything else is a reject
    naming the column and the value); without it every row gets the class's level
    (docs/guides/priorities.md).

    Runs in two passes. The validation pass checks every row with msgspec
    against the Struct (and the payload size limit) and collects the rejects:
    they come back in :attr:`EnqueueReport.rejects`, or are written as Parquet
    to ``rejects_path``. The write pass then sends only the valid rows, from
    the executors, ``batch_size`` rows per pipelined round trip, through the
    library's own Lua ``enqueue`` script: an id that already exists keeps its
    event (counted as kept) unless ``replace=True``, which swaps payload,
    context and due time in one step. Each event is written whole or not at
    all; with ``strict=True`` a single reject means nothing is written.

    ``cluster`` selects ``redis.cluster.RedisCluster`` (True), a plain client
    (False), or detects it from ``INFO cluster`` on the driver (None).
    ``serializer`` and ``max_payload_bytes`` mean what they mean for
    :class:`~delayq.EventService`. Duplicate ids within ``df`` follow the same
    rule: the first write wins and later rows count as kept (or replaced).
    """
    started = time.perf_counter()
    job, prepared = plan_job(
        df,
        event_type,
        redis_url=redis_url,
        prefix=prefix,
        id_col=id_col,
        due_col=due_col,
        delay_col=delay_col,
        context_cols=context_cols,
        replace=replace,
        batch_size=batch_size,
        serializer=serializer,
        max_payload_bytes=max_payload_bytes,
        cluster=resolve_cluster(redis_url, cluster),
        priority_col=priority_col,
    )
    return run_job(job, prepared, strict=strict, rejects_path=rejects_path, started=started)


def run_job(
    job: EnqueueJob,
    prepared: DataFrame,
    *,
    strict: bool,
    rejects_path: str | None,
    started: float,
) -> EnqueueReport:
    """Run the validation pass, then the write pass, of a planned job; report."""
    type_name = job.type_name
    spark = prepared.sparkSession
    # Pass 1: validate and encode every row. The result (items and rejects) is
    # kept by Spark, so the write pass reads it instead of converting rows again.
    rows_seen = spark.sparkContext.accumulator(0)
    rows_bad = spark.sparkContext.accumulator(0)
    checked = (
        _json_lines(prepared)
        .mapPartitions(functools.partial(validate_partition, job, rows_seen, rows_bad))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        _materialize(checked)
        total = int(rows_seen.value)
        rejected = 0
        out_path = None
        rejects_df: DataFrame | None = None
        if rows_bad.value:
            rejects = spark.createDataFrame(
                checked.filter(lambda c: not c[0]).map(lambda c: c[1:]), REJECTS_SCHEMA
            ).persist(StorageLevel.MEMORY_AND_DISK)
            rejected = rejects.count()
            if rejects_path is not None:
                rejects.write.mode("overwrite").parquet(rejects_path)
                out_path = rejects_path
                rejects.unpersist()
            else:
                rejects_df = rejects
        elif rejects_path is None:
            rejects_df = spark.createDataFrame([], REJECTS_SCHEMA)
        validated = time.perf_counter()
        log.info("%s: %d rows, %d rejected by validation", type_name, total, rejected)

        # Pass 2: write the valid items.
        added = kept = replaced = skipped = 0
        written = not (strict and rejected)
        if written and total > rejected:
            write = functools.partial(write_partition, job)
            for a, k, r, x in checked.mapPartitions(write).collect():
                added += a
                kept += k
                replaced += r
                skipped += x
    finally:
        checked.unpersist()
    report = EnqueueReport(
        event_type=type_name,
        rows=total,
        scheduled=added,
        kept=kept,
        replaced=replaced,
        rejected=rejected,
        written=written,
        rejects=rejects_df,
        rejects_path=out_path,
        seconds=time.perf_counter() - started,
        validation_seconds=validated - started,
        skipped=skipped,
        batch_id=job.batch_id if job.sink is not None else None,
    )
    log.info(
        "%s: %d scheduled, %d kept, %d replaced, %d rejected in %.1fs",
        type_name,
        added,
        kept,
        replaced,
        rejected,
        report.seconds,
    )
    return report


def _materialize(rdd: RDD[Any]) -> None:
    """Compute and cache a persisted RDD without reading its records back into Python."""
    jrdd = getattr(rdd, "_jrdd", None)  # the JVM side of a Python RDD
    if jrdd is not None and hasattr(jrdd, "count"):
        jrdd.count()  # counts pickled batches in the JVM
    else:  # pragma: no cover - other PySpark internals
        rdd.count()


def _json_lines(df: DataFrame) -> RDD[str]:
    """The rows of ``df`` as JSON strings, serialized by the JVM (no row pickling)."""
    with warnings.catch_warnings():
        # Spark 4 warns that toJSON will return a DataFrame one day.
        warnings.simplefilter("ignore", UserWarning)
        rdd = df.toJSON()
    if isinstance(rdd, RDD):
        return rdd
    lines: RDD[str] = df.select(F.to_json(F.struct(*df.columns)).alias("v")).rdd.map(lambda r: r[0])
    return lines
