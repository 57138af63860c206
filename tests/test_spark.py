"""delayq.spark on a local SparkSession (local[2]) against real Redis servers.

Every test here is marked ``spark`` (skipped when Java or pyspark is missing;
deselect with ``-m "not spark"``) and shares one session-scoped SparkSession.
The event classes below are pickled by reference into Spark tasks, so the
Python workers import this module: the session puts this directory on their
PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest
import redis

from delayq import Event, EventService, QueueCounts, event_context, fixed
from delayq.codec import Codec
from delayq.keys import PrefixKeys, TypeKeys
from delayq.testing import RedisServer, find_redis_server_binary

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent


class SparkOrder(Event, event_name="spark-order"):
    order_id: int
    amount: Annotated[float, msgspec.Meta(ge=0)]
    customer: str
    created_at: datetime | None = None
    note: str | None = None


class SparkFailing(Event, event_name="spark-failing"):
    order_id: int


class SparkHeld(Event, event_name="spark-held"):
    order_id: int


class SparkNullable(Event, event_name="spark-nullable"):
    order_id: int
    comment: str | None  # required, but may be None


class SparkFan(Event, event_name="spark-fan"):
    order_id: int


class SparkUrgent(Event, event_name="spark-urgent", priority=4):
    order_id: int


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] SparkSession for every test of this module."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    assert __name__ == "test_spark", "the workers import this module by that name"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("delayq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.executorEnv.PYTHONPATH", str(HERE))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def sync_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, protocol=2)
    try:
        yield client
    finally:
        client.close()


def orders(
    spark: Any, n: int, *, start: int = 0, partitions: int = 4, delay_s: int | None = None
) -> Any:
    """``n`` orders: id "o-<i>", order_id, amount, customer, created_at, due_at (+1 h + i s)."""
    from pyspark.sql import functions as F

    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    df = spark.range(start, start + n, numPartitions=partitions).select(
        F.concat(F.lit("o-"), F.col("id").cast("string")).alias("id"),
        F.col("id").alias("order_id"),
        ((F.col("id") % 1000) / 4).alias("amount"),
        F.concat(F.lit("c-"), (F.col("id") % 97).cast("string")).alias("customer"),
        (F.lit(base) + F.make_interval(secs=F.col("id") % 3600)).alias("created_at"),
        (F.current_timestamp() + F.make_interval(secs=F.col("id") % 600 + 3600)).alias("due_at"),
    )
    if delay_s is not None:
        df = df.withColumn("delay", F.lit(delay_s))
    return df


def expected_order(i: int) -> SparkOrder:
    return SparkOrder(
        id=f"o-{i}",
        order_id=i,
        amount=(i % 1000) / 4,
        customer=f"c-{i % 97}",
        created_at=datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=i % 3600),
    )


# --------------------------------------------------------------------------- enqueue_dataframe


async def test_100k_rows_are_scheduled_and_a_rerun_adds_nothing(
    spark: Any, redis_url: str, prefix: str, sync_client: redis.Redis
) -> None:
    from delayq.spark import enqueue_dataframe

    n = 100_000
    df = orders(spark, n).cache()
    df.count()
    before_ms = time.time() * 1000
    report = enqueue_dataframe(df, SparkOrder, redis_url=redis_url, prefix=prefix, due_col="due_at")
    after_ms = time.time() * 1000
    assert (report.rows, report.scheduled, report.kept, report.replaced, report.rejected) == (
        n,
        n,
        0,
        0,
        0,
    )
    assert report.written and report.rejects is not None and report.rejects.count() == 0

    keys = TypeKeys(prefix, SparkOrder.event_name)
    assert sync_client.zcard(keys.scheduled) == n
    assert sync_client.hlen(keys.events) == n
    assert sync_client.smembers(PrefixKeys(prefix).types) == {b"spark-order"}
    codec = Codec()
    for i in (0, 4321, n - 1):
        event, context = codec.decode(sync_client.hget(keys.events, f"o-{i}"), SparkOrder, f"o-{i}")
        assert event == expected_order(i) and context == {}
        due = sync_client.zscore(keys.scheduled, f"o-{i}")
        offset = (i % 600 + 3600) * 1000
        assert before_ms + offset - 60_000 <= due <= after_ms + offset
    sample = sync_client.hget(keys.events, "o-777")

    service = EventService.from_url(redis_url, prefix=prefix)
    try:
        assert await service.stats_for(SparkOrder) == QueueCounts(n, 0, 0, 0)
    finally:
        await service.aclose()

    again = enqueue_dataframe(df, SparkOrder, redis_url=redis_url, prefix=prefix, due_col="due_at")
    assert (again.rows, again.scheduled, again.kept, again.replaced, again.rejected) == (
        n,
        0,
        n,
        0,
        0,
    )
    assert sync_client.zcard(keys.scheduled) == n
    assert sync_client.hget(keys.events, "o-777") == sample  # kept as it was
    df.unpersist()


def test_replace_swaps_payload_and_due_time(
    spark: Any, private_server: RedisServer, prefix: str
) -> None:
    from pyspark.sql import functions as F

    from delayq.spark import enqueue_dataframe

    client = redis.Redis.from_url(private_server.url, protocol=2)
    keys = TypeKeys(prefix, SparkOrder.event_name)
    df = orders(spark, 50, delay_s=3600).drop("due_at")
    first = enqueue_dataframe(
        df, SparkOrder, redis_url=private_server.url, prefix=prefix, delay_col="delay"
    )
    assert first.scheduled == 50
    due_before = client.zscore(keys.scheduled, "o-7")

    changed = df.withColumn("amount", F.col("amount") + 1000).withColumn("delay", F.lit(7200))
    kept = enqueue_dataframe(
        changed, SparkOrder, redis_url=private_server.url, prefix=prefix, delay_col="delay"
    )
    assert (kept.scheduled, kept.kept, kept.replaced) == (0, 50, 0)
    event, _ = Codec().decode(client.hget(keys.events, "o-7"), SparkOrder, "o-7")
    assert event.amount == (7 % 1000) / 4

    # o-8 waits for parents (after=[...], made by hand here): a replace keeps it waiting
    client.zrem(keys.scheduled, "o-8")
    client.zadd(keys.waiting, {"o-8": 1})
    client.script_flush()  # the executors must load the script again (NOSCRIPT)
    replaced = enqueue_dataframe(
        changed,
        SparkOrder,
        redis_url=private_server.url,
        prefix=prefix,
        delay_col="delay",
        replace=True,
    )
    assert (replaced.scheduled, replaced.kept, replaced.replaced) == (0, 0, 50)
    event, _ = Codec().decode(client.hget(keys.events, "o-7"), SparkOrder, "o-7")
    assert event.amount == (7 % 1000) / 4 + 1000
    assert client.zscore(keys.scheduled, "o-7") >= due_before + 3_000_000
    assert client.zcard(keys.scheduled) == 49 and client.hlen(keys.events) == 50
    assert client.zscore(keys.waiting, "o-8") == 1 and client.zscore(keys.scheduled, "o-8") is None
    event, _ = Codec().decode(client.hget(keys.events, "o-8"), SparkOrder, "o-8")
    assert event.amount == (8 % 1000) / 4 + 1000
    client.close()


def bad_rows(spark: Any) -> Any:
    """Four good rows and one bad row per kind of problem."""
    from pyspark.sql.types import (
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    now = datetime.now(timezone.utc)
    later = now + timedelta(hours=1)
    schema = StructType(
        [
            StructField("id", StringType()),
            StructField("order_id", LongType()),
            StructField("amount", DoubleType()),
            StructField("customer", StringType()),
            StructField("note", StringType()),
            StructField("due_at", TimestampType()),
            StructField("region", StringType()),
        ]
    )
    rows = [
        ("good-1", 1, 10.0, "ann", None, later, "eu"),
        ("good-2", 2, 0.0, "bob", "gift", later, "us"),
        ("good-3", 3, 5.5, "cy", None, now - timedelta(minutes=5), "eu"),  # due: straight to ready
        ("good-4", 4, 1.0, "di", "x" * 100, later, None),
        (None, 5, 1.0, "eve", None, later, "eu"),  # null id
        ("", 6, 1.0, "fay", None, later, "eu"),  # empty id
        ("neg", 7, -3.0, "gus", None, later, "eu"),  # amount < 0
        ("nocust", 8, 1.0, None, None, later, "eu"),  # required field is null
        ("nodue", 9, 1.0, "hal", None, None, "eu"),  # no due time
        ("huge", 10, 1.0, "ivy", "y" * 5000, later, "eu"),  # payload over the limit
    ]
    return spark.createDataFrame(rows, schema)


def test_bad_rows_are_rejected_with_reasons_and_not_written(
    spark: Any, redis_url: str, prefix: str, sync_client: redis.Redis, tmp_path: Path
) -> None:
    from delayq.spark import enqueue_dataframe

    df = bad_rows(spark)
    common = dict(
        redis_url=redis_url, due_col="due_at", context_cols=("region",), max_payload_bytes=2000
    )

    # strict: one bad row and nothing is written at all
    strict = enqueue_dataframe(df, SparkOrder, prefix=prefix + "-strict", strict=True, **common)
    assert (strict.rows, strict.scheduled, strict.rejected, strict.written) == (10, 0, 6, False)
    assert sync_client.exists(*TypeKeys(prefix + "-strict", SparkOrder.event_name).all()) == 0

    report = enqueue_dataframe(df, SparkOrder, prefix=prefix, **common)
    assert (report.rows, report.scheduled, report.kept, report.rejected) == (10, 4, 0, 6)
    assert report.rejects is not None
    rejects = {(r.id, r.reason): r.row_json for r in report.rejects.collect()}
    reasons = {rid: reason for rid, reason in rejects}
    assert reasons[None] == "id column 'id' is null"
    assert "must not be empty" in reasons[""]
    assert "Expected `float` >= 0" in reasons["neg"] and "$.amount" in reasons["neg"]
    assert "missing required field `customer`" in reasons["nocust"]
    assert reasons["nodue"] == "due column 'due_at' is null"
    assert "max_payload_bytes=2000" in reasons["huge"]
    row = msgspec.json.decode(rejects[("neg", reasons["neg"])])
    assert list(row) == df.columns  # the whole input row, columns in order
    assert (row["order_id"], row["amount"], row["customer"], row["region"]) == (
        7,
        -3.0,
        "gus",
        "eu",
    )
    report.rejects.unpersist()

    keys = TypeKeys(prefix, SparkOrder.event_name)
    assert sorted(sync_client.hkeys(keys.events)) == [b"good-1", b"good-2", b"good-3", b"good-4"]
    assert sync_client.zcard(keys.scheduled) == 3 and sync_client.zcard(keys.queued) == 1
    event, context = Codec().decode(sync_client.hget(keys.events, "good-2"), SparkOrder, "good-2")
    assert (event.note, event.customer, context) == ("gift", "bob", {"region": "us"})
    _, context = Codec().decode(sync_client.hget(keys.events, "good-4"), SparkOrder, "good-4")
    assert context == {}  # null context values are left out

    # rejects written to a path instead; the good rows are kept this time
    out = tmp_path / "rejects"
    again = enqueue_dataframe(df, SparkOrder, prefix=prefix, rejects_path=str(out), **common)
    assert (again.scheduled, again.kept, again.rejected, again.rejects) == (0, 4, 6, None)
    assert again.rejects_path == str(out)
    assert sorted(
        "-" if r.id is None else r.id for r in spark.read.parquet(str(out)).collect()
    ) == [
        "",
        "-",
        "huge",
        "neg",
        "nocust",
        "nodue",
    ]


def test_priority_col_sets_each_rows_level_and_rejects_bad_ones(
    spark: Any, redis_url: str, prefix: str, sync_client: redis.Redis
) -> None:
    """``priority_col`` for enqueue_dataframe and the streaming sink: levels 0..9 as given,
    a null takes the class's priority=, -1 and 12 are rejects naming column and value."""
    from delayq.spark import enqueue_dataframe, stream_sink

    rows = [(f"p-{n}", n, n) for n in range(10)] + [("p-null", 10, None)]
    rows += [("p-neg", 11, -1), ("p-big", 12, 12)]
    df = spark.createDataFrame(rows, "id string, order_id long, level int")
    expected = {f"p-{n}": n for n in range(10)} | {"p-null": 4}
    for run, target in (("batch", prefix), ("sink", prefix + "-sink")):
        if run == "batch":
            report = enqueue_dataframe(
                df, SparkUrgent, redis_url=redis_url, prefix=target, priority_col="level"
            )
        else:
            sink = stream_sink(
                SparkUrgent, name="s", redis_url=redis_url, prefix=target, priority_col="level"
            )
            sink(df, 0)
            sink(df, 0)  # a replay of the batch writes nothing again
            assert sink.last is not None
            report = sink.last
            assert report.skipped == 11
        assert report.rejects is not None
        reasons = {r.id: r.reason for r in report.rejects.collect()}
        report.rejects.unpersist()
        assert reasons == {
            "p-neg": "priority column 'level': -1 is not a priority level (an int from 0, "
            "the most urgent, to 9)",
            "p-big": "priority column 'level': 12 is not a priority level (an int from 0, "
            "the most urgent, to 9)",
        }
        keys = TypeKeys(target, SparkUrgent.event_name)
        assert sync_client.hlen(keys.events) == 11
        levels = {k.decode(): int(v) for k, v in sync_client.hgetall(keys.prio).items()}
        assert levels == {i: n for i, n in expected.items() if n}
        # each ready at its level: level 0's list and levels 1..9's
        by_list = [sync_client.llen(keys.ready), *map(sync_client.llen, keys.level_lists())]
        assert by_list == [1, 1, 1, 1, 2, 1, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="priority_col"):
        enqueue_dataframe(df, SparkUrgent, redis_url=redis_url, prefix=prefix, priority_col="x")


