"""A worker process for tests/test_chaos.py, which SIGKILLs it at a random moment.

    python tests/chaos_worker.py URL PREFIX SEED [--cluster] [--die-at-step K]
        [--die-at-batch-step K] [--warm]

It handles every chaos event type (``KINDS``) with one recording handler and leads the
scheduler when it holds the lock (its token is ``chaos-<pid>``, so the test can tell
whether it kills the leader); it prints ``ready`` once it is up. With ``--warm`` it waits
for a line on its stdin once imported, before it starts. With ``--die-at-step K`` it
SIGKILLs itself right after its relay's K-th step (``read``, ``applied``, ``relayed``,
``audit-linked``: see delayq/runtime/relay.py), with ``--die-at-batch-step K`` right
after the K-th step of a batch's open or add in its handlers (``added``, ``enqueued``,
``linked``, ...: see delayq/operations/batches.py), unless the test kills it first; it
says which on its stdout first. Its relay audits waiting children from 1 s after their
enqueue (5 s by default), so that audits run during the test; a nested batch's open
lease, an add's grace and a batch's audit are as short (a few seconds). Each handler call
records, in keys of one hash tag (``record_keys``), before the handler returns (so before
its ack):

- ``runs``: ``"<type>:<id>"`` -> handler calls (at least once: a SIGKILL between a
  handler and its ack runs it again);
- ``versions``: members ``"<type>:<id> <delivery version>"`` (one per enqueued envelope
  that reached a handler, whatever the number of redeliveries);
- ``seen``: ``"<type>:<id>"`` -> what the last call saw of its parents, ``status=count``
  pairs sorted, joined by ``,`` (``ok+v``: ok with the result its type keeps);
- ``early``: ids whose handler ran while a parent was still ``pending`` (never expected);
- ``batch``: ``"<type>:<id>"`` -> the id of the batch it saw (``current_delivery().batch``);
- ``binfo``: a callback's ``"<type>:<id>"`` -> what it saw of its batch
  (``current_delivery().batch.info``, JSON: ``info_record``);
- ``odd``: what a handler saw that must not be (an Adder's member added again that was
  enqueued again).

An event whose ``fail`` field is true raises after recording: with ``retry_attempts=0``
it becomes a dead letter at once. An ``Adder`` then adds members to its own batch, an
``Opener`` opens a nested batch (see their classes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis

from delayq import Batch, BatchInfo, Event, EventService, current_delivery, fixed
from delayq.operations import batches
from delayq.runtime import relay


class StepA(Event, event_name="cx-step-a", results=timedelta(minutes=10)):
    """A chain's odd steps (they keep their results: the next step reads them)."""


class StepB(Event, event_name="cx-step-b"):
    """A chain's even steps."""


class Leaf(Event, event_name="cx-leaf"):
    """A parent of the fan-in."""


class Join(Event, event_name="cx-join"):
    """The fan-in's child."""


class Bad(Event, event_name="cx-bad"):
    """A parent that fails when ``fail``; handled with ``retry_attempts=0``, so its
    handler's first failure makes a dead letter."""

    fail: bool = False


class Kid(Event, event_name="cx-kid"):
    """A child of failing parents, with some ``on_parent_failure`` policy."""


class Grandkid(Event, event_name="cx-grandkid"):
    """A child of a Kid."""


class Late(Event, event_name="cx-late"):
    """A child enqueued while its parent may be running, done, or handed on."""


class Row(Event, event_name="cx-b-row", results=timedelta(minutes=10)):
    """A batch member that keeps its result (the batch holds it: ``BatchMember.value``)."""


class Item(Event, event_name="cx-b-item"):
    """A batch member without a result (another type: on the cluster, another slot)."""


class Doomed(Event, event_name="cx-b-doomed"):
    """A batch member that always fails; handled with ``retry_attempts=0``, so its first
    failure (or its lease running out under a kill) makes a dead letter."""

    fail: bool = True


