"""Cancelling a running handler in another process, and a run whose lease was lost
(issue 36): worker processes run tests/control_worker.py against a private Redis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from core_support import ServicePool, run_cli

from delayq import CancelResult, Event, EventService

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).with_name("control_worker.py")


class CtlJob(Event, event_name="ctl-job"):
    """Same wire name and shape as the workers' class."""

    n: int = 0


class CtlPart(Event, event_name="ctl-part", partitions=3):
    """Same wire name, shape and partitions as the workers' class."""

    n: int = 0


class Workers:
    """Worker processes, each killed when the test ends."""

    def __init__(self, url: str, prefix: str, logs: Path):
        self.url, self.prefix, self.logs = url, prefix, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *extra: str) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, str(WORKER), self.url, self.prefix, name, *extra],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self.procs[name]

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
async def pool(redis_url: str, prefix: str):
    services = ServicePool(redis_url, prefix)
    yield services
    await services.aclose()


@pytest.fixture
def workers(redis_url: str, prefix: str, tmp_path: Path):
    started = Workers(redis_url, prefix, tmp_path)
    yield started
    started.close()


def tkey(prefix: str, what: str) -> str:
    return f"{prefix}-test:{what}"


async def ready(redis_client, prefix: str, wait_for, *names: str) -> None:
    async def all_ready() -> bool:
        members = await redis_client.smembers(tkey(prefix, "ready"))
        return {m.decode() for m in members} >= set(names)

    await wait_for(all_ready, timeout=30)


def field_is(redis_client, prefix: str, what: str, field: str, start: str):
    async def check() -> bool:
        value = await redis_client.hget(tkey(prefix, what), field)
        return value is not None and value.decode().startswith(start)

    return check


async def test_cancel_reaches_a_handler_in_another_process(
    pool, workers, redis_client, prefix, wait_for
) -> None:
    workers.start("w1", "--concurrency", "2")
    workers.start("w2", "--concurrency", "2")
    await ready(redis_client, prefix, wait_for, "w1", "w2")
    producer = pool.producer()
    assert await producer.enqueue_many([CtlJob(id="a"), CtlJob(id="b")]) == [True, True]
    started = tkey(prefix, "started")

    async def both_running() -> bool:
        return await redis_client.hlen(started) == 2

    await wait_for(both_running, timeout=15)
    asked = time.time()
    result = await producer.cancel(CtlJob, "a")
    assert result is CancelResult.SIGNALLED and result
    # the handler sees CancelledError (well within the lease: nothing else could end it),
    # within about a second (milliseconds here; the mark holds the worker's clock)
    await wait_for(field_is(redis_client, prefix, "cancelled", "a", "w"), timeout=5)
    mark = (await redis_client.hget(tkey(prefix, "cancelled"), "a")).decode()
    assert float(mark.rsplit(":", 1)[1]) - asked < 1.0, mark
    assert (await producer.inspect(CtlJob, "a")).state == "absent"
    assert await producer.dead_letters(CtlJob) == []
    assert await redis_client.hget(tkey(prefix, "cancelled"), "b") is None
    assert (await producer.inspect(CtlJob, "b")).state == "in_flight"
    assert await producer.cancel(CtlJob, "a") is CancelResult.UNKNOWN
    assert not await producer.cancel(CtlJob, "a")
    await producer.enqueue_with_delay(CtlJob(id="after"), 5)
    assert await producer.cancel(CtlJob, "after") is CancelResult.REMOVED
    assert await producer.cancel(CtlJob, "b") is CancelResult.SIGNALLED
    await wait_for(field_is(redis_client, prefix, "cancelled", "b", "w"), timeout=5)
    # neither came back (a cancelled event is gone: no retry, no dead letter)
    runs = await redis_client.hgetall(tkey(prefix, "runs"))
    assert runs == {b"a": b"1", b"b": b"1"}
    assert await producer.dead_letters(CtlJob) == []


