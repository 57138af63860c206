"""The Spark streaming sink: its rows/s against enqueue_dataframe, and arrival-to-scheduled latency.

1. Throughput. The same cached DataFrame of N ``PaymentCheck`` rows (due in an
   hour) is written by ``enqueue_dataframe`` and by one ``stream_sink`` batch
   (``sink(df, batch_id)``, what ``foreachBatch`` calls), alternating A/B
   ``--repeat`` times on a private redis-server flushed between runs. The table
   shows rows/s (wall clock, both passes), Redis CPU per row (``INFO cpu`` delta:
   what the ledger costs inside the script) and Redis memory per row after the
   run (the sink's also holds its ledger).
2. Latency. A streaming query from the rate source (``--rate`` rows/s for
   ``--seconds``, ``--trigger`` processing-time trigger) through ``stream_sink``,
   events due now. A row's arrival is the rate source's ``timestamp`` (carried in
   ``created_at``); its scheduling is the due time the enqueue script recorded
   (Redis's clock at the write: the ready entry ``"<due ms>:<id>"``). The table
   shows percentiles of the difference, and the batches' durations.

    .venv/bin/python benchmarks/spark_stream.py --rows 200000 --repeat 2

Writes ``benchmarks/results/spark_stream-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis

from delayq.codec import Codec
from delayq.keys import TypeKeys
from delayq.spark.demo import PaymentCheck
from delayq.testing import RedisServer

HERE = Path(__file__).resolve().parent


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def session(master: str, partitions: int) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master(master)
        .appName("delayq-bench-stream")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def throughput(
    spark: Any, url: str, rows: int, partitions: int, repeat: int
) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    from delayq.spark import enqueue_dataframe, stream_sink

    client = redis.Redis.from_url(url, protocol=2)
    df = (
        spark.range(0, rows, numPartitions=partitions)
        .select(
            F.concat(F.lit("check-"), F.col("id").cast("string")).alias("id"),
            F.col("id").alias("order_id"),
            F.concat(F.lit("c-"), (F.col("id") % 97).cast("string")).alias("customer"),
            ((F.col("id") % 1000) / 4).alias("amount"),
            F.current_timestamp().alias("created_at"),
        )
        .withColumn("delay", F.lit(3600))
        .cache()
    )
    df.count()
    results: dict[str, list[dict[str, Any]]] = {"enqueue_dataframe": [], "stream_sink": []}
    try:
        for r in range(repeat):
            for name in ("enqueue_dataframe", "stream_sink"):
                client.flushall()
                base_mem = int(client.info("memory")["used_memory"])
                cpu0, t0 = redis_cpu(client), time.perf_counter()
                if name == "enqueue_dataframe":
                    report = enqueue_dataframe(
                        df, PaymentCheck, redis_url=url, prefix="bench", delay_col="delay",
                        cluster=False,
                    )  # fmt: skip
                else:
                    sink = stream_sink(
                        PaymentCheck, name="bench", redis_url=url, prefix="bench",
                        delay_col="delay", cluster=False,
                    )  # fmt: skip
                    sink(df, r)
                    report = sink.last
                    assert report is not None
                wall = time.perf_counter() - t0
                cpu = redis_cpu(client) - cpu0
                mem = int(client.info("memory")["used_memory"]) - base_mem
                assert report.scheduled == rows, report
                results[name].append(
                    {
                        "rows_per_s": rows / wall,
                        "seconds": wall,
                        "redis_cpu_us_per_row": cpu / rows * 1e6,
                        "redis_bytes_per_row": mem / rows,
                        "load": os.getloadavg()[0],
                    }
                )
    finally:
        df.unpersist()
        client.flushall()
        client.close()
    out = []
    for name, runs in results.items():
        best = max(runs, key=lambda x: x["rows_per_s"])
        out.append({"path": name, "runs": runs, **best})
    return out


def latency(
    spark: Any, url: str, rate: int, seconds: float, trigger: str, partitions: int
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from delayq.spark import EnqueueReport, stream_sink

    client = redis.Redis.from_url(url, protocol=2)
    client.flushall()
    reports: list[EnqueueReport] = []
    sink = stream_sink(
        PaymentCheck, name="latency", redis_url=url, prefix="lat", cluster=False,
        on_batch=reports.append,
    )  # fmt: skip
    stream = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .option("numPartitions", partitions)
        .load()
        .select(
            F.concat(F.lit("check-"), F.col("value").cast("string")).alias("id"),
            F.col("value").alias("order_id"),
            F.lit("c").alias("customer"),
            F.lit(1.0).alias("amount"),
            F.col("timestamp").alias("created_at"),
        )
    )
    query = stream.writeStream.foreachBatch(sink).trigger(processingTime=trigger).start()
    try:
        time.sleep(seconds)  # the run's length (a benchmark, not a test)
    finally:
        query.stop()
    keys = TypeKeys("lat", PaymentCheck.event_name)
    entries = [e.decode() for e in client.lrange(keys.ready, 0, -1)]
    codec = Codec()
    lat_ms = []
    for i in range(0, len(entries), 1000):
        part = [e.split(":", 1) for e in entries[i : i + 1000]]
        envs = client.hmget(keys.events, [eid for _, eid in part])
        for (due, eid), env in zip(part, envs):
            event, _ = codec.decode(env, PaymentCheck, eid)
            assert event.created_at is not None
            lat_ms.append(int(due) - event.created_at.timestamp() * 1000)
    client.flushall()
    client.close()
    lat_ms.sort()
    batches = [r.seconds for r in reports if r.rows]

    def pct(p: float) -> float:
        return lat_ms[min(len(lat_ms) - 1, int(p * len(lat_ms)))] if lat_ms else float("nan")

    return {
        "rate": rate,
        "seconds": seconds,
        "trigger": trigger,
        "events": len(lat_ms),
        "batches": len(batches),
        "batch_seconds_median": statistics.median(batches) if batches else float("nan"),
        "p50_ms": pct(0.5),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "max_ms": lat_ms[-1] if lat_ms else float("nan"),
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--trigger", default="1 second")
    args = parser.parse_args()

    spark = session(args.master, args.partitions)
    with RedisServer() as server:
        tp = throughput(spark, server.url, args.rows, args.partitions, args.repeat)
        lat = latency(spark, server.url, args.rate, args.seconds, args.trigger, args.partitions)
    spark.stop()

    print(
        f"\n{args.rows:,} rows, {args.master}, {args.partitions} partitions, best of {args.repeat}"
    )
    print("| path | rows/s | Redis CPU µs/row | Redis bytes/row | load |")
    print("|---|---:|---:|---:|---:|")
    for r in tp:
        print(
            f"| {r['path']} | {r['rows_per_s']:,.0f} | {r['redis_cpu_us_per_row']:.2f} "
            f"| {r['redis_bytes_per_row']:.0f} | {r['load']:.1f} |"
        )
    print(
        f"\nrate source {lat['rate']} rows/s for {lat['seconds']:.0f} s, trigger {lat['trigger']}: "
        f"{lat['events']:,} events in {lat['batches']} batches (median batch "
        f"{lat['batch_seconds_median']:.2f} s)"
    )
    print("| arrival → scheduled | p50 | p95 | p99 | max |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| ms | {lat['p50_ms']:,.0f} | {lat['p95_ms']:,.0f} | {lat['p99_ms']:,.0f} "
        f"| {lat['max_ms']:,.0f} |"
    )
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = HERE / "results" / f"spark_stream-{stamp}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "command": " ".join(sys.argv),
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "throughput": tp,
                "latency": lat,
            },
            indent=2,
        )
    )
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