class Adder(Event, event_name="cx-b-adder"):
    """A batch member that adds members to its own batch while it runs
    (``current_delivery().batch.enqueue_*``): ``rows`` Rows and ``items`` Items named
    ``"<its id>-<n>"``, one by one then the rest in one call, and ``again``, a member the
    batch has already (kept: counted once). With ``fail_first`` its first run fails after
    adding, so its retry adds the same members again."""

    rows: int = 0
    items: int = 0
    again: str = ""
    fail_first: bool = False


class Opener(Event, event_name="cx-b-opener"):
    """A batch member that opens a nested batch (a member of its batch) of ``rows`` Rows
    named ``"<the nested batch's id>-<n>"`` (a retried Opener opens another one)."""

    rows: int = 0


class BatchDone(Event, event_name="cx-b-done"):
    """A batch's ``on_complete`` callback."""


class BatchOk(Event, event_name="cx-b-ok"):
    """A batch's ``on_success`` callback."""


# type -> (concurrency, retry_attempts: None for the service's)
KINDS: dict[type[Event], tuple[int, int | None]] = {
    StepA: (4, None),
    StepB: (4, None),
    Leaf: (16, None),
    Join: (1, None),
    Bad: (4, 0),
    Kid: (4, None),
    Grandkid: (4, None),
    Late: (4, None),
    Row: (16, None),
    Item: (16, None),
    Doomed: (4, 0),
    Adder: (4, None),
    Opener: (4, None),
    BatchDone: (1, None),
    BatchOk: (1, None),
}

OPTIONS: dict[str, Any] = {
    "scheduling_interval": 0.2,
    "polling_timeout": 0.5,
    "lock_timeout": 1.0,
    "visibility_timeout": 2.0,
    "shutdown_grace": 1.0,
    "retry_backoff": fixed(0.05),
    # a lease that expires (its worker killed) counts as an attempt: only `Bad` may die
    "retry_attempts": 100,
}

_RECORD = """
local runs = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('SADD', KEYS[2], ARGV[1] .. ' ' .. ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
if ARGV[4] == '1' then redis.call('SADD', KEYS[4], ARGV[1]) end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[5], ARGV[1], ARGV[5]) end
if ARGV[6] ~= '' then redis.call('HSET', KEYS[6], ARGV[1], ARGV[6]) end
return runs
"""

RECORDS = ("runs", "versions", "seen", "early", "batch", "binfo", "odd")


def record_keys(prefix: str) -> dict[str, str]:
    """The test's own keys (one hash tag, outside the queue's keys)."""
    tag = f"{{{prefix}-chaos}}"
    return {name: f"{tag}:{name}" for name in RECORDS}


def info_record(info: BatchInfo) -> str:
    """What a callback saw of its batch (``current_delivery().batch.info``), as JSON."""
    return json.dumps(
        {
            "id": info.id,
            "state": info.state,
            "total": info.total,
            "pending": info.pending,
            "succeeded": info.succeeded,
            "failed": info.failed,
            "failed_ids": sorted(list(x) for x in info.failed_ids),
        },
        sort_keys=True,
    )


def _seen(parents: tuple[Any, ...]) -> tuple[str, bool]:
    marks = []
    for p in parents:
        mark = p.status
        if p.status == "ok" and p.value is not None:
            mark = "ok+v" if p.value == {"id": p.id} else "ok+wrong-value"
        marks.append(mark)
    counts = Counter(marks)
    return ",".join(f"{k}={counts[k]}" for k in sorted(counts)), "pending" in counts


