"""``python -m benchmarks.batches_bench``: what batches cost (issue 33, batches).

Against a fresh private redis-server per measurement (``delayq.testing.RedisServer``),
default service options (``scheduling_interval`` 1 s), one process:

* **big** — a batch of ``--members`` no-op members (with ``on_complete`` and
  ``on_success`` callbacks) added by a producer in chunks of ``--chunk`` (``enqueue_many``
  inside the ``async with service.batch(...)`` block, members due at once, no worker
  running yet), then handled by one worker process (scheduler, relay and handlers,
  ``--concurrency`` per type): members handled per second (first member's handler start →
  last member's handler end), and each callback's delay after the last member, read two
  ways: on Redis's clock, the last member's ack (its completion record in the batch's
  members hash) → the callback's claim (``current_delivery().claimed_us``), with the batch's
  ``done_at`` between them; and in the process, the last member's handler end → the
  callback's handler start (which adds the ack task's wait before its call). Each round
  also handles the same events without a batch (``plain_events_per_s``, on a fresh server,
  after the batch), and reads the CPU time each case used, in the process and in the
  redis-server (``/proc``): steadier than rates on a shared machine. ``--rounds`` rounds, a fresh server each; medians and every round.
* **nested** — a batch of ``--inner`` members, each of which opens a child batch of
  ``--leaves`` no-op members in its handler (2 levels), the outer batch with an
  ``on_complete``: the time from the outer batch's open to its callback, and from the last
  leaf to the outer callback (two hand-ons: leaf → child batch → outer batch).
* **memory** — ``--memory-members`` members due in an hour added to one batch, against the
  same events enqueued plainly (``used_memory`` growth, after ``MEMORY PURGE``): the bytes
  per *pending* member beyond the event itself; then the same number handled (a worker,
  the batch done): the bytes per *finished* member left until the batch's retention ends
  (a type without results, and one keeping a 16-byte result). ``MEMORY USAGE`` of the
  batch's members hash and of the member type's ``deps`` hash split the figure.
* **add** — ``--add-members`` members due in an hour added to a batch in chunks of each
  of ``--add-chunks``, against the same ``service.enqueue_many`` calls without a batch,
  alternated over ``--add-rounds`` rounds: members added per second (medians).

    python -m benchmarks.batches_bench                               # the full run
    python -m benchmarks.batches_bench --members 20000 --rounds 1 --memory-members 5000 \\
        --add-members 5000 --add-rounds 1 --inner 5 --leaves 200      # quick

Prints a table and writes ``benchmarks/results/batches-<stamp>.json`` (every round, the
load average before and after, the commit). Figures on a shared machine move with its
load: repeat and compare medians. The module is over 400 lines because it holds four
measurements that share their events, servers and reporting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery
from delayq.keyspace.layout import PrefixKeys
from delayq.keyspace.shards import batch_shard
from delayq.testing import RedisServer

HERE = Path(__file__).resolve().parent
HOUR = timedelta(hours=1)


class Member(Event, event_name="bench-batch-member"):
    """A no-op member."""


class Plain(Event, event_name="bench-batch-plain"):
    """The same event, never in a batch (the memory and add baselines)."""


class Kept(Event, event_name="bench-batch-kept", results=HOUR):
    """A member that keeps a 16-byte result."""


class Opener(Event, event_name="bench-batch-opener"):
    """A member that opens a child batch in its handler (nesting)."""


class Leaf(Event, event_name="bench-batch-leaf"):
    """A child batch's no-op member."""


class Complete(Event, event_name="bench-batch-complete"):
    """``on_complete``."""


