"""No member's completion lost or counted twice, and a batch's callback enqueued once,
whatever process is SIGKILLed at whatever step of a batch (docs/WORKFLOWS.md, "Batches";
the steps are named in delayq/runtime/relay.py and delayq/operations/batches.py).

Worker and producer processes (tests/batch_worker.py) kill themselves with SIGKILL right
after a named step; a second worker takes the scheduler lock over, and its relay (and its
sweep of the batch shards) finishes the work.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from delayq import EventService
from delayq.keyspace.layout import PrefixKeys
from delayq.keyspace.shards import BATCH_SHARDS, BATCH_TYPE, shards

WORKER = Path(__file__).with_name("batch_worker.py")
sys.path.insert(0, str(WORKER.parent))
from batch_worker import Adder, Done, Member  # noqa: E402
from test_dependencies_kill import _exited, _runs, _slot, _stop  # noqa: E402


def _spawn(
    url: str, prefix: str, mode: str, stop_at: str | None, cluster: bool, *extra: str
) -> Any:
    import os
    import subprocess

    cmd = [sys.executable, str(WORKER), url, prefix, mode, *extra]
    if stop_at:
        cmd += ["--stop-at", stop_at]
    if cluster:
        cmd.append("--cluster")
    env = {**os.environ, "PYTHONPATH": str(WORKER.parent.parent)}
    return subprocess.Popen(cmd, env=env)


async def _leftovers(client: Any, prefix: str) -> list[bytes]:
    """Relay and link state left once everything is done (none expected)."""
    keys = PrefixKeys(prefix)
    out: list[bytes] = []
    for shard in (
        "bk-member",
        "bk-plain",
        "bk-adder",
        "bk-done",
        *shards(BATCH_TYPE, BATCH_SHARDS),
    ):
        tk = keys.for_shard(shard)
        out += [k for k in await client.hkeys(tk.deps) if not k.startswith((b"f:", b"c:", b"b:"))]
        out += await client.zrange(tk.relay, 0, -1)
        out += await client.zrange(tk.waiting, 0, -1)
        if shard.startswith(BATCH_TYPE):
            out += await client.zrange(tk.batch_unconfirmed, 0, -1)
            out += await client.zrange(tk.batch_open, 0, -1)
            out += await client.zrange(tk.batch_closed, 0, -1)
    return out


async def _finished(client: Any, prefix: str, wait_for: Any) -> dict[str, int]:
    async def ran() -> bool:
        return (await _runs(client, prefix)).get("bk-done:done") == 1

    async def clean() -> bool:
        return await _leftovers(client, prefix) == []

    await wait_for(ran, timeout=30)
    await wait_for(clean, timeout=15)
    return await _runs(client, prefix)


async def run_relay_kill(url: str, prefix: str, step: str, wait_for: Any, cluster: bool) -> None:
    """Kill the relaying worker right after ``step`` of a member completion's hand-on; a
    second worker finishes. Two members: the first done while the second waits."""
    client: Any = aioredis.RedisCluster.from_url(url) if cluster else aioredis.Redis.from_url(url)
    first = _spawn(url, prefix, "work", step, cluster)
    second = None
    try:
        await wait_for(lambda: client.scard(f"{prefix}-ready"), timeout=20)
        async with EventService.from_url(
            url, cluster=cluster, prefix=prefix, enable_scheduling=False
        ) as producer:
            async with producer.batch(on_complete=Done(id="done")) as batch:
                await batch.enqueue_with_delay(Member(id="m1"), 0.3)
                await batch.enqueue_with_delay(Member(id="m2"), 3600)
            assert await _exited(first, 20) == -signal.SIGKILL
            second = _spawn(url, prefix, "work", None, cluster)

            async def m1_handed_on() -> bool:
                info = await producer.batch_info(batch.id)
                return (info.succeeded, info.pending) == (1, 1)

            await wait_for(m1_handed_on, timeout=20)
            assert (await producer.batch_info(batch.id)).state == "waiting"
            await producer.enqueue_with_delay(Member(id="m2"), 0, replace=True)
            runs = await _finished(client, prefix, wait_for)
            assert runs == {"bk-member:m1": 1, "bk-member:m2": 1, "bk-done:done": 1}
            assert await client.get(f"{prefix}-seen") == b"2 2 0"
            info = await producer.batch_info(batch.id)
            assert (info.state, info.total, info.succeeded, info.pending) == ("done", 2, 2, 0)
    finally:
        _stop(first)
        if second is not None:
            _stop(second)
        await client.aclose()


@pytest.mark.parametrize("step", ["read", "applied", "relayed"])
async def test_the_relay_killed_after_each_step(redis_url, prefix, wait_for, step):
    await run_relay_kill(redis_url, prefix, step, wait_for, cluster=False)


# after each step of opening and adding: (total, succeeded) the batch ends with, and
# whether the member ran (killed before its enqueue, it never does and is dropped)
PRODUCER_STEPS = {
    "opened": (0, 0, False),  # no callback was enqueued: nothing runs
    "callbacks": (0, 0, False),
    "added": (0, 0, False),
    "prelinked": (0, 0, False),
    "enqueued": (1, 1, True),  # done before its add's link: its completion counts
    "linked": (1, 1, True),
    "applied": (1, 1, True),
}


@pytest.mark.parametrize(
    "step,plain",
    [(step, False) for step in PRODUCER_STEPS]
    # a member whose type keeps no results: done before the sweep links it, it leaves no
    # result to answer with (its completion reaches the batch through the relay)
    + [(step, True) for step in ("added", "prelinked", "enqueued", "linked")],
)
async def test_the_producer_killed_between_steps(redis_url, prefix, wait_for, step, plain):
    client = aioredis.Redis.from_url(redis_url)
    worker = _spawn(redis_url, prefix, "work", None, False)
    try:
        await wait_for(lambda: client.scard(f"{prefix}-ready"), timeout=20)
        async with EventService.from_url(
            redis_url, prefix=prefix, enable_scheduling=False
        ) as service:
            extra = ["--plain"] if plain else []
            producer = _spawn(redis_url, prefix, "produce", step, False, *extra)
            assert await _exited(producer, 20) == -signal.SIGKILL
            (listed,) = await service.batches()
            total, succeeded, member_ran = PRODUCER_STEPS[step]

            async def done() -> bool:
                return (await service.batch_info(listed.id)).state == "done"

            await wait_for(done, timeout=20)
            if step != "opened":
                runs = await _finished(client, prefix, wait_for)
                assert runs.get("bk-done:done") == 1
                assert await client.get(f"{prefix}-seen") == f"{total} {succeeded} 0".encode()
            else:
                # done: its completion is then handed on (to no callback) by the relay

                async def clean() -> bool:
                    return await _leftovers(client, prefix) == []

                await wait_for(clean, timeout=20)
                runs = await _runs(client, prefix)
                assert "bk-done:done" not in runs
            member = "bk-plain:m" if plain else "bk-member:m"
            assert runs.get(member, 0) == (1 if member_ran else 0)
            info = await service.batch_info(listed.id)
            assert (info.total, info.succeeded, info.unconfirmed) == (total, succeeded, 0)
            # a member linked before its enqueue that never came leaves no link behind
            assert await _links(client, prefix) == []
    finally:
        _stop(worker)
        await client.aclose()


async def _links(client: Any, prefix: str) -> list[bytes]:
    """The members' dependency fields left (none once every completion is handed on)."""
    keys = PrefixKeys(prefix)
    out: list[bytes] = []
    for t in ("bk-member", "bk-plain", "bk-adder"):
        out += await client.hkeys(keys.for_shard(t).deps)
    return out


