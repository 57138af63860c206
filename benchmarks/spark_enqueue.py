"""Rows/s of bulk enqueue: Spark (``delayq.spark.enqueue_dataframe``) vs async vs raw Lua.

Three ways to put the same N ``PaymentCheck`` events (due in an hour) into one Redis:

1. ``redis-benchmark`` sending EVALSHA of the library's enqueue script with the
   same batch shape (``--chunk`` events per call, random 12-digit ids): the rate
   Redis itself accepts for that script, with nothing else in the way;
2. ``EventService.enqueue_many`` from one asyncio process, ``--async-batch``
   events per call (each call pipelines its 200-event script calls);
3. ``enqueue_dataframe`` on local Spark (``--masters``, default ``local[2]``),
   from a cached DataFrame, validation pass included.

The Redis is a private ``redis-server`` (delayq.testing.RedisServer) started
here, flushed between runs. Besides rows/s, the table shows the share of one
core Redis used during each run (``used_cpu_user + used_cpu_sys`` delta / wall
time): how busy each path keeps Redis.

    .venv/bin/python benchmarks/spark_enqueue.py --rows 1000000
    .venv/bin/python benchmarks/spark_enqueue.py --rows 1000000 --masters local[1],local[2]

With ``--repeat N`` every path runs N times and the fastest run counts (all
rates and the load average after each run are kept in the JSON): other work
on a shared machine only ever makes a run slower.

Writes ``benchmarks/results/spark_enqueue-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psutil
import redis

from delayq import EventService, lua
from delayq.codec import Codec
from delayq.keys import PrefixKeys, TypeKeys
from delayq.spark.demo import PaymentCheck
from delayq.testing import RedisServer

HERE = Path(__file__).resolve().parent


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def sample_event(i: int) -> PaymentCheck:
    return PaymentCheck(
        id=f"order-{i}",
        order_id=i,
        customer=f"customer-{i % 5000}",
        amount=round((i * 7919 % 100_000) / 100 + 1, 2),
        created_at=datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=i % 21_600),
    )


def client_cpu(exclude_pid: int | None) -> float:
    """CPU seconds used so far by this process and everything it started, except Redis.

    Live descendants (the Spark JVM, its Python workers) are read with psutil;
    children that already exited (redis-benchmark) through RUSAGE_CHILDREN.
    """
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system
    for child in me.children(recursive=True):
        if child.pid == exclude_pid:
            continue
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + done.ru_utime + done.ru_stime


class Measure:
    """Times a run, the Redis CPU it caused, and the CPU used outside Redis."""

    def __init__(self, client: redis.Redis, redis_pid: int | None):
        self.client = client
        self.redis_pid = redis_pid

    def __enter__(self) -> Measure:
        self.cpu0 = redis_cpu(self.client)
        self.client0 = client_cpu(self.redis_pid)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.redis_cpu_seconds = redis_cpu(self.client) - self.cpu0
        self.redis_cpu = self.redis_cpu_seconds / self.seconds
        self.client_cpu_seconds = client_cpu(self.redis_pid) - self.client0

    def figures(self, rows: int) -> dict[str, Any]:
        """Rate, time and CPU per row (Redis and the rest) of a run of ``rows`` events."""
        return {
            "rows": rows,
            "seconds": round(self.seconds, 3),
            "rows_per_s": round(rows / self.seconds),
            "redis_cpu": round(self.redis_cpu, 2),
            "redis_cpu_us_per_row": round(self.redis_cpu_seconds / rows * 1e6, 2),
            "client_cpu_us_per_row": round(self.client_cpu_seconds / rows * 1e6, 2),
            "load_after": round(os.getloadavg()[0], 2),
        }


# --------------------------------------------------------------------------- 1. redis-benchmark


def run_redis_benchmark(
    server: RedisServer, rows: int, chunk: int, clients: int, pipeline: int, repeat: int = 1
) -> dict[str, Any]:
    runs = [_redis_benchmark_once(server, rows, chunk, clients, pipeline) for _ in range(repeat)]
    return best(runs)


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of several runs, with every run's rate and the load after it."""
    top = dict(max(runs, key=lambda r: r["rows_per_s"]))
    top["runs_rows_per_s"] = [r["rows_per_s"] for r in runs]
    top["runs_load_after"] = [r["load_after"] for r in runs]
    return top