class Success(Event, event_name="bench-batch-success"):
    """``on_success``."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.batches_bench", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--members", type=int, default=100_000, help="the big batch's members")
    p.add_argument("--chunk", type=int, default=1000, help="members per enqueue_many (big)")
    p.add_argument("--concurrency", type=int, default=64, help="handlers per type")
    p.add_argument("--rounds", type=int, default=3, help="big-batch rounds (fresh server each)")
    p.add_argument("--inner", type=int, default=10, help="nested: child batches")
    p.add_argument("--leaves", type=int, default=1000, help="nested: members per child batch")
    p.add_argument("--nested-rounds", type=int, default=3)
    p.add_argument("--memory-members", type=int, default=20_000)
    p.add_argument("--add-members", type=int, default=20_000)
    p.add_argument("--add-chunks", default="100,1000,10000", help="comma-separated sizes")
    p.add_argument("--add-rounds", type=int, default=3)
    p.add_argument("--only", default="big,nested,memory,add", help="comma-separated parts to run")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--no-write", action="store_true", help="print only, write no JSON")
    return p.parse_args(argv)


async def _wait(pred: Any, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError("benchmark condition not met")
        await asyncio.sleep(0.002)


_TICK = os.sysconf("SC_CLK_TCK")


def _server_cpu_s(server: RedisServer) -> float:
    """The redis-server process's CPU time so far (user + system, /proc)."""
    fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _chunks(n: int, size: int) -> list[range]:
    return [range(i, min(n, i + size)) for i in range(0, n, size)]


def _ms(when: datetime | None) -> float:
    assert when is not None
    return when.timestamp() * 1000


def _members_hash(prefix: str, batch_id: str) -> str:
    _, members, _ = PrefixKeys(prefix).for_shard(batch_shard(batch_id)).batch(batch_id)
    return members


async def _last_ack_ms(client: aioredis.Redis, prefix: str, batch_ids: list[str]) -> float:
    """The latest member completion (ms, Redis's clock) recorded in the batches' members
    hashes (a record is ``"<ms>:<outcome>"``)."""
    last = 0.0
    for batch_id in batch_ids:
        key = _members_hash(prefix, batch_id)
        async for _, record in client.hscan_iter(key, count=10_000):
            if record:
                last = max(last, float(record.split(b":", 1)[0]))
    return last


class Callbacks:
    """The callbacks' handlers: when each started, by the process's clock and Redis's."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.claimed_ms: dict[str, float] = {}
        self.info: dict[str, Any] = {}

    async def handle(self, event: Event) -> None:
        """A callback's handler: note when it started (by its id)."""
        self.started[event.id] = time.perf_counter()
        delivery = current_delivery()
        self.claimed_ms[event.id] = delivery.claimed_us / 1000
        batch = delivery.batch
        self.info[event.id] = batch.info if batch is not None else None


async def big_batch(server: RedisServer, n: int, chunk: int, concurrency: int) -> dict[str, Any]:
    """One batch of ``n`` no-op members: the add, the handling, the callbacks' delays."""
    url = server.url
    prefix = "bb" + uuid.uuid4().hex[:6]
    first: list[float] = []
    last = [0.0]
    count = [0]

    async def member(event: Member) -> None:
        now = time.perf_counter()
        if not first:
            first.append(now)
        count[0] += 1
        last[0] = time.perf_counter()

    calls = Callbacks()
    async with EventService.from_url(url, prefix=prefix, enable_scheduling=False) as producer:
        t0 = time.perf_counter()
        async with producer.batch(
            on_complete=Complete(id="c"), on_success=Success(id="s"), name="big"
        ) as batch:
            for part in _chunks(n, chunk):
                await batch.enqueue_many([Member(id=f"m{j:07d}") for j in part])
        add_s = time.perf_counter() - t0
    worker = EventService.from_url(url, prefix=prefix)
    worker.add_handler(Member, member, concurrency=concurrency)
    worker.add_handler(Complete, calls.handle)
    worker.add_handler(Success, calls.handle)
    client = aioredis.Redis.from_url(url)
    try:
        cpu, server_cpu = time.process_time(), _server_cpu_s(server)
        async with worker:
            await _wait(lambda: len(calls.started) == 2)
            cpu, server_cpu = time.process_time() - cpu, _server_cpu_s(server) - server_cpu
            info = await worker.batch_info(batch.id)
        last_ack = await _last_ack_ms(client, prefix, [batch.id])
    finally:
        await client.aclose()
    assert count[0] == n and info.total == n and info.succeeded == n, (count, info)
    done = _ms(info.done_at)
    return {
        "members": n,
        "chunk": chunk,
        "add_s": add_s,
        "add_per_s": n / add_s,
        "handle_s": last[0] - first[0],
        "members_per_s": n / (last[0] - first[0]),
        "worker_cpu_us_per_member": cpu / n * 1e6,
        "server_cpu_us_per_member": server_cpu / n * 1e6,
        "last_ack_to_batch_done_ms": done - last_ack,
        "last_ack_to_on_complete_claim_ms": calls.claimed_ms["c"] - last_ack,
        "last_ack_to_on_success_claim_ms": calls.claimed_ms["s"] - last_ack,
        "last_handler_end_to_on_complete_start_ms": (calls.started["c"] - last[0]) * 1000,
        "last_handler_end_to_on_success_start_ms": (calls.started["s"] - last[0]) * 1000,
    }


