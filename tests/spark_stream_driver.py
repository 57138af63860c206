"""The driver of tests/test_spark_stream.py: a streaming query from JSON files into delayq.

Run as a subprocess (so the test can SIGKILL it and start it again from the
checkpoint): ``python -c "import spark_stream_driver as d, sys; d.main(sys.argv[1:])"
<master> <input dir> <checkpoint> <redis url> <prefix> <out dir>`` (imported by its
name, not run as ``__main__``: the executors must find the event class as
``spark_stream_driver.StreamOrder``). Processes every file there is
(``availableNow``), 4 files per micro-batch, through ``stream_sink``; appends
each batch's report and rejects, as JSON lines, to files in ``<out dir>``.
The executors import this module (for ``StreamOrder``): the session puts this
directory on their PYTHONPATH.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import msgspec

from delayq import Event

HERE = Path(__file__).resolve().parent


class StreamOrder(Event, event_name="stream-order"):
    order_id: int
    amount: Annotated[float, msgspec.Meta(ge=0)]


SCHEMA = "id STRING, order_id LONG, amount DOUBLE"
SINK_NAME = "orders"


def main(argv: list[str]) -> None:
    """Run the query until every file present is processed."""
    from pyspark.sql import SparkSession

    from delayq.spark import EnqueueReport, stream_sink

    assert __name__ == "spark_stream_driver", "run it as the module spark_stream_driver"
    master, source, checkpoint, redis_url, prefix, out = argv
    session = (
        SparkSession.builder.master(master)
        .appName("delayq-stream-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.sql.shuffle.partitions", "4")
        # the executors import this module, and delayq from this checkout
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join([str(HERE.parent), str(HERE)]))
        .config("spark.task.maxFailures", "8")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    outdir = Path(out)

    def on_batch(report: EnqueueReport) -> None:
        line = {
            "pid": os.getpid(),
            "batch": report.batch_id,
            "rows": report.rows,
            "scheduled": report.scheduled,
            "kept": report.kept,
            "skipped": report.skipped,
            "rejected": report.rejected,
            "seconds": report.seconds,
        }
        with open(outdir / "batches.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    def on_rejects(rejects: Any, batch_id: int) -> None:
        with open(outdir / "rejects.jsonl", "a") as f:
            for row in rejects.collect():
                f.write(json.dumps({"batch": batch_id, **row.asDict()}) + "\n")

    sink = stream_sink(
        StreamOrder,
        name=SINK_NAME,
        redis_url=redis_url,
        prefix=prefix,
        batch_size=25,  # many round trips: the test sees a batch half-written
        on_batch=on_batch,
        on_rejects=on_rejects,
    )
    stream = session.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 4).json(source)
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    (outdir / f"started-{os.getpid()}").touch()
    query.awaitTermination()
    session.stop()
