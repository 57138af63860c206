"""The demo behind ``python -m delayq demo``: a small fleet of reminders, end to end.

It enqueues events with delays spread over a few seconds, prints every delivery
with its lateness (handler start minus due time, on Redis's clock), shows a
retry and a dead letter, and ends with a summary. Without ``--redis-url`` (or
``REDIS_URL``) it starts a private redis-server of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from .context import current_delivery, event_context
from .events import Event
from .metrics import InMemoryMetrics
from .retry import fixed
from .service import EventService

__all__ = ["Reminder", "main", "run_demo"]


class Reminder(Event, event_name="demo.reminder"):
    """A reminder to send to a user; ``fail_times`` makes the handler fail on purpose."""

    user: str
    text: str
    fail_times: int = 0


@dataclass
class _Tally:
    expected: int
    lateness_ms: list[float] = field(default_factory=list)
    delivered: set[str] = field(default_factory=set)
    attempts: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@contextlib.contextmanager
def _redis_url(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    from .testing import RedisServer  # only the demo needs a private server

    with RedisServer() as server:
        _out(f"started a private redis-server {'.'.join(map(str, server.version))} at {server.url}")
        yield server.url


async def run_demo(
    url: str,
    *,
    events: int = 30,
    spread: float = 4.0,
    prefix: str | None = None,
    seed: int | None = None,
) -> int:
    """Run the demo against ``url``; return 0 when every event ended as expected."""
    rng = random.Random(seed)
    prefix = prefix or f"demo-{os.getpid()}-{int(time.time())}"
    metrics = InMemoryMetrics()
    # one reminder always fails: it ends as a dead letter; two fail once and are retried
    always_fails, fails_once = "r-003", {"r-001", "r-002"}
    tally = _Tally(expected=events - 1)

    async def send_reminder(event: Reminder) -> bool:
        delivery = current_delivery()
        assert delivery is not None
        tally.attempts += 1
        late = delivery.lateness_ms or 0.0
        if delivery.attempt > event.fail_times:
            if event.id not in tally.delivered:
                tally.lateness_ms.append(late)
            tally.delivered.add(event.id)
            outcome = "delivered"
        else:
            outcome = "failed on purpose"
        _out(
            f"  {event.id}  attempt {delivery.attempt}  late {late:6.2f} ms  "
            f"to {event.user:<6} ({event_context().get('source', '-')}): {outcome}"
        )
        if len(tally.delivered) >= tally.expected:
            tally.done.set()
        return outcome == "delivered"

    async with EventService.from_url(
        url, prefix=prefix, retry_attempts=2, retry_backoff=fixed(0.3), metrics=metrics
    ) as service:
        service.add_handler(Reminder, send_reminder, concurrency=8)
        items = []
        for i in range(events):
            rid = f"r-{i:03d}"
            fail = 99 if rid == always_fails else (1 if rid in fails_once else 0)
            delay = round(rng.uniform(0.1, spread), 3)
            items.append(
                (
                    Reminder(
                        id=rid,
                        user=rng.choice(["ada", "linus", "grace"]),
                        text="your order shipped",
                        fail_times=fail,
                    ),
                    delay,
                )
            )
        _out(f"enqueueing {events} reminders with delays between 0.1 s and {spread} s ...")
        for event, delay in items:
            await service.enqueue_with_delay(event, delay, context={"source": "demo"})
        try:
            await asyncio.wait_for(tally.done.wait(), timeout=spread + 30)
        except asyncio.TimeoutError:
            _out("timed out waiting for deliveries")

        async def dead_count() -> int:
            return (await service.stats_for(Reminder)).dead

        deadline = time.monotonic() + 10
        # the dead letter is written just after the last failed attempt returns
        while await dead_count() < 1 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        dead = await service.dead_letters(Reminder)
        stats = await service.stats_for(Reminder)
        await service.purge_dead_letters(Reminder)

    retries = metrics.total("retried")
    _out("")
    _out("summary")
    _out(f"  delivered      {len(tally.delivered)} of {tally.expected} expected")
    _out(
        f"  lateness       p50 {_percentile(tally.lateness_ms, 0.5):.2f} ms, "
        f"p99 {_percentile(tally.lateness_ms, 0.99):.2f} ms, "
        f"max {max(tally.lateness_ms, default=float('nan')):.2f} ms (Redis clock)"
    )
    _out(f"  handler runs   {tally.attempts} (retries {retries})")
    _out(
        f"  dead letters   {len(dead)}"
        + "".join(f"\n    {d.id}: {d.error} after {d.attempts} attempts" for d in dead)
    )
    _out(
        f"  left in Redis  scheduled {stats.scheduled}, ready {stats.ready}, "
        f"in flight {stats.in_flight}"
    )
    ok = len(tally.delivered) == tally.expected and [d.id for d in dead] == [always_fails]
    _out("  result         " + ("OK" if ok else "UNEXPECTED"))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m delayq``."""
    parser = argparse.ArgumentParser(prog="python -m delayq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demo (starts a private Redis unless given a URL)")
    demo.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL"),
        help="Redis to use (default: $REDIS_URL, else a private redis-server)",
    )
    demo.add_argument("--events", type=int, default=30, help="how many reminders (default 30)")
    demo.add_argument(
        "--spread",
        type=float,
        default=4.0,
        help="delays are spread over this many seconds (default 4)",
    )
    demo.add_argument("--seed", type=int, default=None, help="random seed for the delays")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.events < 4:
        parser.error("--events must be at least 4")
    with _redis_url(args.redis_url) as url:
        return asyncio.run(run_demo(url, events=args.events, spread=args.spread, seed=args.seed))