async def main() -> None:
    """Parse the arguments, work until SIGTERM (or a SIGKILL)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("seed", type=int)
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--die-at-step", type=int, default=0)
    parser.add_argument("--die-at-batch-step", type=int, default=0)
    parser.add_argument("--warm", action="store_true")
    args = parser.parse_args()

    def dying(at: int, what: str) -> Callable[[str], None]:
        left = at

        def step(name: str) -> None:
            nonlocal left
            left -= 1
            if left == 0:
                print(f"dying after a {what} step ({name})", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        return step

    if args.die_at_step:
        relay.STEP_HOOK = dying(args.die_at_step, "relay")
    if args.die_at_batch_step:
        batches.STEP_HOOK = dying(args.die_at_batch_step, "batch")
    logging.basicConfig(
        level=logging.WARNING, format="%(relativeCreated)6.0fms %(process)d %(name)s: %(message)s"
    )
    jitter = random.Random(args.seed)
    keys = record_keys(args.prefix)
    order = [keys[k] for k in RECORDS[:6]]
    rec = aioredis.Redis.from_url(args.url)
    if args.cluster:
        # the records' node, talked to directly: a fresh cluster client may fail its first
        # commands while it settles its connections (and a Bad's handler must fail with
        # its own error); the test's cluster has no failover
        from redis.asyncio.cluster import RedisCluster

        probe = RedisCluster.from_url(args.url)
        await probe.initialize()
        node = probe.get_node_from_key(order[0])
        await probe.aclose()
        await rec.aclose()
        rec = aioredis.Redis(host=node.host, port=node.port)

    async def handle(event: Event) -> object:
        d = current_delivery()
        assert d is not None
        summary, early = _seen(d.parents)
        batch = d.batch
        # a little time in the handler: kills land in handlers too
        await asyncio.sleep(jitter.random() * 0.02)
        runs = await rec.eval(  # type: ignore[misc]
            _RECORD,
            len(order),
            *order,
            f"{d.event_type}:{event.id}",
            d.version,
            summary,
            "1" if early else "0",
            "" if batch is None else batch.id,
            "" if batch is None or batch.info is None else info_record(batch.info),
        )
        if isinstance(event, Adder):
            assert batch is not None
            await add(event, batch, int(runs))
        if isinstance(event, Opener):
            async with service.batch(name=f"nested {event.id}") as child:
                await child.enqueue_many([Row(id=f"{child.id}-{n}") for n in range(event.rows)])
        if getattr(event, "fail", False):
            raise RuntimeError("chaos: failing on purpose")
        return {"id": event.id} if type(event).event_results_ms else None

    async def add(event: Adder, batch: Batch, runs: int) -> None:
        new: list[Event] = [Row(id=f"{event.id}-{n}") for n in range(event.rows)]
        new += [Item(id=f"{event.id}-{n}") for n in range(event.rows, event.rows + event.items)]
        await batch.enqueue_with_delay(new[0], 0)
        await batch.enqueue_many(new[1:])
        if event.again and await batch.enqueue_with_delay(Item(id=event.again), 0):
            # a member already: counted once, never enqueued again
            await rec.sadd(keys["odd"], f"{event.id} enqueued {event.again} again")
        if event.fail_first and runs == 1:
            raise RuntimeError("chaos: the first run fails after adding")

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    service = EventService.from_url(args.url, cluster=args.cluster, prefix=args.prefix, **OPTIONS)
    assert service._scheduler is not None
    service._scheduler.token = f"chaos-{os.getpid()}"  # before its start takes the lock
    service._scheduler.relay.audit_ms = 1000
    # batches: a nested batch's open lease, an add's grace and a batch's audit are short, so
    # that the sweep closes a killed Opener's batch, settles a killed Adder's adds and
    # audits during the test (30 s, 30 s and 60 s by default)
    service._batches.lease_ms = 3000
    service._batches.grace_ms = service._scheduler.relay.sweeper.grace_ms = 3000
    service._batches.audit_ms = service._scheduler.relay.sweeper.audit_ms = 2000
    for kind, (concurrency, attempts) in KINDS.items():
        service.add_handler(kind, handle, concurrency, retry_attempts=attempts)
    async with service:
        print("ready", flush=True)  # the test counts this worker's life from here
        await stop.wait()
    await rec.aclose()


if __name__ == "__main__":
    if "--warm" in sys.argv:  # imported: wait for the word to start
        sys.stdin.readline()
    asyncio.run(main())