async def plain_events(
    server: RedisServer, n: int, chunk: int, concurrency: int
) -> dict[str, float]:
    """The same ``n`` no-op events without a batch, handled the same way: events per second
    and CPU per event (the baseline of the big batch's figures)."""
    url = server.url
    prefix = "bp" + uuid.uuid4().hex[:6]
    first: list[float] = []
    last = [0.0]
    count = [0]
    done = asyncio.Event()

    async def handle(event: Plain) -> None:
        if not first:
            first.append(time.perf_counter())
        count[0] += 1
        last[0] = time.perf_counter()
        if count[0] == n:
            done.set()

    async with EventService.from_url(url, prefix=prefix, enable_scheduling=False) as producer:
        for part in _chunks(n, chunk):
            await producer.enqueue_many([Plain(id=f"m{j:07d}") for j in part])
    worker = EventService.from_url(url, prefix=prefix)
    worker.add_handler(Plain, handle, concurrency=concurrency)
    cpu, server_cpu = time.process_time(), _server_cpu_s(server)
    async with worker:
        await asyncio.wait_for(done.wait(), 600)
        cpu, server_cpu = time.process_time() - cpu, _server_cpu_s(server) - server_cpu
    return {
        "plain_events_per_s": n / (last[0] - first[0]),
        "plain_worker_cpu_us_per_event": cpu / n * 1e6,
        "plain_server_cpu_us_per_event": server_cpu / n * 1e6,
    }


async def nested(url: str, inner: int, leaves: int, concurrency: int) -> dict[str, Any]:
    """A batch of ``inner`` members, each opening a child batch of ``leaves`` members."""
    prefix = "bn" + uuid.uuid4().hex[:6]
    last = [0.0]
    children: list[str] = []
    calls = Callbacks()
    service = EventService.from_url(url, prefix=prefix)

    async def leaf(event: Leaf) -> None:
        last[0] = time.perf_counter()

    async def opener(event: Opener) -> None:
        async with service.batch(name=f"child {event.id}") as child:
            for part in _chunks(leaves, 1000):
                await child.enqueue_many([Leaf(id=f"{event.id}-{j:06d}") for j in part])
        children.append(child.id)

    service.add_handler(Leaf, leaf, concurrency=concurrency)
    service.add_handler(Opener, opener, concurrency=concurrency)
    service.add_handler(Complete, calls.handle)
    client = aioredis.Redis.from_url(url)
    try:
        async with service:
            t0 = time.perf_counter()
            async with service.batch(on_complete=Complete(id="c"), name="outer") as outer:
                await outer.enqueue_many([Opener(id=f"o{i:03d}") for i in range(inner)])
            await _wait(lambda: "c" in calls.started)
            wall = calls.started["c"] - t0
            info = await service.batch_info(outer.id)
            inner_infos = [await service.batch_info(c) for c in children]
        last_ack = await _last_ack_ms(client, prefix, children)
    finally:
        await client.aclose()
    assert info.total == 2 * inner and info.succeeded == 2 * inner, info  # openers + children
    assert sum(i.succeeded for i in inner_infos) == inner * leaves
    last_child_done = max(_ms(i.done_at) for i in inner_infos)
    return {
        "inner": inner,
        "leaves": leaves,
        "open_to_outer_callback_s": wall,
        "last_leaf_ack_to_last_child_done_ms": last_child_done - last_ack,
        "last_child_done_to_outer_done_ms": _ms(info.done_at) - last_child_done,
        "last_leaf_ack_to_outer_callback_claim_ms": calls.claimed_ms["c"] - last_ack,
        "last_leaf_end_to_outer_callback_start_ms": (calls.started["c"] - last[0]) * 1000,
    }