def test_columns_are_checked_before_any_job(spark: Any, redis_url: str, prefix: str) -> None:
    from pyspark.sql import functions as F

    from delayq.spark import enqueue_dataframe

    df = orders(spark, 3)
    with pytest.raises(ValueError, match=r"needs field.*customer"):
        enqueue_dataframe(df.drop("customer"), SparkOrder, redis_url=redis_url, prefix=prefix)
    with pytest.raises(ValueError, match="not both"):
        enqueue_dataframe(
            df.withColumn("d", F.lit(1)),
            SparkOrder,
            redis_url=redis_url,
            prefix=prefix,
            due_col="due_at",
            delay_col="d",
        )
    with pytest.raises(ValueError, match="not a column"):
        enqueue_dataframe(df, SparkOrder, redis_url=redis_url, prefix=prefix, due_col="nope")
    # a type that is never a time (try_cast and ANSI mode refuse it when the plan is made)
    with pytest.raises(TypeError, match="due_col='flag' is a boolean column"):
        enqueue_dataframe(
            df.withColumn("flag", F.lit(True)),
            SparkOrder,
            redis_url=redis_url,
            prefix=prefix,
            due_col="flag",
        )
    with pytest.raises(TypeError, match="delay_col='due_at' is a timestamp column"):
        enqueue_dataframe(df, SparkOrder, redis_url=redis_url, prefix=prefix, delay_col="due_at")
    with pytest.raises(TypeError, match=r"subclass of delayq\.Event"):
        enqueue_dataframe(df, dict, redis_url=redis_url, prefix=prefix)  # type: ignore[arg-type]