async def test_cancel_stops_every_groups_run(pool, workers, redis_client, prefix, wait_for) -> None:
    workers.start("g1", "--groups", "audit,mail")
    await ready(redis_client, prefix, wait_for, "g1")
    producer = pool.producer()
    await producer.register_group(CtlJob, "audit")
    await producer.register_group(CtlJob, "mail")
    assert await producer.enqueue_with_delay(CtlJob(id="o"), 0)
    await wait_for(field_is(redis_client, prefix, "started", "o/audit", "g1"), timeout=15)
    await wait_for(field_is(redis_client, prefix, "started", "o/mail", "g1"), timeout=15)
    assert await producer.cancel(CtlJob, "o") is CancelResult.SIGNALLED
    await wait_for(field_is(redis_client, prefix, "cancelled", "o/audit", "g1"), timeout=5)
    await wait_for(field_is(redis_client, prefix, "cancelled", "o/mail", "g1"), timeout=5)
    assert (await producer.inspect(CtlJob, "o")).state == "absent"


async def test_cancel_for_one_group_stops_its_run_and_the_other_groups_run_is_acked(
    pool, workers, redis_client, prefix, wait_for
) -> None:
    # each group's handler in a process of its own
    workers.start("gb", "--groups", "billing", "--release")
    workers.start("gm", "--groups", "mail", "--release")
    await ready(redis_client, prefix, wait_for, "gb", "gm")
    producer = pool.producer()
    await producer.register_group(CtlJob, "billing")
    await producer.register_group(CtlJob, "mail")
    assert await producer.remove_group(CtlJob, "default")  # no process handles it here
    assert await producer.enqueue_with_delay(CtlJob(id="o"), 0)
    await wait_for(field_is(redis_client, prefix, "started", "o/billing", "gb:1"), timeout=15)
    await wait_for(field_is(redis_client, prefix, "started", "o/mail", "gm:1"), timeout=15)
    assert await producer.cancel(CtlJob, "o", group="billing") is CancelResult.SIGNALLED
    await wait_for(field_is(redis_client, prefix, "cancelled", "o/billing", "gb:1"), timeout=5)
    info = await producer.inspect(CtlJob, "o")
    assert info.groups["billing"].state == "absent"
    assert info.groups["mail"].state == "in_flight"
    assert await redis_client.hget(tkey(prefix, "cancelled"), "o/mail") is None
    # billing's is gone: cancelling it there again finds nothing
    assert await producer.cancel(CtlJob, "o", group="billing") is CancelResult.UNKNOWN
    # mail's run goes on, finishes and is acked: the last group done, the event goes
    await redis_client.lpush(tkey(prefix, "release:o/mail"), "go")
    await wait_for(field_is(redis_client, prefix, "done", "o/mail", "gm:1"), timeout=5)

    async def acked() -> bool:
        return (await producer.inspect(CtlJob, "o")).state == "absent"

    await wait_for(acked, timeout=10)
    assert await redis_client.hgetall(tkey(prefix, "runs")) == {b"o/billing": b"1", b"o/mail": b"1"}
    for group in ("billing", "mail"):
        assert await producer.dead_letters(CtlJob, group=group) == []
    assert await producer.cancel(CtlJob, "o") is CancelResult.UNKNOWN


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
async def test_a_run_that_lost_its_lease_is_cancelled_and_its_ack_changes_nothing(
    pool, workers, redis_client, prefix, wait_for
) -> None:
    frozen = workers.start("frozen", "--visibility", "2")
    await ready(redis_client, prefix, wait_for, "frozen")
    producer = pool.producer()
    assert await producer.enqueue_with_delay(CtlJob(id="z"), 0)
    await wait_for(field_is(redis_client, prefix, "started", "z", "frozen:1"), timeout=15)
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        # A longer lease for the newer delivery (a 2 s one could run out too under load,
        # and a third delivery would change the token compared below), but not much longer:
        # the frozen process's BRPOP, first in line, may pop the entry the expired lease
        # put back; it comes back once the scheduler's orphan rule (this visibility) sees it
        workers.start("other", "--visibility", "4")
        # the lease runs out; the other worker's scheduler hands the event on
        await wait_for(field_is(redis_client, prefix, "started", "z", "other:2"), timeout=45)
        leases = f"{{{prefix}:ctl-job}}:leases"
        token = await redis_client.hget(leases, "z")
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    # thawed, the frozen worker's renewal finds its lease gone and cancels its run
    await wait_for(field_is(redis_client, prefix, "cancelled", "z", "frozen:1"), timeout=15)
    # the newer delivery is untouched: same lease, still running, one more attempt only
    assert await redis_client.hget(leases, "z") == token
    info = await producer.inspect(CtlJob, "z")
    assert (info.state, info.attempts) == ("in_flight", 2)
    assert await redis_client.hget(tkey(prefix, "cancelled"), "z") is not None
    assert (await redis_client.hget(tkey(prefix, "cancelled"), "z")).startswith(b"frozen:1")
    assert await producer.cancel(CtlJob, "z") is CancelResult.SIGNALLED
    await wait_for(field_is(redis_client, prefix, "cancelled", "z", "other:2"), timeout=5)