def _redis_benchmark_once(
    server: RedisServer, rows: int, chunk: int, clients: int, pipeline: int
) -> dict[str, Any]:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return {"error": "redis-benchmark not found"}
    client = redis.Redis.from_url(server.url, protocol=2)
    source = lua.source("enqueue")
    sha = client.script_load(source)
    prefix = "bench-raw"
    keys = TypeKeys(prefix, PaymentCheck.event_name).all()
    # JSON: redis-benchmark takes arguments from argv, which cannot carry the NUL
    # bytes of a MessagePack envelope (the other paths use the default, MessagePack)
    envelope = Codec("json").encode(sample_event(123456)).decode()
    # "<replace>:<call id>:<chunk no>" like store.enqueueing.enqueue: a new (random) call id per request
    args = ["delay", "0:__rand_int__:1", PrefixKeys(prefix).wakeup_channel, PaymentCheck.event_name]
    for _ in range(chunk):
        # every __rand_int__ gets its own random 12-digit number per request
        args += ["order-__rand_int__", envelope, "3600000"]
    calls = max(1, rows // chunk)
    cmd = [
        binary,
        "-h",
        "127.0.0.1",
        "-p",
        str(server.port),
        "-n",
        str(calls),
        "-c",
        str(clients),
        "-P",
        str(pipeline),
        "-r",
        "1000000000",
        "--csv",
        "EVALSHA",
        sha,
        str(len(keys)),
        *keys,
        *args,
    ]
    with Measure(client, server.pid) as m:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    stored = client.hlen(keys[0])
    client.flushall()
    rps = None
    for line in out.splitlines():
        # "test","rps","avg_latency_ms",...: the test name (the command) may hold commas
        if line.startswith('"EVALSHA'):
            rps = float(line.rstrip().split(",")[-7].strip('"'))
    figures = m.figures(calls * chunk)
    if rps:  # redis-benchmark's own rate (excludes its start-up)
        figures["rows_per_s"] = round(rps * chunk)
    return {
        "name": f"redis-benchmark EVALSHA ({chunk}/call, -c {clients} -P {pipeline})",
        "stored": stored,
        "command": " ".join(cmd[:14]) + " ... (" + str(len(cmd) - 14) + " more args)",
        **figures,
    }


# --------------------------------------------------------------------------- 2. async enqueue_many


async def _async_enqueue(
    server: RedisServer, rows: int, batch: int, client: redis.Redis
) -> dict[str, Any]:
    events = [sample_event(i) for i in range(rows)]
    service = EventService.from_url(server.url, prefix="bench-async")
    try:
        with Measure(client, server.pid) as m:
            for i in range(0, rows, batch):
                await service.enqueue_many(events[i : i + batch], delay=3600)
        counts = await service.stats_for(PaymentCheck)
    finally:
        await service.aclose()
    return {
        "name": f"EventService.enqueue_many (1 process, {batch}/call)",
        "stored": counts.scheduled,
        **m.figures(rows),
    }


def run_async(server: RedisServer, rows: int, batch: int, repeat: int = 1) -> dict[str, Any]:
    client = redis.Redis.from_url(server.url, protocol=2)
    runs = []
    for _ in range(repeat):
        try:
            runs.append(asyncio.run(_async_enqueue(server, rows, batch, client)))
        finally:
            client.flushall()
    return best(runs)


# --------------------------------------------------------------------------- 3. spark


def run_spark(
    server: RedisServer, rows: int, master: str, partitions: int, batch_size: int, repeat: int = 1
) -> dict[str, Any]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from delayq.spark import enqueue_dataframe

    spark = (
        SparkSession.builder.master(master)
        .appName("delayq-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    client = redis.Redis.from_url(server.url, protocol=2)
    try:
        df = (
            spark.range(rows, numPartitions=partitions)
            .select(
                F.concat(F.lit("order-"), F.col("id").cast("string")).alias("check_id"),
                F.col("id").alias("order_id"),
                F.concat(F.lit("customer-"), (F.col("id") % 5000).cast("string")).alias("customer"),
                F.round((F.col("id") * 7919 % 100_000) / 100 + 1, 2).alias("amount"),
                (
                    F.lit(datetime(2026, 1, 1, tzinfo=timezone.utc))
                    + F.make_interval(secs=F.col("id") % 21_600)
                ).alias("created_at"),
                (F.current_timestamp() + F.expr("INTERVAL 1 HOUR")).alias("due_at"),
            )
            .cache()
        )
        df.count()  # materialize: measure delayq, not data generation
        # warm-up: JVM JIT and Python workers (a tiny run on another prefix)
        warm = df.limit(min(rows, 200_000)).cache()
        warm.count()
        enqueue_dataframe(
            warm,
            PaymentCheck,
            redis_url=server.url,
            prefix="bench-warm",
            id_col="check_id",
            due_col="due_at",
            cluster=False,
        )
        warm.unpersist()
        client.flushall()
        runs = []
        for _ in range(repeat):
            with Measure(client, server.pid) as m:
                report = enqueue_dataframe(
                    df,
                    PaymentCheck,
                    redis_url=server.url,
                    prefix="bench-spark",
                    id_col="check_id",
                    due_col="due_at",
                    batch_size=batch_size,
                    cluster=False,
                )
            stored = client.zcard(TypeKeys("bench-spark", PaymentCheck.event_name).scheduled)
            client.flushall()
            runs.append(
                {
                    "name": f"enqueue_dataframe on {master} ({partitions} partitions, "
                    f"batch {batch_size})",
                    "stored": stored,
                    "scheduled": report.scheduled,
                    "validation_seconds": round(report.validation_seconds, 3),
                    # the write pass alone: Redis does nothing during validation
                    "write_rows_per_s": round(rows / (m.seconds - report.validation_seconds)),
                    "write_redis_cpu": round(
                        m.redis_cpu_seconds / (m.seconds - report.validation_seconds), 2
                    ),
                    **m.figures(rows),
                }
            )
        df.unpersist()
    finally:
        spark.stop()
        client.flushall()
    return best(runs)


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--masters", default="local[2]", help="comma-separated Spark masters")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--chunk", type=int, default=200, help="events per script call (raw)")
    parser.add_argument("--bench-clients", type=int, default=4, help="redis-benchmark -c")
    parser.add_argument("--bench-pipeline", type=int, default=4, help="redis-benchmark -P")
    parser.add_argument("--async-batch", type=int, default=10_000)
    parser.add_argument("--skip", default="", help="comma-separated: raw,async,spark")
    parser.add_argument("--repeat", type=int, default=1, help="runs per path; the best counts")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    load = os.getloadavg()
    if load[0] > 2:
        print(
            f"warning: load average {load[0]:.2f} > 2: other work shares the CPUs", file=sys.stderr
        )

    results: list[dict[str, Any]] = []
    with RedisServer() as server:
        version = redis.Redis.from_url(server.url).info("server")["redis_version"]
        if "raw" not in skip:
            results.append(
                run_redis_benchmark(
                    server,
                    args.rows,
                    args.chunk,
                    args.bench_clients,
                    args.bench_pipeline,
                    args.repeat,
                )
            )
            print(results[-1], file=sys.stderr)
        if "async" not in skip:
            results.append(run_async(server, args.rows, args.async_batch, args.repeat))
            print(results[-1], file=sys.stderr)
        if "spark" not in skip:
            for master in filter(None, args.masters.split(",")):
                results.append(
                    run_spark(
                        server, args.rows, master, args.partitions, args.batch_size, args.repeat
                    )
                )
                print(results[-1], file=sys.stderr)

    raw = next((r["rows_per_s"] for r in results if r["name"].startswith("redis-benchmark")), None)
    print()
    print(
        f"{args.rows:,} PaymentCheck events, Redis {version}, {os.cpu_count()} CPUs, "
        f"load before {load[0]:.2f}"
    )
    print(
        f"{'path':<58} {'rows/s':>9} {'vs raw':>6} {'seconds':>7} {'redis':>5} "
        f"{'µs/row redis':>12} {'µs/row rest':>11}  all runs (load after)"
    )
    for r in results:
        share = f"{r['rows_per_s'] / raw:.0%}" if raw else "-"
        runs = ", ".join(
            f"{x:,} ({load:.1f})" for x, load in zip(r["runs_rows_per_s"], r["runs_load_after"])
        )
        print(
            f"{r['name']:<58} {r['rows_per_s']:>9,} {share:>6} {r['seconds']:>7.2f} "
            f"{r['redis_cpu']:>5.2f} {r['redis_cpu_us_per_row']:>12.2f} "
            f"{r['client_cpu_us_per_row']:>11.2f}  {runs}"
        )
    for r in results:
        if "write_rows_per_s" in r:
            share = f" ({r['write_rows_per_s'] / raw:.0%} of raw)" if raw else ""
            print(
                f"  {r['name']}: validation pass {r['validation_seconds']:.2f} s; write pass "
                f"{r['write_rows_per_s']:,} rows/s{share}, Redis busy {r['write_redis_cpu']:.2f}"
            )
    print(
        "redis = share of one core Redis used; µs/row = CPU time per event in Redis and in "
        "everything else this benchmark started (client, JVM, Python workers)"
    )
    out_dir = HERE / "results"
    out_dir.mkdir(exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = out_dir / f"spark_enqueue-{stamp}.json"
    path.write_text(
        json.dumps(
            {
                "benchmark": "spark_enqueue",
                "when": stamp,
                "argv": sys.argv[1:],
                "rows": args.rows,
                "redis_version": version,
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "load_before": load,
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {path.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
