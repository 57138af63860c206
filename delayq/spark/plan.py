"""Planning an enqueue job on the driver: the arguments checked against the DataFrame, the
job the executors run (:class:`~delayq.spark.validate.EnqueueJob`) and the columns they read.

No Spark job runs here; :func:`~delayq.spark.enqueue.run_job` runs the plan.

Nothing the plan computes may fail on a row's value, whatever ``spark.sql.ansi.enabled``
says (on by default since Spark 4, where a plain ``CAST`` of a malformed value fails the
task and so the whole job or micro-batch): the due and delay columns are read with
``try_cast``, which gives null under both modes, and the validation pass turns that null
into a reject. Casts to string cannot fail; nothing else is cast or computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DataType,
    DateType,
    NumericType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from ..codec import Codec, Serializer
from ..events import Event, check_event_type
from ..keys import TypeKeys
from .validate import EnqueueJob, Mode

__all__ = ["DEFAULT_MAX_PAYLOAD", "plan_job"]

DEFAULT_MAX_PAYLOAD = 512 * 1024
"""``max_payload_bytes`` unless given (the service's default too)."""


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
    priority_col: str | None = None,
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
    for what, name in (
        ("id_col", id_col),
        ("due_col", due_col),
        ("delay_col", delay_col),
        ("priority_col", priority_col),
    ):
        if name is not None and name not in df.columns:
            raise ValueError(f"{what}={name!r} is not a column of the DataFrame ({df.columns})")
    for name in context_cols:
        if name not in df.columns:
            raise ValueError(f"context column {name!r} is not a column of the DataFrame")
    # a name given twice would be a duplicate map key: an error for every row
    context_cols = tuple(dict.fromkeys(context_cols))
    time_col = due_col or delay_col
    if time_col is not None:
        _check_time_type(df, time_col, "due_col" if due_col else "delay_col")
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
        time_col=time_col,
        priority_col=priority_col,
        nullable_required=tuple(
            f.encode_name
            for f in msgspec.structs.fields(event_type)
            if f.required and f.name != "id" and _admits_none(f.type)
        ),
        row_columns=tuple(
            (c, _field_columns(df, event_type).get(c, "" if c == time_col else None))
            for c in df.columns
        ),
    )
    prepared = _prepare(
        df,
        event_type,
        id_col=id_col,
        time_col=job.time_col,
        mode=mode,
        context_cols=context_cols,
        priority_col=priority_col,
    )

    return job, prepared


def _admits_none(tp: Any) -> bool:
    info = msgspec.inspect.type_info(tp)
    if isinstance(info, msgspec.inspect.NoneType):
        return True
    if isinstance(info, msgspec.inspect.UnionType):
        return any(isinstance(t, msgspec.inspect.NoneType) for t in info.types)
    return False


def _quoted(name: str) -> str:
    """A column name as SQL text (dots and backticks in names are no paths)."""
    return "`" + name.replace("`", "``") + "`"


def _col(name: str) -> Column:
    """A column by its exact name."""
    return F.col(_quoted(name))


# what a due column may hold (numbers: seconds since the epoch), and a delay column
_DUE_TYPES = (TimestampType, TimestampNTZType, DateType, StringType, NumericType)
_DELAY_TYPES = (StringType, NumericType)


def _check_time_type(df: DataFrame, name: str, what: str) -> None:
    """Refuse, before any job, a time column of a type that is never a time.

    Such a cast is refused by ``try_cast`` (and by ANSI mode) when the query is analysed.
    """
    dtype: DataType = df.schema[name].dataType
    allowed = _DUE_TYPES if what == "due_col" else _DELAY_TYPES
    if not isinstance(dtype, allowed):
        wants = (
            "a timestamp, date, string or number (seconds since the epoch)"
            if what == "due_col"
            else "a number of seconds or a string"
        )
        raise TypeError(f"{what}={name!r} is a {dtype.simpleString()} column; it must be {wants}")


def _try_cast(name: str, dtype: DataType, target: str) -> Column:
    """The column cast to ``target`` (a SQL type name), null where a value does not convert.

    SQL ``try_cast`` exists since Spark 3.2 (``Column.try_cast`` only since 4.0).
    """
    if dtype.typeName() == target.lower():
        return _col(name)
    return F.expr(f"try_cast({_quoted(name)} AS {target})")


def _time_columns(df: DataFrame, name: str, mode: Mode) -> list[Column]:
    """``t``: due time in µs since the epoch, or delay in seconds; null when the value is
    null or does not convert. ``b``: the value as text when it is not null and does not
    convert (null otherwise, so the plain path carries nothing more)."""
    dtype = df.schema[name].dataType
    if mode == "at":
        t = F.unix_micros(_try_cast(name, dtype, "TIMESTAMP"))
    else:
        t = _try_cast(name, dtype, "DOUBLE")
    bad = F.when(t.isNull() & _col(name).isNotNull(), _col(name).cast("string"))
    return [t.alias("t"), bad.alias("b")]


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
    priority_col: str | None = None,
) -> DataFrame:
    """Select what the executors need: payload object, id, time, context, priority level,
    other columns.

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
    if mode != "now":
        assert time_col is not None
        selected += _time_columns(df, time_col, mode)
    if context_cols:
        pairs: list[Column] = []
        for name in context_cols:
            pairs += [F.lit(name), _col(name).cast("string")]
        selected.append(F.create_map(*pairs).alias("c"))
    if priority_col is not None:
        # as it is (no cast): the validation pass takes only an int 0..9, like priority=
        selected.append(_col(priority_col).alias("q"))
    # the time column travels as ``t`` (formatting timestamps is the costly part of the JSON)
    rest = [_col(c).alias(c) for c in df.columns if c not in by_column and c != time_col]
    if rest:
        selected.append(F.struct(*rest).alias("r"))
    return df.select(*selected)
