"""No completion lost or applied twice whatever process is SIGKILLed at whatever step of a
dependency's hand-over (docs/WORKFLOWS.md, "Dependencies"; the steps are named in
delayq/runtime/relay.py and delayq/operations/dependencies.py).

Worker and producer processes (tests/dependency_worker.py) kill themselves with SIGKILL
right after a named step; a second worker takes the scheduler lock over and its relay
finishes the work. The child has two parents: a completion applied twice would release it
while the second parent is still pending.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from delayq import EventService

WORKER = Path(__file__).with_name("dependency_worker.py")
sys.path.insert(0, str(WORKER.parent))
from dependency_worker import Child, Parent  # noqa: E402


def _spawn(
    url: str, prefix: str, mode: str, stop_at: str | None, cluster: bool
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(WORKER), url, prefix, mode]
    if stop_at:
        cmd += ["--stop-at", stop_at]
    if cluster:
        cmd.append("--cluster")
    env = {**os.environ, "PYTHONPATH": str(WORKER.parent.parent)}
    return subprocess.Popen(cmd, env=env)


async def _exited(proc: subprocess.Popen[bytes], timeout: float) -> int:
    for _ in range(int(timeout * 20)):
        code = proc.poll()
        if code is not None:
            return code
        await asyncio.sleep(0.05)
    raise AssertionError(f"{proc.args} did not exit")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _runs(client: Any, prefix: str) -> dict[str, int]:
    raw = await client.hgetall(f"{prefix}-runs")
    return {k.decode(): int(v) for k, v in raw.items()}


async def _leftovers(client: Any, prefix: str) -> list[bytes]:
    """Dependency state left once everything is done (none expected)."""
    out: list[bytes] = []
    for t in ("dk-parent", "dk-child"):
        out += await client.hkeys(f"{{{prefix}:{t}}}:deps")
        out += await client.zrange(f"{{{prefix}:{t}}}:relay", 0, -1)
        out += await client.zrange(f"{{{prefix}:{t}}}:waiting", 0, -1)
    return out


async def _settled(client: Any, prefix: str, wait_for: Any, child: str) -> None:
    """Wait until the child ran once and no dependency state is left."""

    async def ran() -> bool:
        return (await _runs(client, prefix)).get(f"dk-child:{child}") == 1

    async def clean() -> bool:
        return await _leftovers(client, prefix) == []

    await wait_for(ran, timeout=20)
    await wait_for(clean, timeout=10)


async def run_relay_kill(url: str, prefix: str, step: str, wait_for: Any, cluster: bool) -> None:
    """Kill the relaying worker right after ``step``; a second worker finishes."""
    client: Any = aioredis.RedisCluster.from_url(url) if cluster else aioredis.Redis.from_url(url)
    first = _spawn(url, prefix, "work", step, cluster)
    second = None
    try:
        await wait_for(lambda: client.scard(f"{prefix}-ready"), timeout=20)
        async with EventService.from_url(
            url, cluster=cluster, prefix=prefix, enable_scheduling=False
        ) as producer:
            await producer.enqueue_with_delay(Parent(id="p1"), 0.3)
            await producer.enqueue_with_delay(Parent(id="p2"), 3600)
            await producer.enqueue_with_delay(
                Child(id="c"), 0, after=[(Parent, "p1"), (Parent, "p2")]
            )
            assert await _exited(first, 20) == -signal.SIGKILL
            second = _spawn(url, prefix, "work", None, cluster)

            async def p1_handed_on() -> bool:
                info = await producer.inspect(Child, "c")
                return [p.status for p in info.parents] == ["ok", "pending"]

            await wait_for(p1_handed_on, timeout=20)
            assert (await producer.inspect(Child, "c")).state == "waiting"
            await producer.enqueue_with_delay(Parent(id="p2"), 0, replace=True)
            await _settled(client, prefix, wait_for, "c")
            assert await _runs(client, prefix) == {
                "dk-parent:p1": 1,
                "dk-parent:p2": 1,
                "dk-child:c": 1,
            }
    finally:
        _stop(first)
        if second is not None:
            _stop(second)
        await client.aclose()


@pytest.mark.parametrize("step", ["read", "applied", "relayed"])
async def test_the_relay_killed_after_each_step(redis_url, prefix, wait_for, step):
    await run_relay_kill(redis_url, prefix, step, wait_for, cluster=False)


async def run_producer_kill(
    url: str, prefix: str, step: str, wait_for: Any, cluster: bool, parent_done: bool = False
) -> None:
    """Kill a producer right after registration step ``step`` of a child; the audit of the
    worker's relay finishes the registration, and the child runs once after its parent.
    ``parent_done``: the parent ran before the child was enqueued (its slot answers the
    link with its completion, which the killed producer never applied)."""
    client: Any = aioredis.RedisCluster.from_url(url) if cluster else aioredis.Redis.from_url(url)
    worker = _spawn(url, prefix, "work", None, cluster)
    try:
        await wait_for(lambda: client.scard(f"{prefix}-ready"), timeout=20)
        async with EventService.from_url(
            url, cluster=cluster, prefix=prefix, enable_scheduling=False
        ) as producer:
            await producer.enqueue_with_delay(Parent(id="p"), 0 if parent_done else 3600)
            if parent_done:

                async def parent_gone() -> bool:
                    return (await producer.inspect(Parent, "p")).state == "absent"

                await wait_for(parent_gone, timeout=10)
            enqueuer = _spawn(url, prefix, "enqueue", step, cluster)
            assert await _exited(enqueuer, 20) == -signal.SIGKILL
            if not parent_done:  # (a done parent's answer is applied by the next audit)
                info = await producer.inspect(Child, "c")
                assert info.state == "waiting"
                assert [p.status for p in info.parents] == ["pending"]
                assert await producer.run_now(Parent, "p")
            await _settled(client, prefix, wait_for, "c")
            assert await _runs(client, prefix) == {"dk-parent:p": 1, "dk-child:c": 1}
    finally:
        _stop(worker)
        await client.aclose()


PRODUCER_KILLS = [("waiting", False), ("linked", False), ("linked", True)]
"""(the step after which the producer dies, whether the parent is done already)"""


@pytest.mark.parametrize(("step", "parent_done"), PRODUCER_KILLS)
async def test_the_producer_killed_between_registration_steps(
    redis_url, prefix, wait_for, step, parent_done
):
    await run_producer_kill(redis_url, prefix, step, wait_for, False, parent_done)


def _slot(key: str) -> int:
    from redis.crc import key_slot

    return int(key_slot(key.encode()))


async def test_the_relay_killed_on_a_cluster(cluster, prefix, wait_for):
    """Parent and child types on different slots of the 3-master cluster; the relaying
    worker is SIGKILLed after applying a completion in the child's slot."""
    from delayq.testing.cluster import RedisClusterServer

    assert isinstance(cluster, RedisClusterServer)
    assert _slot(f"{{{prefix}:dk-parent}}") != _slot(f"{{{prefix}:dk-child}}")
    await run_relay_kill(cluster.url, prefix, "applied", wait_for, cluster=True)


@pytest.mark.parametrize(("step", "parent_done"), PRODUCER_KILLS)
async def test_the_producer_killed_on_a_cluster(cluster, prefix, wait_for, step, parent_done):
    """A producer SIGKILLed between the registration steps of a child whose parent's type
    is on another slot of the 3-master cluster."""
    assert _slot(f"{{{prefix}:dk-parent}}") != _slot(f"{{{prefix}:dk-child}}")
    await run_producer_kill(cluster.url, prefix, step, wait_for, True, parent_done)
