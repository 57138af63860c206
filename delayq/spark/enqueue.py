"""enqueue_dataframe on the driver: one event per DataFrame row, and the report.

It checks the arguments, selects the columns the executors need, and runs the
two passes (:mod:`.validate`, then :mod:`.write`, both on the executors).
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from pyspark import StorageLevel
from pyspark.rdd import RDD
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ..codec import Codec, Serializer
from ..events import Event, check_event_type
from ..keys import TypeKeys
from .clients import resolve_cluster
from .schemas import REJECTS_SCHEMA
from .validate import EnqueueJob, Mode, validate_partition
from .write import write_partition

log = logging.getLogger("delayq.spark")

_DEFAULT_MAX_PAYLOAD = 512 * 1024

# --------------------------------------------------------------------------- report


@dataclass(frozen=True)
class EnqueueReport:
    """What :func:`enqueue_dataframe` did.

    ``scheduled + kept + replaced + rejected`` equals ``rows`` unless the input
    changed between the validation pass and the write pass.
    """

    event_type: str
    """Wire name of the event type."""
    rows: int
    """Rows in the DataFrame (counted by the validation pass)."""
    scheduled: int
    """Events added (due in the future, or straight to ready when already due)."""
    kept: int
    """Rows whose id already existed: the stored event was kept (``replace=False``)."""
    replaced: int
    """Rows whose id already existed and replaced the stored event (``replace=True``)."""
    rejected: int
    """Rows that failed validation; none of them was written."""
    written: bool
    """False when ``strict=True`` and some rows were rejected: nothing was written."""
    rejects: DataFrame | None
    """The rejected rows (columns ``id``, ``reason``, ``row_json``), unless written to a path.

    Persisted (memory and disk) when non-empty; call ``rejects.unpersist()`` when done.
    """
    rejects_path: str | None
    """Where the rejects were written as Parquet, if a path was given."""
    seconds: float
    """Wall-clock time of the whole call."""
    validation_seconds: float = 0.0
    """Part of :attr:`seconds` spent in the validation pass."""
    skipped: int = 0
    """Streaming sink only: rows not written because the sink's ledger holds their id
    for this batch already (the batch ran before, a task was retried, or an earlier
    row of the batch has the id). Always 0 for :func:`enqueue_dataframe`."""
    batch_id: int | None = None
    """Streaming sink only: the micro-batch id (None for :func:`enqueue_dataframe`)."""

    @property
    def rows_per_second(self) -> float:
        """Rows handled per second of wall-clock time."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        """A short human-readable summary."""
        batch = "" if self.batch_id is None else f", batch {self.batch_id}"
        lines = [
            f"delayq enqueue report for {self.event_type!r}{batch}",
            f"  rows       {self.rows:>12,}",
            f"  scheduled  {self.scheduled:>12,}",
            f"  kept       {self.kept:>12,}  (already there)",
            f"  replaced   {self.replaced:>12,}",
            f"  rejected   {self.rejected:>12,}",
            *(
                [f"  skipped    {self.skipped:>12,}  (already written in this batch)"]
                if self.batch_id is not None
                else []
            ),
            f"  seconds    {self.seconds:>12.2f}  ({self.rows_per_second:,.0f} rows/s; "
            f"validation {self.validation_seconds:.2f})",
        ]
        if not self.written:
            lines.append("  NOTHING WRITTEN: strict=True and some rows were rejected")
        if self.rejects_path:
            lines.append(f"  rejects written to {self.rejects_path}")
        return "\n".join(lines)


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


def _admits_none(tp: Any) -> bool:
    info = msgspec.inspect.type_info(tp)
    if isinstance(info, msgspec.inspect.NoneType):
        return True
    if isinstance(info, msgspec.inspect.UnionType):
        return any(isinstance(t, msgspec.inspect.NoneType) for t in info.types)
    return False


def _col(name: str) -> Column:
    """A column by its exact name (dots and backticks in names are no paths)."""
    return F.col("`" + name.replace("`", "``") + "`")


def _field_columns(df: DataFrame, event_type: type[Event]) -> dict[str, str]:
    """Columns that fill a field of ``event_type`` by name -> the field's name in JSON."""
    columns = set(df.columns)
    return {
        f.name: f.encode_name
        for f in msgspec.structs.fields(event_type)
        if f.name != "id" and f.name in columns
    }


