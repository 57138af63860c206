"""The schemas of the DataFrames delayq.spark reads and returns, and the queue states."""

from __future__ import annotations

from pyspark.sql.types import (
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

#: Queue states :func:`read_queue` can read, in the order of an event's life.
STATES = ("scheduled", "ready", "in_flight", "dead")

#: Schema of the rejects of :func:`enqueue_dataframe`.
REJECTS_SCHEMA = StructType(
    [
        StructField("id", StringType(), True),
        StructField("reason", StringType(), False),
        StructField("row_json", StringType(), True),
    ]
)

#: Schema of the DataFrame returned by :func:`read_queue`.
QUEUE_SCHEMA = StructType(
    [
        StructField("event_type", StringType(), False),
        StructField("id", StringType(), False),
        StructField("state", StringType(), False),
        StructField("due_at", TimestampType(), True),
        StructField("attempts", IntegerType(), False),
        StructField("last_error", StringType(), True),
        StructField("payload_json", StringType(), True),
        StructField("context_json", StringType(), True),
        StructField("enqueued_at", TimestampType(), True),
        # the delivery group whose set the row comes from; null for a type
        # without named groups and for the type's (shared) schedule
        StructField("group", StringType(), True),
    ]
)
