"""stream_sink on a multi-process Spark cluster (``local-cluster[2,1,1024]``: two executor
JVMs with their own Python workers), with the driver SIGKILLed mid-batch and restarted
from its checkpoint, then an executor SIGKILLed mid-batch: every row's event is handled
exactly once by an EventService running here.

The driver is ``spark_stream_driver.py``, run as a subprocess in its own process group
(SIGKILL of the group: the Python driver, its JVM and the executors die at once).
Marked ``spark`` and ``slow`` (two cluster starts: a few minutes on a loaded machine).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from delayq import EventService, QueueCounts
from delayq.keys import TypeKeys

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FILES = 12  # 4 per micro-batch: 3 batches
ROWS_PER_FILE = 1500
BATCH_ROWS = 4 * ROWS_PER_FILE
BAD = {"bad-negative": -1.0, "bad-order": None}  # rejected: amount < 0, order_id null


def write_inputs(source: Path) -> set[str]:
    """The input files (written before the query starts); returns the valid ids."""
    source.mkdir()
    ids = set()
    for f in range(FILES):
        lines = []
        for i in range(ROWS_PER_FILE):
            oid = f"o-{f}-{i}"
            ids.add(oid)
            lines.append(json.dumps({"id": oid, "order_id": f * ROWS_PER_FILE + i, "amount": 1.5}))
        if f == 5:  # batch 1: the one the driver dies in
            lines.append(json.dumps({"id": "bad-negative", "order_id": 1, "amount": -1.0}))
            lines.append(json.dumps({"id": "bad-order", "order_id": "x", "amount": 2.0}))
        tmp = source / f".part-{f:03d}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(source / f"part-{f:03d}.json")
    return ids


DRIVER = "import spark_stream_driver as d, sys; d.main(sys.argv[1:])"


def kill_group(driver: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver's process group (its JVM and the executors too); reap the driver."""
    try:
        os.killpg(driver.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    driver.wait()


def start_driver(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE)])
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", DRIVER, *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the JVM and executors too
        )


def tail(log: Path) -> str:
    return log.read_text()[-3000:]


def executors_of(group: int) -> list[int]:
    """Pids of the executor JVMs in a process group."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        pgid = int(stat.rsplit(")", 1)[1].split()[2])
        if pgid == group and b"CoarseGrainedExecutorBackend" in cmdline:
            found.append(int(entry.name))
    return found


async def wait_mid_batch(
    client: Any, ledger: str, batch: int, driver: subprocess.Popen[bytes], log: Path
) -> int:
    """Wait until the sink has written part, not all, of ``batch``; return how many rows."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 600  # two cluster starts on a loaded 2-core machine
    while loop.time() < deadline:
        written = int(await client.zcount(ledger, batch, batch))
        if 0 < written < BATCH_ROWS - 500:
            return written
        if written or int(await client.zcount(ledger, batch + 1, "+inf")):
            pytest.fail(f"batch {batch} was written whole before the test saw it half-written")
        if driver.poll() is not None:
            pytest.fail(f"the driver exited ({driver.returncode}):\n{tail(log)}")
        await asyncio.sleep(0.003)
    pytest.fail(f"batch {batch} was not written within 600 s:\n{tail(log)}")


async def test_exactly_once_across_driver_and_executor_kills(
    redis_url: str, prefix: str, tmp_path: Path, wait_for: Any
) -> None:
    from spark_stream_driver import SINK_NAME, StreamOrder

    expected = write_inputs(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    log = tmp_path / "driver.log"
    args = [
        "local-cluster[2,1,1024]",
        str(tmp_path / "in"),
        str(tmp_path / "checkpoint"),
        redis_url,
        prefix,
        str(out),
    ]
    ledger = TypeKeys(prefix, StreamOrder.event_name).sink(SINK_NAME)
    handled: Counter[str] = Counter()

    async def handle(event: StreamOrder) -> None:
        handled[event.id] += 1

    client = aioredis.Redis.from_url(redis_url)
    try:
        async with EventService.from_url(redis_url, prefix=prefix) as service:
            service.add_handler(StreamOrder, handle, concurrency=16)

            # 1. the driver dies (SIGKILL, with its JVM and executors) in batch 1's write pass
            driver = start_driver(args, log)
            try:
                written = await wait_mid_batch(client, ledger, 1, driver, log)
            finally:
                kill_group(driver)
            # what batch 1 wrote before the kill is handled before the replay
            await wait_for(lambda: len(handled) >= BATCH_ROWS + written, timeout=120)

            # 2. restarted from the checkpoint: batch 1 is replayed; an executor dies in batch 2
            driver = start_driver(args, log)
            try:
                await wait_mid_batch(client, ledger, 2, driver, log)
                victims = executors_of(driver.pid)
                assert victims, "no executor process found"
                os.kill(victims[0], signal.SIGKILL)
                rc = await asyncio.to_thread(driver.wait, 600)
            finally:
                kill_group(driver)  # executors left behind, if any
            assert rc == 0, tail(log)

            await wait_for(lambda: len(handled) >= len(expected), timeout=120)
            counts = QueueCounts(0, 0, 0, 0)
            await wait_for(lambda: _stats_are(service, StreamOrder, counts), timeout=60)
    finally:
        await client.aclose()

    assert set(handled) == expected
    assert [i for i, n in handled.items() if n != 1] == []
    reports = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]
    # the replay of batch 1 found the rows the killed driver had written, and skipped them
    replays = [r for r in reports if r["batch"] == 1]
    assert len(replays) == 1 and replays[0]["skipped"] >= written, reports
    assert replays[0]["scheduled"] + replays[0]["skipped"] == BATCH_ROWS
    assert sum(r["rows"] for r in reports) == FILES * ROWS_PER_FILE + len(BAD)
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert {r["id"] for r in rejects} == set(BAD)
    assert all(r["batch"] == 1 and r["reason"] for r in rejects)


async def _stats_are(service: EventService, event_type: Any, counts: QueueCounts) -> bool:
    return await service.stats_for(event_type) == counts