def test_nulls_and_type_mismatches(
    spark: Any, redis_url: str, prefix: str, sync_client: redis.Redis
) -> None:
    from delayq.spark import enqueue_dataframe

    df = spark.createDataFrame(
        [(1, 1, None), (2, 2, "ok")], "k long, order_id long, comment string"
    )
    report = enqueue_dataframe(df, SparkNullable, redis_url=redis_url, prefix=prefix, id_col="k")
    assert (report.scheduled, report.rejected) == (2, 0)
    keys = TypeKeys(prefix, SparkNullable.event_name)
    event, _ = Codec().decode(sync_client.hget(keys.events, "1"), SparkNullable, "1")
    assert event == SparkNullable(id="1", order_id=1, comment=None)  # null -> None, not missing
    assert sync_client.zcard(keys.queued) == 2  # no due or delay column: due now

    # column types must match the Struct's (msgspec is strict: "3" is not an int)
    mismatched = spark.createDataFrame(
        [(3, "3", "x", 9)], "k long, order_id string, comment string, `x.y` int"
    )
    report = enqueue_dataframe(
        mismatched, SparkNullable, redis_url=redis_url, prefix=prefix, id_col="k"
    )
    assert (report.scheduled, report.rejected) == (0, 1)
    assert report.rejects is not None
    (reject,) = report.rejects.collect()
    assert reject.id == "3" and "Expected `int`, got `str` - at `$.order_id`" in reject.reason
    row = msgspec.json.decode(reject.row_json)
    assert row == {"k": 3, "order_id": "3", "comment": "x", "x.y": 9}
    report.rejects.unpersist()


# --------------------------------------------------------------------------- read_queue