@pytest.mark.parametrize("step", ["added", "prelinked", "enqueued", "linked", "applied"])
async def test_a_member_adding_killed_between_steps(redis_url, prefix, wait_for, step):
    """A running member adds a member whose type keeps no results to its own batch and
    is SIGKILLed right after ``step`` of that add; its retry (on a second worker, once
    the member it enqueued, if it did, is done) adds the same member again: the member
    runs once, and counts once."""
    client = aioredis.Redis.from_url(redis_url)
    first = _spawn(redis_url, prefix, "work", None, False, "--stop-at-batch", step)
    second = None
    try:
        await wait_for(lambda: client.scard(f"{prefix}-ready"), timeout=20)
        async with EventService.from_url(
            redis_url, prefix=prefix, enable_scheduling=False
        ) as service:
            async with service.batch(on_complete=Done(id="done")) as batch:
                await batch.enqueue_with_delay(Adder(id="a"), 0)
            assert await _exited(first, 20) == -signal.SIGKILL
            second = _spawn(redis_url, prefix, "work", None, False)
            runs = await _finished(client, prefix, wait_for)
            assert runs == {"bk-adder:a": 2, "bk-plain:x": 1, "bk-done:done": 1}
            assert await client.get(f"{prefix}-seen") == b"2 2 0"
            info = await service.batch_info(batch.id)
            assert (info.total, info.succeeded, info.unconfirmed) == (2, 2, 0)
            assert await _links(client, prefix) == []
    finally:
        _stop(first)
        if second is not None:
            _stop(second)
        await client.aclose()


async def test_the_relay_killed_on_a_cluster(cluster, prefix, wait_for):
    """Members and their batch on different slots of the 3-master cluster; the relaying
    worker is SIGKILLed after applying a member's completion in the batch's slot."""
    from delayq.testing.cluster import RedisClusterServer

    assert isinstance(cluster, RedisClusterServer)
    tags = {PrefixKeys(prefix).for_shard(s).tag for s in shards(BATCH_TYPE, BATCH_SHARDS)}
    assert len({_slot(t) for t in tags} | {_slot(f"{{{prefix}:bk-member}}")}) > 2
    await run_relay_kill(cluster.url, prefix, "applied", wait_for, cluster=True)