def _prepare(
    df: DataFrame,
    event_type: type[Event],
    *,
    id_col: str,
    time_col: str | None,
    mode: Mode,
    context_cols: Sequence[str],
) -> DataFrame:
    """Select what the executors need: payload object, id, time, context, other columns.

    The other columns (``r``) are only needed to show a rejected row whole.
    """
    by_column = _field_columns(df, event_type)
    payload: list[Column] = []
    missing = []
    for field in msgspec.structs.fields(event_type):
        if field.name == "id":
            payload.append(_col(id_col).cast("string").alias(field.encode_name))
        elif field.name in by_column:
            payload.append(_col(field.name).alias(field.encode_name))
        elif field.required:
            missing.append(field.name)
    if missing:
        raise ValueError(
            f"{event_type.__name__} needs field(s) {', '.join(missing)} but the DataFrame has no "
            f"column of that name (columns: {', '.join(df.columns)})"
        )
    selected = [F.struct(*payload).alias("p"), _col(id_col).cast("string").alias("i")]
    if mode == "at":
        assert time_col is not None
        selected.append(F.unix_micros(_col(time_col).cast("timestamp")).alias("t"))
    elif mode == "delay":
        assert time_col is not None
        selected.append(_col(time_col).cast("double").alias("t"))
    if context_cols:
        pairs: list[Column] = []
        for name in context_cols:
            pairs += [F.lit(name), _col(name).cast("string")]
        selected.append(F.create_map(*pairs).alias("c"))
    # the time column travels as ``t`` (formatting timestamps is the costly part of the JSON)
    rest = [_col(c).alias(c) for c in df.columns if c not in by_column and c != time_col]
    if rest:
        selected.append(F.struct(*rest).alias("r"))
    return df.select(*selected)


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
    max_payload_bytes: int = _DEFAULT_MAX_PAYLOAD,
    cluster: bool | None = None,
) -> EnqueueReport:
    """Schedule one ``event_type`` event per row of ``df``; return an :class:`EnqueueReport`.

    Columns named like the Struct's fields fill them (other columns are ignored;
    a null counts as a missing field, so the field's default applies); the event
    id comes from ``id_col`` (cast to string). Each event is due at ``due_col``
    (a timestamp, or anything Spark casts to one) or after ``delay_col`` seconds
    on Redis's clock, or at once when neither is given. ``context_cols`` become
    the event context (column name -> value as string, nulls left out).

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
    )
    return run_job(job, prepared, strict=strict, rejects_path=rejects_path, started=started)


def plan_job(
    df: DataFrame,
    event_type: type[Event],
    *,
    redis_url: str,
    prefix: str,
    id_col: str,
    due_col: str | None,
    delay_col: str | None,
    context_cols: Sequence[str],
    replace: bool,
    batch_size: int,
    serializer: Serializer,
    max_payload_bytes: int,
    cluster: bool,
) -> tuple[EnqueueJob, DataFrame]:
    """Check the arguments of :func:`enqueue_dataframe` against ``df``; return the job the
    executors run and the prepared DataFrame (what they read). No Spark job runs."""
    event_type = check_event_type(event_type)
    type_name = event_type.event_name
    TypeKeys(prefix, type_name)  # validates prefix and name
    if due_col is not None and delay_col is not None:
        raise ValueError("give due_col or delay_col, not both")
    if isinstance(context_cols, str):
        raise TypeError("context_cols must be a sequence of column names, not one string")
    for what, name in (("id_col", id_col), ("due_col", due_col), ("delay_col", delay_col)):
        if name is not None and name not in df.columns:
            raise ValueError(f"{what}={name!r} is not a column of the DataFrame ({df.columns})")
    for name in context_cols:
        if name not in df.columns:
            raise ValueError(f"context column {name!r} is not a column of the DataFrame")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
    Codec(serializer, max_payload_bytes)  # validates the serializer
    mode: Mode = "at" if due_col else "delay" if delay_col else "now"
    job = EnqueueJob(
        redis_url=redis_url,
        cluster=cluster,
        prefix=prefix,
        event_type=event_type,
        mode=mode,
        replace=bool(replace),
        batch_size=batch_size,
        serializer=serializer,
        max_payload_bytes=max_payload_bytes,
        id_col=id_col,
        time_col=due_col or delay_col,
        nullable_required=tuple(
            f.encode_name
            for f in msgspec.structs.fields(event_type)
            if f.required and f.name != "id" and _admits_none(f.type)
        ),
        row_columns=tuple(
            (c, _field_columns(df, event_type).get(c, "" if c == (due_col or delay_col) else None))
            for c in df.columns
        ),
    )
    prepared = _prepare(
        df,
        event_type,
        id_col=id_col,
        time_col=job.time_col,
        mode=mode,
        context_cols=tuple(context_cols),
    )

    return job, prepared


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