async def test_cancel_on_a_cluster_and_a_partitioned_type(
    cluster, workers, redis_client, redis_url, prefix, wait_for
) -> None:
    workers.url = cluster.url  # the marks go to the plain Redis the test reads
    workers.start("c1", "--cluster", "--marks", redis_url)
    await ready(redis_client, prefix, wait_for, "c1")
    producer = EventService.from_url(cluster.url, cluster=True, prefix=prefix)
    try:
        assert await producer.enqueue_with_delay(CtlJob(id="a"), 0)
        assert await producer.enqueue_many([CtlPart(id=f"p{i}") for i in range(4)]) == [True] * 4
        for run in ("a", "p0", "p1", "p2", "p3"):
            await wait_for(field_is(redis_client, prefix, "started", run, "c1"), timeout=30)
        assert await producer.cancel(CtlJob, "a") is CancelResult.SIGNALLED
        for i in range(4):
            assert await producer.cancel(CtlPart, f"p{i}") is CancelResult.SIGNALLED
        # (a partitioned type's shards hand out the same claim tokens: each run is found
        # by its shard and token)
        for run in ("a", "p0", "p1", "p2", "p3"):
            await wait_for(field_is(redis_client, prefix, "cancelled", run, "c1"), timeout=5)
        assert await producer.cancel(CtlPart, "p0") is CancelResult.UNKNOWN
    finally:
        await producer.aclose()


async def test_delayq_cancel_says_it_stopped_a_running_handler(
    pool, workers, redis_client, redis_url, prefix, wait_for, capsys, monkeypatch
) -> None:
    workers.start("w1")
    await ready(redis_client, prefix, wait_for, "w1")
    producer = pool.producer()
    assert await producer.enqueue_with_delay(CtlJob(id="x"), 0)
    await wait_for(field_is(redis_client, prefix, "started", "x", "w1"), timeout=15)

    async def cancel(*extra: str) -> tuple[int, str]:
        return await run_cli(
            monkeypatch, capsys, redis_url, prefix, "cancel", "ctl-job", "x", *extra
        )

    code, out = await cancel("--json")
    assert code == 0 and json.loads(out)["result"] == "signalled", out
    await wait_for(field_is(redis_client, prefix, "cancelled", "x", "w1"), timeout=5)
    code, out = await cancel()
    assert code == 1 and "no such pending event" in out


async def test_delayq_cancel_for_one_group(pool, redis_url, prefix, capsys, monkeypatch) -> None:
    producer = pool.producer()
    await producer.register_group(CtlJob, "billing")
    await producer.register_group(CtlJob, "mail")
    assert await producer.enqueue_with_delay(CtlJob(id="c"), 3600)

    async def cancel(*extra: str) -> tuple[int, str]:
        return await run_cli(
            monkeypatch, capsys, redis_url, prefix, "cancel", "ctl-job", "c", *extra
        )

    code, out = await cancel("--group", "nobody")
    assert code != 0 and "no delivery group 'nobody'" in out
    code, out = await cancel("--group", "billing", "--json")
    assert code == 0 and json.loads(out)["result"] == "removed", out
    assert json.loads(out)["group"] == "billing"
    info = await producer.inspect(CtlJob, "c")
    assert {g: s.state for g, s in info.groups.items()} == {
        "billing": "absent",
        "default": "scheduled",
        "mail": "scheduled",
    }
    code, out = await cancel("--group", "billing")
    assert code == 1 and "no such pending event" in out
    code, out = await cancel()
    assert code == 0 and out.strip() == "cancelled"
    assert (await producer.inspect(CtlJob, "c")).state == "absent"