async def _used(client: aioredis.Redis) -> int:
    await client.memory_purge()  # type: ignore[no-untyped-call]
    return int((await client.info("memory"))["used_memory"])


async def memory_pending(url: str, n: int) -> dict[str, Any]:
    """Bytes per pending member (due in an hour) beyond the same event enqueued plainly."""
    prefix = "bm" + uuid.uuid4().hex[:6]
    client = aioredis.Redis.from_url(url)
    try:
        async with EventService.from_url(url, prefix=prefix, enable_scheduling=False) as svc:
            # the types' keys, the batch shard's sorted sets and the connections exist first
            await svc.enqueue_many([Plain(id=f"w{i}") for i in range(10)], HOUR)
            async with svc.batch(name="warm") as warm:
                await warm.enqueue_many([Member(id=f"w{i}") for i in range(10)], HOUR)
            before = await _used(client)
            for part in _chunks(n, 1000):
                await svc.enqueue_many([Plain(id=f"e{j:07d}") for j in part], HOUR)
            plain = await _used(client) - before
            before = await _used(client)
            async with svc.batch(name="memory") as batch:
                for part in _chunks(n, 1000):
                    await batch.enqueue_many([Member(id=f"e{j:07d}") for j in part], HOUR)
            grown = await _used(client) - before
            members_hash = await client.memory_usage(_members_hash(prefix, batch.id), samples=0)
            deps = PrefixKeys(prefix).for_type(Member.event_name).deps
            deps_hash = await client.memory_usage(deps, samples=0)
    finally:
        await client.aclose()
    return {
        "members": n,
        "bytes_per_plain_scheduled_event": plain / n,
        "bytes_per_pending_member": grown / n,
        "bytes_per_pending_member_beyond_plain": (grown - plain) / n,
        "members_hash_bytes_per_pending_member": (members_hash or 0) / n,
        "member_type_deps_hash_bytes_per_pending_member": (deps_hash or 0) / n,
    }


async def memory_finished(url: str, n: int, kept: bool, concurrency: int) -> dict[str, Any]:
    """Bytes per finished member left while the done batch is kept (its retention)."""
    prefix = "bf" + uuid.uuid4().hex[:6]
    event_type: type[Event] = Kept if kept else Member
    calls = Callbacks()

    async def handle(event: Event) -> str:
        return "sixteen-bytes..."

    service = EventService.from_url(url, prefix=prefix)
    service.add_handler(event_type, handle, concurrency=concurrency)
    service.add_handler(Complete, calls.handle)
    client = aioredis.Redis.from_url(url)
    try:
        async with service:
            async with service.batch(on_complete=Complete(id="w"), name="warm") as warm:
                await warm.enqueue_many([event_type(id=f"w{i}") for i in range(10)])
            await _wait(lambda: "w" in calls.started)
            await asyncio.sleep(0.5)  # the warm callback's ack
            before = await _used(client)
            async with service.batch(on_complete=Complete(id="c"), name="memory") as batch:
                for part in _chunks(n, 1000):
                    await batch.enqueue_many([event_type(id=f"e{j:07d}") for j in part])
            await _wait(lambda: "c" in calls.started)
            await asyncio.sleep(0.5)  # the callback's ack, the relay's clear
            after = await _used(client)
            members_hash = await client.memory_usage(_members_hash(prefix, batch.id), samples=0)
    finally:
        await client.aclose()
    return {
        "members": n,
        "kept_result": kept,
        "bytes_per_finished_member": (after - before) / n,
        "members_hash_bytes_per_finished_member": (members_hash or 0) / n,
    }


