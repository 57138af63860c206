"""A worker process for tests/test_chaos.py, which SIGKILLs it at a random moment.

    python tests/chaos_worker.py URL PREFIX SEED [--cluster] [--die-at-step K] [--warm]

It handles every chaos event type (``KINDS``) with one recording handler and leads the
scheduler when it holds the lock (its token is ``chaos-<pid>``, so the test can tell
whether it kills the leader); it prints ``ready`` once it is up. With ``--warm`` it waits
for a line on its stdin once imported, before it starts. With ``--die-at-step K`` it
SIGKILLs itself right after its relay's K-th step (``read``, ``applied``, ``relayed``,
``audit-linked``: see delayq/runtime/relay.py), unless the test kills it first. Its
relay audits waiting children from 1 s after their enqueue (5 s by default),
so that audits run during the test. Each handler call records, in keys of one hash tag
(``record_keys``), before the handler returns (so before its ack):

- ``runs``: ``"<type>:<id>"`` -> handler calls (at least once: a SIGKILL between a
  handler and its ack runs it again);
- ``versions``: members ``"<type>:<id> <delivery version>"`` (one per enqueued envelope
  that reached a handler, whatever the number of redeliveries);
- ``seen``: ``"<type>:<id>"`` -> what the last call saw of its parents, ``status=count``
  pairs sorted, joined by ``,`` (``ok+v``: ok with the result its type keeps);
- ``early``: ids whose handler ran while a parent was still ``pending`` (never expected).

An event whose ``fail`` field is true raises after recording: with ``retry_attempts=0``
it becomes a dead letter at once. A scenario that needs types of its own (batches, say)
adds them to ``KINDS``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import signal
import sys
from collections import Counter
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis

from delayq import Event, EventService, current_delivery, fixed
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
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('SADD', KEYS[2], ARGV[1] .. ' ' .. ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
if ARGV[4] == '1' then redis.call('SADD', KEYS[4], ARGV[1]) end
return 1
"""


def record_keys(prefix: str) -> dict[str, str]:
    """The test's own keys (one hash tag, outside the queue's keys)."""
    tag = f"{{{prefix}-chaos}}"
    return {name: f"{tag}:{name}" for name in ("runs", "versions", "seen", "early")}


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
    parser.add_argument("--warm", action="store_true")
    args = parser.parse_args()
    if args.die_at_step:
        left = args.die_at_step

        def step(name: str) -> None:
            nonlocal left
            left -= 1
            if left == 0:
                os.kill(os.getpid(), signal.SIGKILL)

        relay.STEP_HOOK = step
    logging.basicConfig(
        level=logging.WARNING, format="%(relativeCreated)6.0fms %(process)d %(name)s: %(message)s"
    )
    jitter = random.Random(args.seed)
    keys = record_keys(args.prefix)
    order = [keys[k] for k in ("runs", "versions", "seen", "early")]
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
        # a little time in the handler: kills land in handlers too
        await asyncio.sleep(jitter.random() * 0.02)
        await rec.eval(  # type: ignore[misc]
            _RECORD,
            len(order),
            *order,
            f"{d.event_type}:{event.id}",
            d.version,
            summary,
            "1" if early else "0",
        )
        if getattr(event, "fail", False):
            raise RuntimeError("chaos: failing on purpose")
        return {"id": event.id} if type(event).event_results_ms else None

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    service = EventService.from_url(args.url, cluster=args.cluster, prefix=args.prefix, **OPTIONS)
    assert service._scheduler is not None
    service._scheduler.token = f"chaos-{os.getpid()}"  # before its start takes the lock
    service._scheduler.relay.audit_ms = 1000
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
