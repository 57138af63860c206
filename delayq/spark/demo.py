"""The reconciliation job: every unpaid order gets a payment check 3 hours after it was created.

Run it with ``python -m delayq.spark <command> ...`` (or ``scripts/spark_reconcile.py``,
which ``spark-submit`` can run unchanged on a real cluster)::

    # write a sample orders dataset (Parquet or CSV)
    python -m delayq.spark generate --out /tmp/orders.parquet --rows 100000

    # schedule a PaymentCheck for every unpaid order; re-running adds nothing new
    python -m delayq.spark reconcile --orders /tmp/orders.parquet --redis-url redis://host:6379/0

    # the dead letters as Parquet, for analysis
    python -m delayq.spark export-dead --out /tmp/dead.parquet --redis-url redis://host:6379/0

Without ``--redis-url`` (and without ``REDIS_URL`` in the environment) ``reconcile``
starts a throw-away local redis-server for the run, which only local Spark can reach.
See ``docs/SPARK.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import msgspec

from ..events import Event

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from . import EnqueueReport

__all__ = ["PaymentCheck", "generate_orders", "main", "reconcile", "unpaid_orders"]

log = logging.getLogger("delayq.spark.demo")


class PaymentCheck(Event, event_name="payment-check"):
    """Check that order ``order_id`` was paid; scheduled for 3 hours after it was created.

    The id is ``"order-<order_id>"``, so an order gets at most one pending check.
    """

    order_id: int
    customer: Annotated[str, msgspec.Meta(min_length=1)]
    amount: Annotated[float, msgspec.Meta(ge=0)]
    created_at: datetime


def generate_orders(
    spark: SparkSession, rows: int, *, seed: int = 7, partitions: int | None = None
) -> DataFrame:
    """A deterministic sample of ``rows`` orders created over the last 6 hours.

    Columns: ``order_id`` (long), ``customer`` (string), ``amount`` (double),
    ``created_at`` (timestamp), ``paid`` (boolean). About 30% are unpaid; one
    order in a thousand has a negative amount and one in five hundred has no
    customer; those are unpaid and the :class:`PaymentCheck` validation rejects them.
    """
    from pyspark.sql import functions as F

    # the timestamp of the newest order: whole minutes, so a re-run generates the same data
    base = F.expr("date_trunc('MINUTE', current_timestamp())")
    df = spark.range(1, rows + 1, numPartitions=partitions or spark.sparkContext.defaultParallelism)
    h = F.xxhash64(F.col("id"), F.lit(seed))
    # abs(h % m), not abs(h) % m: the same values, but abs of the smallest long overflows
    # (an error under ANSI mode)
    return df.select(
        F.col("id").alias("order_id"),
        F.when(F.col("id") % 500 == 17, F.lit(None))
        .otherwise(F.concat(F.lit("customer-"), F.abs(h % 5000).cast("string")))
        .alias("customer"),
        F.when(F.col("id") % 1000 == 3, F.lit(-1.0))
        .otherwise(F.round(F.abs(h % 100_000) / 100 + 1, 2))
        .alias("amount"),
        (
            base - F.make_interval(secs=F.abs(F.xxhash64(F.col("id"), F.lit(seed + 1)) % 21_600))
        ).alias("created_at"),
        (
            (F.abs(F.xxhash64(F.col("id"), F.lit(seed + 2)) % 10) >= 3)
            & (F.col("id") % 1000 != 3)
            & (F.col("id") % 500 != 17)
        ).alias("paid"),
    )


def unpaid_orders(orders: DataFrame, delay_hours: float = 3.0) -> DataFrame:
    """The unpaid orders, with ``check_id`` (event id) and ``due_at`` (created_at + delay)."""
    from pyspark.sql import functions as F

    return orders.where(~F.col("paid")).select(
        F.concat(F.lit("order-"), F.col("order_id").cast("string")).alias("check_id"),
        "order_id",
        "customer",
        "amount",
        "created_at",
        (F.col("created_at") + F.make_interval(secs=F.lit(round(delay_hours * 3600, 6)))).alias(
            "due_at"
        ),
    )


def reconcile(
    spark: SparkSession,
    orders: DataFrame,
    *,
    redis_url: str,
    prefix: str = "delayq",
    delay_hours: float = 3.0,
    replace: bool = False,
    strict: bool = False,
    rejects_path: str | None = None,
    batch_size: int = 1000,
) -> EnqueueReport:
    """Schedule a :class:`PaymentCheck` for every unpaid order; return the EnqueueReport."""
    from . import enqueue_dataframe

    return enqueue_dataframe(
        unpaid_orders(orders, delay_hours),
        PaymentCheck,
        redis_url=redis_url,
        prefix=prefix,
        id_col="check_id",
        due_col="due_at",
        context_cols=("customer",),
        replace=replace,
        strict=strict,
        rejects_path=rejects_path,
        batch_size=batch_size,
    )


def export_dead(spark: SparkSession, *, redis_url: str, prefix: str, out: str) -> int:
    """Write the PaymentCheck dead letters to ``out`` as Parquet; return how many."""
    from . import read_queue

    dead = read_queue(
        spark, redis_url=redis_url, prefix=prefix, event_types=[PaymentCheck], states=("dead",)
    ).cache()
    try:
        dead.write.mode("overwrite").parquet(out)
        return dead.count()
    finally:
        dead.unpersist()


# --------------------------------------------------------------------------- command line


def _spark(master: str | None, app: str) -> SparkSession:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master:  # under spark-submit, --master comes from spark-submit instead
        builder = builder.master(master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("DELAYQ_SPARK_LOG_LEVEL", "WARN"))
    return spark


def _read(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    if fmt == "csv":
        return spark.read.csv(
            path,
            header=True,
            schema="order_id LONG, customer STRING, amount DOUBLE, "
            "created_at TIMESTAMP, paid BOOLEAN",
        )
    return spark.read.parquet(path)


def _write(df: DataFrame, path: str, fmt: str) -> None:
    writer = df.write.mode("overwrite")
    if fmt == "csv":
        writer.option("header", True).csv(path)
    else:
        writer.parquet(path)


def _guess_format(path: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    return "csv" if path.rstrip("/").lower().endswith(".csv") else "parquet"


@contextlib.contextmanager
def _redis_url(given: str | None) -> Iterator[str]:
    url = given or os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    from ..testing import RedisServer

    with RedisServer() as server:
        print(
            f"no --redis-url or REDIS_URL: using a throw-away redis-server at {server.url} "
            "(reachable by local Spark only; removed at exit)",
            file=sys.stderr,
        )
        yield server.url


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m delayq.spark",
        description="delayq on Spark: the unpaid-orders reconciliation job.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--master", help="Spark master, e.g. local[*] (default: spark-submit's)")
        p.add_argument("--prefix", default="delayq", help="delayq key prefix (default: delayq)")

    gen = sub.add_parser("generate", help="write a sample orders dataset")
    common(gen)
    gen.add_argument("--out", required=True, help="output path (.csv => CSV, else Parquet)")
    gen.add_argument("--rows", type=int, default=100_000)
    gen.add_argument("--format", choices=("parquet", "csv"))
    gen.add_argument("--seed", type=int, default=7)

    rec = sub.add_parser("reconcile", help="schedule a PaymentCheck for every unpaid order")
    common(rec)
    src = rec.add_mutually_exclusive_group(required=True)
    src.add_argument("--orders", help="orders dataset (Parquet directory/file or CSV)")
    src.add_argument("--generate", type=int, metavar="ROWS", help="generate ROWS sample orders")
    rec.add_argument("--format", choices=("parquet", "csv"), help="format of --orders")
    rec.add_argument("--redis-url", help="Redis URL (default: $REDIS_URL, else a private one)")
    rec.add_argument("--delay-hours", type=float, default=3.0)
    rec.add_argument("--replace", action="store_true", help="replace existing checks")
    rec.add_argument("--strict", action="store_true", help="write nothing if any row is bad")
    rec.add_argument("--rejects", metavar="PATH", help="write rejected rows here (Parquet)")
    rec.add_argument("--export-dead", metavar="PATH", help="also write dead letters (Parquet)")
    rec.add_argument("--batch-size", type=int, default=1000)

    dead = sub.add_parser("export-dead", help="write PaymentCheck dead letters to Parquet")
    common(dead)
    dead.add_argument("--out", required=True)
    dead.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL"), required=not os.environ.get("REDIS_URL")
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m delayq.spark`` and ``scripts/spark_reconcile.py``."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = _spark(args.master, f"delayq-{args.command}")
    try:
        if args.command == "generate":
            fmt = _guess_format(args.out, args.format)
            _write(generate_orders(spark, args.rows, seed=args.seed), args.out, fmt)
            print(f"wrote {args.rows:,} orders to {args.out} ({fmt})")
            return 0
        if args.command == "export-dead":
            n = export_dead(spark, redis_url=args.redis_url, prefix=args.prefix, out=args.out)
            print(f"wrote {n:,} dead letters to {args.out}")
            return 0
        if args.generate is not None:
            orders = generate_orders(spark, args.generate)
        else:
            orders = _read(spark, args.orders, _guess_format(args.orders, args.format))
        with _redis_url(args.redis_url) as url:
            report = reconcile(
                spark,
                orders,
                redis_url=url,
                prefix=args.prefix,
                delay_hours=args.delay_hours,
                replace=args.replace,
                strict=args.strict,
                rejects_path=args.rejects,
                batch_size=args.batch_size,
            )
            print(report)
            if report.rejects is not None and report.rejected:
                print("first rejects:")
                for row in report.rejects.limit(5).collect():
                    print(f"  {row.id}: {row.reason}")
                report.rejects.unpersist()
            if args.export_dead:
                n = export_dead(spark, redis_url=url, prefix=args.prefix, out=args.export_dead)
                print(f"wrote {n:,} dead letters to {args.export_dead}")
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