async def test_read_queue_returns_what_the_service_sees(
    spark: Any, redis_url: str, prefix: str, wait_for: Any
) -> None:
    from pyspark.sql import functions as F

    from delayq.spark import STATES, enqueue_dataframe, read_queue

    release = asyncio.Event()

    async def fail(event: SparkFailing) -> None:
        raise RuntimeError(f"no payment for {event.order_id}")

    async def hold(event: SparkHeld) -> None:
        await release.wait()

    service = EventService.from_url(
        redis_url, prefix=prefix, retry_attempts=1, retry_backoff=fixed(0.01)
    )
    async with service:
        service.add_handler(SparkFailing, fail, concurrency=4)
        service.add_handler(SparkHeld, hold, concurrency=3)
        # SparkOrder has no handler here: 30 stay scheduled, 20 become ready
        df = orders(spark, 50).withColumn(
            "delay", F.when(F.col("order_id") < 30, F.lit(3600.0)).otherwise(F.lit(0.0))
        )
        await asyncio.to_thread(
            enqueue_dataframe,
            df,
            SparkOrder,
            redis_url=redis_url,
            prefix=prefix,
            delay_col="delay",
            context_cols=("customer",),
        )
        await service.enqueue_many([SparkFailing(id=f"f-{i}", order_id=i) for i in range(10)])
        await service.enqueue_many([SparkHeld(id=f"h-{i}", order_id=i) for i in range(3)])
        expected = {
            "spark-order": QueueCounts(30, 20, 0, 0),
            "spark-failing": QueueCounts(0, 0, 0, 10),
            "spark-held": QueueCounts(0, 0, 3, 0),
        }
        await wait_for(lambda: _stats_equal(service, expected), timeout=30)

        def read() -> list[Any]:
            frame = read_queue(
                spark, redis_url=redis_url, prefix=prefix, states=STATES, page_size=7
            )
            return frame.collect()

        rows = await asyncio.to_thread(read)
        typed = await asyncio.to_thread(
            lambda: read_queue(
                spark,
                redis_url=redis_url,
                prefix=prefix,
                event_types=[SparkFailing],
                states=("dead",),
            ).collect()
        )
        dead = await service.dead_letters(SparkFailing, limit=100)
        stats = await service.stats()
        release.set()

    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        counts[(row.event_type, row.state)] = counts.get((row.event_type, row.state), 0) + 1
    for name, qc in stats.items():
        for state, value in zip(STATES, (qc.scheduled, qc.ready, qc.in_flight, qc.dead)):
            assert counts.get((name, state), 0) == value, (name, state)
    assert len(rows) == 63 and len({(r.event_type, r.id) for r in rows}) == 63

    by_id = {r.id: r for r in typed}
    assert len(dead) == 10 and set(by_id) == {d.id for d in dead}
    for letter in dead:
        row = by_id[letter.id]
        assert row.event_type == "spark-failing" and row.state == "dead"
        assert row.attempts == letter.attempts == 2
        assert (
            row.last_error
            == letter.error
            == f"RuntimeError: no payment for {letter.event.order_id}"
        )
        assert row.due_at.replace(tzinfo=timezone.utc) == letter.failed_at
        assert msgspec.json.decode(row.payload_json, type=SparkFailing) == letter.event
        assert row.context_json == "{}"

    now = datetime.now(timezone.utc)
    for row in rows:
        if row.event_type == "spark-order":
            i = int(row.id[2:])
            assert row.state == ("scheduled" if i < 30 else "ready")
            assert msgspec.json.decode(row.payload_json, type=SparkOrder) == expected_order(i)
            assert msgspec.json.decode(row.context_json) == {"customer": f"c-{i % 97}"}
            if row.state == "scheduled":
                assert row.due_at.replace(tzinfo=timezone.utc) > now + timedelta(minutes=50)
            else:
                assert row.due_at is None
            assert row.attempts == 0 and row.last_error is None
        if row.event_type == "spark-held":
            assert row.state == "in_flight" and row.attempts == 1
            assert row.due_at.replace(tzinfo=timezone.utc) > now  # the lease deadline


async def test_read_queue_covers_delivery_groups(
    spark: Any, redis_url: str, prefix: str, wait_for: Any
) -> None:
    from delayq.spark import STATES, read_queue

    release = asyncio.Event()

    async def ok(event: SparkFan) -> None:
        pass

    async def audit(event: SparkFan) -> None:
        raise RuntimeError(f"audit {event.order_id}")

    async def hold(event: SparkFan) -> None:
        await release.wait()

    service = EventService.from_url(redis_url, prefix=prefix, retry_attempts=0)
    async with service:
        service.add_handler(SparkFan, ok)
        service.add_handler(SparkFan, audit, group="audit")
        service.add_handler(SparkFan, hold, group="hold", concurrency=2)

        async def registered() -> bool:
            return len(await service.groups(SparkFan)) == 3

        await wait_for(registered)
        await service.enqueue_many([SparkFan(id=f"f-{i}", order_id=i) for i in range(2)])
        await service.enqueue_with_delay(SparkFan(id="later", order_id=9), 3600)
        await service.enqueue_with_delay(SparkOrder(id="o", order_id=1, amount=1, customer="c"), 60)

        async def settled() -> bool:
            counts = await service.group_stats(SparkFan)
            return counts["audit"].dead == 2 and counts["hold"].in_flight == 2

        await wait_for(settled, timeout=30)
        rows = await asyncio.to_thread(
            lambda: read_queue(spark, redis_url=redis_url, prefix=prefix, states=STATES).collect()
        )
        release.set()

    got = sorted((r.event_type, r.group or "", r.state, r.id) for r in rows)
    assert got == [
        ("spark-fan", "", "scheduled", "later"),
        ("spark-fan", "audit", "dead", "f-0"),
        ("spark-fan", "audit", "dead", "f-1"),
        ("spark-fan", "hold", "in_flight", "f-0"),
        ("spark-fan", "hold", "in_flight", "f-1"),
        ("spark-order", "", "scheduled", "o"),
    ]
    assert all(r.group is None for r in rows if r.state == "scheduled")
    for row in rows:
        if row.group == "audit":
            assert row.last_error == f"RuntimeError: audit {row.id[2:]}" and row.attempts == 1
            assert msgspec.json.decode(row.payload_json, type=SparkFan).id == row.id
        if row.group == "hold":
            assert row.attempts == 1 and row.last_error is None


async def _stats_equal(service: EventService, expected: dict[str, QueueCounts]) -> bool:
    stats = await service.stats()
    return all(stats.get(name) == counts for name, counts in expected.items())


