"""Shared pieces of tests/test_cluster_failover.py and benchmarks/cluster_failover.py.

A :class:`Fleet` runs ``tests/cluster_fault_worker.py`` processes against a queue (a
cluster or a Sentinel set) and reads back what their handlers recorded in a separate
recorder Redis; a :class:`Producer` enqueues a steady stream of ``cf-hot`` events and
notes each one that returned, with its due time; :class:`Replication` tells which
enqueues a master's replica had received before the master was killed.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_fault_worker import Hot, Tick

from delayq import EventService
from delayq.keys import PrefixKeys
from delayq.partitions.shards import shard_for, shards
from delayq.testing.cluster import RedisClusterServer

__all__ = ["Fleet", "Hot", "Producer", "Replication", "Tick", "now_ms", "shard_ports"]

WORKER = Path(__file__).with_name("cluster_fault_worker.py")
ROOT = Path(__file__).resolve().parents[1]


def now_ms() -> int:
    """Wall-clock ms: the recorder, the cluster and this process share the machine's clock."""
    return int(time.time() * 1000)


def shard_ports(cluster: RedisClusterServer, prefix: str) -> dict[str, int]:
    """Each ``cf-hot`` shard -> the port of the master that serves it now."""
    keys = PrefixKeys(prefix)
    return {
        s: cluster.node_for_key(keys.for_shard(s).scheduled).port for s in shards(Hot.event_name, 6)
    }


def shard_of(event_id: str) -> str:
    """The ``cf-hot`` shard an id routes to."""
    return shard_for(Hot.event_name, event_id, 6)


@dataclass
class Fleet:
    """Worker processes and the recorder they write to."""

    url: str
    rec_url: str
    prefix: str
    cluster: bool
    handler_ms: float = 5.0
    logs: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="delayq-cf-")))
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(self, n: int) -> None:
        """Start ``n`` workers."""
        for _ in range(n):
            name = f"w{len(self.procs)}"
            argv = [sys.executable, str(WORKER), self.url, self.rec_url, self.prefix, name,
                    "--ms", str(self.handler_ms)] + (["--cluster"] if self.cluster else [])  # fmt: skip
            with open(self.logs / f"{name}.log", "wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ}
                    )
                )

    async def ready(self, rec: aioredis.Redis, timeout: float = 30.0) -> None:
        """Wait until every worker's service has started."""
        deadline = time.monotonic() + timeout
        while await rec.scard("ready") < len(self.procs):
            for p in self.procs:
                if p.poll() is not None:
                    raise AssertionError(f"a worker exited early:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"workers not ready:\n{self.tail()}")
            await asyncio.sleep(0.05)

    def tail(self, n: int = 4000) -> str:
        """The end of every worker's log."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-n:]}" for p in sorted(self.logs.iterdir()))

    def close(self) -> None:
        """SIGTERM every worker, SIGKILL what does not end."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@dataclass
class Records:
    """What the handlers recorded."""

    starts: Counter[str]
    ends: Counter[str]
    first_start: dict[str, int]  # id -> recorder ms of its first start
    lateness: dict[str, float]  # id -> its first delivery's lateness (ms, the queue's clock)
    extra_starts: list[tuple[str, int]]  # (id, ms) of every start after the first
    max_running: dict[str, int]  # event type -> the most handlers running at once

    @classmethod
    async def read(cls, rec: aioredis.Redis) -> Records:
        """Read them from the recorder."""
        starts = Counter({k.decode(): int(v) for k, v in (await rec.hgetall("starts")).items()})
        ends = Counter({k.decode(): int(v) for k, v in (await rec.hgetall("ends")).items()})
        first: dict[str, int] = {}
        late: dict[str, float] = {}
        extra: list[tuple[str, int]] = []
        for raw in await rec.lrange("log", 0, -1):
            kind, event_id, ms, lateness = raw.decode().split(" ")
            if kind == "start":
                if event_id in first:
                    extra.append((event_id, int(ms)))
                else:
                    first[event_id] = int(ms)
                    late[event_id] = float(lateness)
        most = {}
        for name in ("cf-hot", "cf-tick"):
            most[name] = int(await rec.get(f"max:{name}") or 0)
        return cls(starts, ends, first, late, extra, most)


@dataclass
class Producer:
    """Enqueues ``rate`` ``cf-hot`` events per second, each due ``delay`` s later (uniform),
    one call each (so one failing node fails only its own enqueues)."""

    service: EventService
    rate: float = 100.0
    delay: tuple[float, float] = (0.3, 1.2)
    seed: int = 37
    returned: dict[str, tuple[int, int]] = field(default_factory=dict)
    """id -> (due ms, ms when its enqueue returned)."""
    failed: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _one(self, event_id: str, n: int, delay: float) -> None:
        due = now_ms() + int(delay * 1000)
        try:
            ok = await self.service.enqueue_with_delay(Hot(id=event_id, n=n), delay)
        except Exception:  # a node away: this enqueue did not return
            self.failed += 1
            return
        assert ok, event_id
        self.returned[event_id] = (due, now_ms())

    async def run(self) -> None:
        """Until :meth:`stop`."""
        rnd = random.Random(self.seed)
        start, n = time.monotonic(), 0
        async with asyncio.TaskGroup() as tg:
            while not self._stop.is_set():
                while n < (time.monotonic() - start) * self.rate:
                    tg.create_task(self._one(f"h-{n}", n, rnd.uniform(*self.delay)))
                    n += 1
                await asyncio.sleep(0.01)

    def stop(self) -> None:
        """End :meth:`run` (the calls under way finish)."""
        self._stop.set()


class Replication:
    """Which writes a master's replica had before the master was killed.

    Every 20 ms: the master's ``master_repl_offset`` (covers every enqueue that returned
    before it was read), then the replica's ``slave_repl_offset``. An enqueue is
    *acknowledged* once the replica's offset reached a master offset read after the
    enqueue returned: what ``WAIT 1`` would have confirmed.
    """

    def __init__(self, master_port: int, replica_port: int) -> None:
        self._master = aioredis.Redis(port=master_port, socket_timeout=1)
        self._replica = aioredis.Redis(port=replica_port, socket_timeout=1)
        self.acked_until = 0
        """Every enqueue that returned before this (ms) had reached the replica."""
        self._task: asyncio.Task[None] | None = None

    async def _poll(self) -> None:
        pending: list[tuple[int, int]] = []  # (ms read, master offset)
        while True:
            try:
                read_at = now_ms()
                info = await self._master.info("replication")
                pending.append((read_at, int(info["master_repl_offset"])))
                got = int((await self._replica.info("replication"))["slave_repl_offset"])
            except Exception:
                return  # the master is gone: acked_until stays what was confirmed
            while pending and pending[0][1] <= got:
                self.acked_until = pending.pop(0)[0]
            await asyncio.sleep(0.02)

    def start(self) -> None:
        """Start polling (until the master dies or :meth:`stop`)."""
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        """Stop polling and close the connections."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self._master.aclose()
        await self._replica.aclose()