async def add_rate(url: str, n: int, chunk: int) -> dict[str, float]:
    """Members added per second to one batch, and the same enqueues without a batch."""
    out: dict[str, float] = {}
    for kind in ("plain", "batch"):
        prefix = "ba" + uuid.uuid4().hex[:6]
        async with EventService.from_url(url, prefix=prefix, enable_scheduling=False) as svc:
            await svc.enqueue_many([Plain(id="warm")], HOUR)  # connections, scripts loaded
            t0 = time.perf_counter()
            if kind == "plain":
                for part in _chunks(n, chunk):
                    await svc.enqueue_many([Member(id=f"e{j:07d}") for j in part], HOUR)
            else:
                async with svc.batch(name="add") as batch:
                    for part in _chunks(n, chunk):
                        await batch.enqueue_many([Member(id=f"e{j:07d}") for j in part], HOUR)
            out[kind] = n / (time.perf_counter() - t0)
    return out


def _rounded(row: dict[str, Any]) -> str:
    return json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()})


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


async def _redis_version(url: str) -> str:
    client = aioredis.Redis.from_url(url)
    try:
        return str((await client.info("server"))["redis_version"])
    finally:
        await client.aclose()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the parts asked for, each on fresh private servers; return the figures."""
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    out: dict[str, Any] = {}
    if "big" in parts:
        rounds = []
        for i in range(args.rounds):
            with RedisServer() as server:
                out["redis"] = await _redis_version(server.url)
                row = await big_batch(server, args.members, args.chunk, args.concurrency)
            with RedisServer() as server:
                row |= await plain_events(server, args.members, args.chunk, args.concurrency)
            row["members_per_s_over_plain"] = row["members_per_s"] / row["plain_events_per_s"]
            rounds.append(row)
            print(f"big round {i + 1}: {_rounded(row)}", flush=True)
        out["big"] = {"rounds": rounds, "median": {k: _median(rounds, k) for k in rounds[0]}}
    if "nested" in parts:
        rounds = []
        for i in range(args.nested_rounds):
            with RedisServer() as server:
                row = await nested(server.url, args.inner, args.leaves, args.concurrency)
            rounds.append(row)
            print(f"nested round {i + 1}: {_rounded(row)}", flush=True)
        out["nested"] = {"rounds": rounds, "median": {k: _median(rounds, k) for k in rounds[0]}}
    if "memory" in parts:
        with RedisServer() as server:
            out["memory_pending"] = await memory_pending(server.url, args.memory_members)
        for kept in (False, True):
            with RedisServer() as server:
                name = "memory_finished_kept" if kept else "memory_finished"
                out[name] = await memory_finished(
                    server.url, args.memory_members, kept, args.concurrency
                )
        for name in ("memory_pending", "memory_finished", "memory_finished_kept"):
            print(f"{name}: {_rounded(out[name])}", flush=True)
    if "add" in parts:
        chunks = [int(c) for c in args.add_chunks.split(",")]
        rows: dict[int, list[dict[str, float]]] = {c: [] for c in chunks}
        for i in range(args.add_rounds):
            for chunk in chunks if i % 2 == 0 else chunks[::-1]:
                with RedisServer() as server:
                    rows[chunk].append(await add_rate(server.url, args.add_members, chunk))
        out["add"] = {
            str(c): {
                "rounds": rows[c],
                "plain_per_s": _median(rows[c], "plain"),
                "batch_per_s": _median(rows[c], "batch"),
            }
            for c in chunks
        }
    return out


def _commit() -> str:
    try:
        argv = ["git", "rev-parse", "--short", "HEAD"]
        done = subprocess.run(argv, cwd=HERE, text=True, capture_output=True, check=True)
        return done.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def table(fig: dict[str, Any]) -> str:
    """The markdown table of the figures (medians where there are rounds)."""
    lines = ["| measure | value |", "|---|---|"]
    if "big" in fig:
        m, r = fig["big"]["median"], len(fig["big"]["rounds"])
        n = f"{int(m['members']):,}"
        lines += [
            f"| batch of {n} no-op members, added in chunks of {int(m['chunk']):,}: members "
            f"added per second (median of {r}) | {m['add_per_s']:,.0f} |",
            f"| the same batch handled by one process: members per second (the same events "
            f"without a batch; median ratio) | {m['members_per_s']:,.0f} "
            f"({m['plain_events_per_s']:,.0f}; {m['members_per_s_over_plain']:.2f}) |",
            f"| CPU per member: the worker process (handlers, acks, relay) / redis-server "
            f"(the same events without a batch) | {m['worker_cpu_us_per_member']:.0f} / "
            f"{m['server_cpu_us_per_member']:.0f} µs ({m['plain_worker_cpu_us_per_event']:.0f} / "
            f"{m['plain_server_cpu_us_per_event']:.0f} µs) |",
            f"| last member's ack → batch done (Redis's clock) | "
            f"{m['last_ack_to_batch_done_ms']:.0f} ms |",
            f"| last member's ack → `on_complete` claimed / `on_success` claimed "
            f"(Redis's clock) | {m['last_ack_to_on_complete_claim_ms']:.0f} / "
            f"{m['last_ack_to_on_success_claim_ms']:.0f} ms |",
            f"| last member's handler end → `on_complete` / `on_success` handler start | "
            f"{m['last_handler_end_to_on_complete_start_ms']:.0f} / "
            f"{m['last_handler_end_to_on_success_start_ms']:.0f} ms |",
        ]
    if "nested" in fig:
        m, r = fig["nested"]["median"], len(fig["nested"]["rounds"])
        lines += [
            f"| nested: {int(m['inner'])} child batches of {int(m['leaves']):,} members: "
            f"outer open → outer `on_complete` start (median of {r}) | "
            f"{m['open_to_outer_callback_s']:.2f} s |",
            f"| nested: last leaf's ack → last child batch done → outer batch done "
            f"(Redis's clock) | {m['last_leaf_ack_to_last_child_done_ms']:.0f} + "
            f"{m['last_child_done_to_outer_done_ms']:.0f} ms |",
            f"| nested: last leaf's ack → outer `on_complete` claimed (Redis's clock); "
            f"last leaf's handler end → its start | "
            f"{m['last_leaf_ack_to_outer_callback_claim_ms']:.0f} ms; "
            f"{m['last_leaf_end_to_outer_callback_start_ms']:.0f} ms |",
        ]
    if "memory_pending" in fig:
        p, f, k = fig["memory_pending"], fig["memory_finished"], fig["memory_finished_kept"]
        plain = p["bytes_per_plain_scheduled_event"]
        lines += [
            f"| memory per pending member beyond the plain event ({plain:.0f} B), "
            f"{p['members']:,} members | {p['bytes_per_pending_member_beyond_plain']:.0f} B "
            f"(members hash {p['members_hash_bytes_per_pending_member']:.0f} B, the member "
            f"type's `deps` {p['member_type_deps_hash_bytes_per_pending_member']:.0f} B) |",
            f"| memory per finished member, kept for the batch's retention | "
            f"{f['bytes_per_finished_member']:.0f} B "
            f"(members hash {f['members_hash_bytes_per_finished_member']:.0f} B) |",
            f"| the same, member type keeping a 16-byte result (`results=`) | "
            f"{k['bytes_per_finished_member']:.0f} B "
            f"(members hash {k['members_hash_bytes_per_finished_member']:.0f} B) |",
        ]
    for chunk, row in fig.get("add", {}).items():
        lines.append(
            f"| add rate, chunks of {int(chunk):,}: batch / plain `enqueue_many` "
            f"(members per second, median of {len(row['rounds'])}) | {row['batch_per_s']:,.0f} / "
            f"{row['plain_per_s']:,.0f} ({row['batch_per_s'] / row['plain_per_s']:.2f}) |"
        )
    return "\n".join(lines)


def run(argv: list[str] | None = None) -> None:
    """Measure, print the table, write the JSON."""
    args = parse_args(argv)
    load_before = os.getloadavg()
    started = datetime.now(timezone.utc)
    figures = asyncio.run(main(args))
    figures |= {
        "command": "python -m benchmarks.batches_bench "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": _commit(),
        "started": started.isoformat(timespec="seconds"),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    print(table(figures))
    print(f"load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}")
    if not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"batches-{started.strftime('%Y-%m-%d-%H%M')}.json"
        path.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    run()