def test_read_queue_reports_undecodable_payloads(
    spark: Any, redis_url: str, prefix: str, sync_client: redis.Redis
) -> None:
    from delayq.spark import read_queue

    keys = TypeKeys(prefix, SparkOrder.event_name)
    good = Codec(serializer="msgpack").encode(expected_order(1), {"k": "v"})
    sync_client.hset(keys.events, mapping={"o-1": good, "bad": b'[{"id": 5}]', "junk": b"\x00junk"})
    sync_client.zadd(
        keys.scheduled, {"o-1": 1_900_000_000_000, "bad": 1_900_000_000_000, "junk": 1}
    )
    sync_client.zadd(keys.scheduled, {"gone": 1_900_000_000_000})  # no envelope at all
    sync_client.hset(keys.errors, "bad", "ValueError: earlier")
    sync_client.sadd(PrefixKeys(prefix).types, SparkOrder.event_name)

    typed = {
        r.id: r
        for r in read_queue(
            spark, redis_url=redis_url, prefix=prefix, event_types=[SparkOrder]
        ).collect()
    }
    assert msgspec.json.decode(typed["o-1"].payload_json, type=SparkOrder) == expected_order(1)
    assert typed["o-1"].context_json == '{"k":"v"}' and typed["o-1"].last_error is None
    assert typed["bad"].payload_json is None
    assert typed["bad"].last_error.startswith("cannot decode SparkOrder")
    assert typed["bad"].last_error.endswith("; last error: ValueError: earlier")
    assert (
        typed["junk"].payload_json is None and "not a delayq envelope" in typed["junk"].last_error
    )
    assert typed["gone"].last_error == "the stored event is missing"

    # by name only (from the type set): payloads as stored, without validation
    untyped = {r.id: r for r in read_queue(spark, redis_url=redis_url, prefix=prefix).collect()}
    assert msgspec.json.decode(untyped["bad"].payload_json) == {"id": 5}
    assert msgspec.json.decode(untyped["o-1"].payload_json)["customer"] == "c-1"


# --------------------------------------------------------------------------- delivery


async def test_events_scheduled_by_spark_are_delivered(
    spark: Any, redis_url: str, prefix: str, wait_for: Any
) -> None:
    from pyspark.sql import functions as F

    from delayq.spark import enqueue_dataframe

    got: dict[str, tuple[SparkOrder, dict[str, str]]] = {}

    async def handle(event: SparkOrder) -> None:
        got[event.id] = (event, dict(event_context()))

    n = 300
    # half already due, half due within the next second
    df = orders(spark, n).withColumn(
        "due_at",
        F.current_timestamp() + F.make_interval(secs=(F.col("order_id") % 2) - 0.5),
    )
    async with EventService.from_url(redis_url, prefix=prefix) as service:
        service.add_handler(SparkOrder, handle, concurrency=8)
        report = await asyncio.to_thread(
            enqueue_dataframe,
            df,
            SparkOrder,
            redis_url=redis_url,
            prefix=prefix,
            due_col="due_at",
            context_cols=("customer",),
        )
        assert report.scheduled == n
        await wait_for(lambda: len(got) == n, timeout=30)
        assert await service.stats_for(SparkOrder) == QueueCounts(0, 0, 0, 0)
    for i in range(n):
        event, context = got[f"o-{i}"]
        assert event == expected_order(i) and context == {"customer": f"c-{i % 97}"}


# --------------------------------------------------------------------------- the job


async def test_reconciliation_job_and_dead_letter_export(
    spark: Any, redis_url: str, prefix: str, wait_for: Any, tmp_path: Path
) -> None:
    from delayq.spark.demo import PaymentCheck, export_dead, generate_orders, reconcile

    orders_df = generate_orders(spark, 4000).cache()
    unpaid = orders_df.where("NOT paid")
    n_unpaid = unpaid.count()
    n_bad = unpaid.where("amount < 0 OR customer IS NULL").count()
    n_due = unpaid.where(
        "amount >= 0 AND customer IS NOT NULL AND "
        "created_at + INTERVAL 3 HOURS <= current_timestamp()"
    ).count()
    assert n_bad > 0 and n_due > 0

    report = await asyncio.to_thread(
        reconcile, spark, orders_df, redis_url=redis_url, prefix=prefix
    )
    assert (report.rows, report.scheduled, report.rejected) == (n_unpaid, n_unpaid - n_bad, n_bad)
    assert report.rejects is not None
    reasons = {r.reason for r in report.rejects.collect()}
    assert any("$.amount" in r for r in reasons) and any("`customer`" in r for r in reasons)
    report.rejects.unpersist()
    rerun = await asyncio.to_thread(reconcile, spark, orders_df, redis_url=redis_url, prefix=prefix)
    assert (rerun.scheduled, rerun.kept) == (0, n_unpaid - n_bad)

    async def unpaid_check(event: PaymentCheck) -> None:
        raise RuntimeError("still unpaid")

    # the checks already due fail at once and become dead letters
    async with EventService.from_url(redis_url, prefix=prefix, retry_attempts=0) as service:
        service.add_handler(PaymentCheck, unpaid_check, concurrency=16)
        await wait_for(
            lambda: _stats_equal(
                service, {"payment-check": QueueCounts(n_unpaid - n_bad - n_due, 0, 0, n_due)}
            ),
            timeout=60,
        )
    out = tmp_path / "dead.parquet"
    assert (
        await asyncio.to_thread(
            export_dead, spark, redis_url=redis_url, prefix=prefix, out=str(out)
        )
        == n_due
    )
    exported = spark.read.parquet(str(out))
    assert exported.count() == n_due
    row = exported.first()
    assert row.state == "dead" and row.last_error == "RuntimeError: still unpaid"
    assert msgspec.json.decode(row.payload_json, type=PaymentCheck).id == row.id
    orders_df.unpersist()


@pytest.mark.slow  # a second JVM: ~15 s on an idle machine
def test_job_runs_from_the_command_line(redis_url: str, prefix: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    cmd = [
        sys.executable, "-m", "delayq.spark", "reconcile", "--generate", "2000",
        "--redis-url", redis_url, "--prefix", prefix, "--master", "local[1]",
        "--rejects", str(tmp_path / "rejects"), "--export-dead", str(tmp_path / "dead"),
    ]  # fmt: skip
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "delayq enqueue report for 'payment-check'" in run.stdout
    assert "wrote 0 dead letters" in run.stdout
    assert (tmp_path / "rejects").is_dir() and (tmp_path / "dead").is_dir()
    client = redis.Redis.from_url(redis_url, protocol=2)
    try:
        stored = client.hlen(TypeKeys(prefix, "payment-check").events)
    finally:
        client.close()
    numbers = {
        m[1]: int(m[2].replace(",", ""))
        for m in re.finditer(
            r"^ +(rows|scheduled|kept|replaced|rejected) +([\d,]+)", run.stdout, re.M
        )
    }
    assert stored == numbers["scheduled"] > 0 and numbers["rejected"] > 0


def test_orders_round_trip_through_csv(spark: Any, tmp_path: Path) -> None:
    from delayq.spark.demo import _read, _write, generate_orders

    generated = generate_orders(spark, 500, partitions=2)
    # its times count back from the current minute: evaluated once, not once per action (a
    # loaded run wrote in one minute and collected in the next)
    orders_df = spark.createDataFrame(generated.collect(), generated.schema).coalesce(2)
    _write(orders_df, str(tmp_path / "orders.csv"), "csv")
    back = _read(spark, str(tmp_path / "orders.csv"), "csv")
    assert back.dtypes == orders_df.dtypes
    assert sorted(back.collect()) == sorted(orders_df.collect())


# --------------------------------------------------------------------------- cluster


@pytest.mark.slow
def test_redis_cluster(spark: Any, prefix: str) -> None:
    from redis.cluster import RedisCluster
    from redis.crc import key_slot

    from delayq.spark import enqueue_dataframe, read_queue
    from delayq.testing.cluster import RedisClusterServer

    try:
        find_redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    types = (SparkOrder, SparkFailing)
    # a prefix under which the two types hash to slots of different nodes
    spread = next(
        p
        for p in (f"{prefix}-{i}" for i in range(10_000))
        if len({key_slot(TypeKeys(p, t.event_name).events.encode()) * 3 // 16384 for t in types})
        == 2
    )
    with RedisClusterServer(3) as cluster:
        df = orders(spark, 500, delay_s=600)
        first = enqueue_dataframe(
            df, SparkOrder, redis_url=cluster.url, prefix=spread, delay_col="delay"
        )
        failing = enqueue_dataframe(
            df.select("id", "order_id"), SparkFailing, redis_url=cluster.url, prefix=spread
        )
        assert (first.scheduled, failing.scheduled) == (500, 500)
        again = enqueue_dataframe(
            df, SparkOrder, redis_url=cluster.url, prefix=spread, delay_col="delay"
        )
        assert (again.scheduled, again.kept) == (0, 500)

        client = RedisCluster.from_url(cluster.url)
        try:
            order_keys = TypeKeys(spread, SparkOrder.event_name)
            failing_keys = TypeKeys(spread, SparkFailing.event_name)
            assert client.zcard(order_keys.scheduled) == 500
            assert client.zcard(failing_keys.queued) == 500
            nodes = {client.get_node_from_key(k.events).port for k in (order_keys, failing_keys)}
            assert len(nodes) == 2
        finally:
            client.close()

        rows = read_queue(spark, redis_url=cluster.url, prefix=spread, page_size=100).collect()
        counts: dict[tuple[str, str], int] = {}
        for row in rows:
            counts[(row.event_type, row.state)] = counts.get((row.event_type, row.state), 0) + 1
        assert counts == {("spark-order", "scheduled"): 500, ("spark-failing", "ready"): 500}

        # the streaming sink: one ledger per partition of a partitioned type, on the
        # partition's node (its hash tag), so each script call stays on one node
        from delayq.spark import stream_sink

        hot = orders(spark, 500, delay_s=600).drop("due_at")
        sink = stream_sink(
            SparkHot, name="s", redis_url=cluster.url, prefix=spread, delay_col="delay"
        )
        sink(hot, 0)
        assert sink.last is not None and sink.last.scheduled == 500
        sink(hot, 0)  # a replay
        assert (sink.last.scheduled, sink.last.skipped) == (0, 500)
        client = RedisCluster.from_url(cluster.url)
        try:
            ledgers = [TypeKeys(spread, SparkHot.event_name, k, 4).sink("s") for k in range(4)]
            assert sum(client.zcard(k) for k in ledgers) == 500
        finally:
            client.close()


class SparkHot(Event, event_name="spark-hot", partitions=4):
    """A partitioned type: rows are routed by id as the service routes them."""

    order_id: int
    amount: float
    customer: str
    created_at: datetime | None = None


async def test_partitioned_type_is_routed_and_read_as_one(
    spark: Any, redis_url: str, prefix: str
) -> None:
    from delayq.partitions.shards import partition_of
    from delayq.spark import enqueue_dataframe, read_queue

    df = orders(spark, 400, delay_s=3600).drop("due_at")
    report = enqueue_dataframe(df, SparkHot, redis_url=redis_url, prefix=prefix, delay_col="delay")
    assert report.scheduled == 400
    client = redis.Redis.from_url(redis_url, protocol=2)
    try:
        # every id sits in the partition the service would look in, and nowhere else
        for k in range(4):
            keys = TypeKeys(prefix, SparkHot.event_name, k, 4)
            ids = {m.decode() for m in client.zrange(keys.scheduled, 0, -1)}
            assert ids and all(partition_of(i, 4) == k for i in ids)
        assert client.zcard(TypeKeys(prefix, SparkHot.event_name).scheduled) == 0
    finally:
        client.close()
    service = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    try:
        assert (await service.stats_for(SparkHot)).scheduled == 400
        assert (await service.inspect(SparkHot, "o-7")).state == "scheduled"
        # a rerun adds nothing: the same ids land in the same partitions
        again = enqueue_dataframe(
            df, SparkHot, redis_url=redis_url, prefix=prefix, delay_col="delay"
        )
        assert (again.scheduled, again.kept) == (0, 400)
    finally:
        await service.aclose()
    frame = read_queue(spark, redis_url=redis_url, prefix=prefix)
    rows = frame.collect()
    assert len(rows) == 400
    assert {r["event_type"] for r in rows} == {"spark-hot"}


# --------------------------------------------------------------------------- stream_sink
# (the multi-process run with driver and executor kills: tests/test_spark_stream.py)


async def test_stream_sink_replays_a_batch_without_running_its_events_again(
    spark: Any, redis_url: str, prefix: str, sync_client: redis.Redis, wait_for: Any
) -> None:
    from delayq.metrics import InMemoryMetrics
    from delayq.spark import EnqueueReport, stream_sink

    n = 400
    df = orders(spark, n).drop("due_at")  # due now
    handled: dict[str, int] = {}

    async def handle(event: SparkHot) -> None:
        handled[event.id] = handled.get(event.id, 0) + 1

    metrics = InMemoryMetrics()
    reports: list[EnqueueReport] = []
    sink = stream_sink(
        SparkHot, name="orders", redis_url=redis_url, prefix=prefix,
        metrics=metrics, on_batch=reports.append, batch_size=50,
    )  # fmt: skip
    ledgers = [TypeKeys(prefix, SparkHot.event_name, k, 4).sink("orders") for k in range(4)]

    async def run(batch: int) -> EnqueueReport:
        await asyncio.to_thread(sink, df, batch)
        return reports[-1]

    async with EventService.from_url(redis_url, prefix=prefix) as service:
        service.add_handler(SparkHot, handle, concurrency=8)
        first = await run(0)
        assert (first.batch_id, first.rows, first.scheduled, first.skipped) == (0, n, n, 0)
        await wait_for(lambda: sum(handled.values()) == n, timeout=30)
        await wait_for(lambda: _stats_equal(service, {"spark-hot": QueueCounts(0, 0, 0, 0)}))

        # Spark replays batch 0 (driver restarted from the checkpoint): its events were
        # handled and deleted, the ledger still knows them: nothing is written
        replay = await run(0)
        assert (replay.scheduled, replay.kept, replay.skipped) == (0, 0, n)
        assert await service.stats_for(SparkHot) == QueueCounts(0, 0, 0, 0)

        # the same ids in a later batch are new rows: scheduled (and handled) again; the
        # ledger forgets batch 0, partition by partition
        later = await run(1)
        assert (later.scheduled, later.skipped) == (n, 0)
        await wait_for(lambda: sum(handled.values()) == 2 * n, timeout=30)
        assert sum(sync_client.zcard(k) for k in ledgers) == n
        assert all(
            score == 1.0
            for k in ledgers
            for _, score in sync_client.zrange(k, 0, -1, withscores=True)
        )
        # a batch older than the ledger's: a stale task, or the name reused with a new
        # checkpoint: refused, nothing written
        with pytest.raises(Exception, match="DELAYQ_SINK_REWOUND"):
            await asyncio.to_thread(sink, df, 0)
    assert set(handled) == {f"o-{i}" for i in range(n)} and set(handled.values()) == {2}
    assert metrics.total("sink_scheduled") == 2 * n and metrics.total("sink_skipped") == n
    assert metrics.observed("sink_batch") == 3


def test_stream_sink_reports_rejects_like_enqueue_dataframe(
    spark: Any, redis_url: str, prefix: str, sync_client: redis.Redis, tmp_path: Path
) -> None:
    from delayq.metrics import InMemoryMetrics
    from delayq.spark import enqueue_dataframe, stream_sink

    df = bad_rows(spark)
    common: dict[str, Any] = dict(
        redis_url=redis_url, due_col="due_at", context_cols=("region",), max_payload_bytes=2000
    )
    batch = enqueue_dataframe(df, SparkOrder, prefix=prefix + "-batch", **common)
    assert batch.rejects is not None
    expected = sorted((r.id or "-", r.reason, r.row_json) for r in batch.rejects.collect())
    batch.rejects.unpersist()

    got: list[tuple[int, list[Any]]] = []
    metrics = InMemoryMetrics()
    sink = stream_sink(
        SparkOrder, name="s", prefix=prefix, metrics=metrics,
        on_rejects=lambda rejects, b: got.append((b, rejects.collect())), **common,
    )  # fmt: skip
    sink(df, 7)
    assert [b for b, _ in got] == [7]
    assert sorted((r.id or "-", r.reason, r.row_json) for r in got[0][1]) == expected
    assert sink.last is not None
    assert (sink.last.scheduled, sink.last.rejected) == (4, 6)
    assert metrics.total("sink_rejected") == 6 and metrics.total("sink_scheduled") == 4
    keys = TypeKeys(prefix, SparkOrder.event_name)
    assert sorted(sync_client.hkeys(keys.events)) == [b"good-1", b"good-2", b"good-3", b"good-4"]
    assert sorted(sync_client.zrange(keys.sink("s"), 0, -1)) == sorted(
        sync_client.hkeys(keys.events)
    )

    # rejects to a path instead: one Parquet directory per batch
    out = tmp_path / "rejects"
    to_path = stream_sink(
        SparkOrder, name="p", prefix=prefix + "-p", rejects_path=str(out), **common
    )
    to_path(df, 3)
    assert len(spark.read.parquet(str(out / "batch=3")).collect()) == 6


# --------------------------------------------------------------------------- ANSI mode
# Spark 4 turns spark.sql.ansi.enabled on by default: a plain CAST of a malformed value then
# fails the task (CAST_INVALID_INPUT, CAST_OVERFLOW) instead of giving null. Each test below
# runs with it on and off, set explicitly in the shared session.

MALFORMED_SCHEMA = (
    "id STRING, order_id LONG, amount DOUBLE, customer STRING, "
    "due_s STRING, delay_s STRING, due_d DOUBLE"
)
# the bad row of each kind, per column: its reason
MALFORMED_REASONS = {
    "due_s": {
        "bad-1": "due column 'due_s': 'tomorrow' is not a timestamp",
        "bad-2": "due column 'due_s': '2026-13-45' is not a timestamp",
        "bad-3": "due column 'due_s' is null",
        "bad-4": "due column 'due_s': '' is not a timestamp",
    },
    "delay_s": {
        "bad-1": "delay column 'delay_s': 'soon' is not a number of seconds",
        "bad-2": "delay column 'delay_s' must be a finite number of seconds >= 0, not nan",
        "bad-3": "delay column 'delay_s' is null",
        "bad-4": "delay column 'delay_s' must be a finite number of seconds >= 0, not -1.0",
    },
    "due_d": {  # seconds since the epoch
        "bad-1": "due column 'due_d': 'NaN' is not a timestamp",
        "bad-2": "due column 'due_d' is outside the years 1 to 9999",
        "bad-3": "due column 'due_d' is null",
        "bad-4": "due column 'due_d': 'Infinity' is not a timestamp",
    },
}


BAD_TEXT = {"due_s": "tomorrow", "delay_s": "soon", "due_d": "NaN"}  # bad-1's, as Spark shows them


def malformed_times() -> list[tuple[Any, ...]]:
    """Two good rows, then one row per kind of bad time (see MALFORMED_REASONS)."""
    later = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=1)
    text, secs = later.strftime("%Y-%m-%d %H:%M:%S"), later.timestamp()
    return [
        ("good-1", 1, 1.0, "ann", text, "2.5", secs),
        ("good-2", 2, 1.0, "bob", later.isoformat(), "60", secs + 1.5),
        ("bad-1", 3, 1.0, "cy", "tomorrow", "soon", float("nan")),
        ("bad-2", 4, 1.0, "di", "2026-13-45", "NaN", 1e12),  # 1e12 s: year 33658
        ("bad-3", 5, 1.0, "eve", None, None, None),
        ("bad-4", 6, 1.0, "fay", "", "-1", float("inf")),
    ]


@pytest.fixture(params=[True, False], ids=["ansi-on", "ansi-off"])
def ansi(request: pytest.FixtureRequest, spark: Any) -> Iterator[bool]:
    """``spark.sql.ansi.enabled`` set in the shared session for one test (then restored)."""
    before = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "true" if request.param else "false")
    try:
        yield bool(request.param)
    finally:
        spark.conf.set("spark.sql.ansi.enabled", before)


def test_malformed_times_are_rejects_not_failures(
    spark: Any, ansi: bool, redis_url: str, prefix: str, sync_client: redis.Redis
) -> None:
    from delayq.spark import enqueue_dataframe

    df = spark.createDataFrame(malformed_times(), MALFORMED_SCHEMA).coalesce(1)
    for column, reasons in MALFORMED_REASONS.items():
        kind = "delay_col" if column.startswith("delay") else "due_col"
        p = f"{prefix}-{column}"
        report = enqueue_dataframe(
            df, SparkOrder, redis_url=redis_url, prefix=p, **{kind: column},
            context_cols=("customer", "customer"),  # a name given twice is one entry
        )  # fmt: skip
        assert (report.rows, report.scheduled, report.rejected) == (6, 2, 4), column
        assert report.rejects is not None
        rejects = {r.id: r for r in report.rejects.collect()}
        report.rejects.unpersist()
        assert {i: r.reason for i, r in rejects.items()} == reasons
        # the value that could not be read is shown as Spark printed it
        bad = msgspec.json.decode(rejects["bad-1"].row_json)
        assert (bad["id"], bad[column]) == ("bad-1", BAD_TEXT[column])
        keys = TypeKeys(p, SparkOrder.event_name)
        assert sorted(sync_client.hkeys(keys.events)) == [b"good-1", b"good-2"]
        _, context = Codec().decode(sync_client.hget(keys.events, "good-2"), SparkOrder, "good-2")
        assert context == {"customer": "bob"}


def test_stream_sink_rejects_malformed_times_and_goes_on(
    spark: Any, ansi: bool, redis_url: str, prefix: str, sync_client: redis.Redis, tmp_path: Path
) -> None:
    from delayq.spark import stream_sink

    source = tmp_path / "in"
    source.mkdir()
    names = ("id", "order_id", "amount", "customer", "due_s", "delay_s")
    rows = [dict(zip(names, row)) for row in malformed_times()]
    (source / "rows.json").write_bytes(b"\n".join(msgspec.json.encode(r) for r in rows))
    got: dict[str, dict[str, str]] = {}
    sinks = [
        stream_sink(
            SparkOrder,
            name="times",
            redis_url=redis_url,
            prefix=f"{prefix}-{column}",
            on_rejects=lambda df, _, c=column: got.setdefault(c, {}).update(
                (r.id, r.reason) for r in df.collect()
            ),
            **{"delay_col" if column == "delay_s" else "due_col": column},
        )
        for column in ("due_s", "delay_s")
    ]

    def both(df: Any, batch_id: int) -> None:
        for sink in sinks:
            sink(df, batch_id)

    schema = MALFORMED_SCHEMA.rsplit(", ", 1)[0]  # without due_d (JSON has no NaN)
    stream = spark.readStream.schema(schema).json(str(source))
    query = (
        stream.writeStream.foreachBatch(both)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the query did not finish"
    finally:
        query.stop()
    assert query.exception() is None
    for column in ("due_s", "delay_s"):
        assert got[column] == MALFORMED_REASONS[column]
        keys = TypeKeys(f"{prefix}-{column}", SparkOrder.event_name)
        assert sorted(sync_client.hkeys(keys.events)) == [b"good-1", b"good-2"]
    assert [s.last and (s.last.scheduled, s.last.rejected) for s in sinks] == [(2, 4), (2, 4)]
