"""A process joining a running fleet moves its partitions from the start (issue 26, part 3).

On a 3-master cluster, two services in this process share a ``partitions=6`` type. The
newcomer's wake-up subscription is held back by a gate (a stand-in for a SUBSCRIBE that
fails or is slow, as the first one on a cluster client did); enqueues meanwhile publish
wake-ups it cannot hear. What must hold: it joins ``{p}:schedulers`` only once it hears
wake-ups; after joining or resubscribing it looks at its partitions at once, so it moves
their events itself (the other process moves none of them) and is never evicted.
No wall-clock assertion: the checks are who moved what and who was evicted.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import redis
from redis.asyncio.cluster import RedisCluster

from delayq import Event, EventService, current_delivery
from delayq.keys import PrefixKeys
from delayq.partitions.shards import shard_for, shards
from delayq.partitions.spread import owner_of
from delayq.storage.store import WakeupListener
from delayq.testing import wait_for
from delayq.testing.cluster import RedisClusterServer

# a 10 s full sweep: a process that lost track of a partition would not find it again
# within the test; takeover_delay 2 s leaves a loaded machine room
OPTIONS = {
    "visibility_timeout": 2.0,
    "scheduling_interval": 1.0,
    "lock_timeout": 10.0,
    "takeover_delay": 2.0,
    "polling_timeout": 1.0,
    "shutdown_grace": 2.0,
}


class JoinJob(Event, event_name="part-join", partitions=6):
    n: int = 0


class Gate:
    """Holds a service's wake-up subscriptions back until opened; can drop the current one."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.waiting = asyncio.Event()
        self.drop = False

    def install(self, service: EventService) -> None:
        store = service.store
        real = store.wakeups

        def wakeups() -> WakeupListener:
            listener = real()
            subscribe, next_name = listener.subscribe, listener.next

            async def gated_subscribe() -> None:
                self.waiting.set()
                await self.open.wait()
                self.waiting.clear()
                await subscribe()

            async def dropping_next(timeout: float) -> str | None:
                if self.drop:
                    self.drop = False
                    raise redis.ConnectionError("connection dropped by the test")
                return await next_name(timeout=timeout)

            listener.subscribe = gated_subscribe  # type: ignore[method-assign]
            listener.next = dropping_next  # type: ignore[method-assign]
            return listener

        store.wakeups = wakeups  # type: ignore[method-assign]


class Moves:
    """What one service's scheduler moved (events per shard) and whom it evicted."""

    def __init__(self, service: EventService) -> None:
        self.moved: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.evicted: list[str] = []
        store = service.store
        move_due, membership = store.scheduling.move_due, store.scheduling.scheduler_membership

        async def counting_move(type_name: str, *args: Any, **kwargs: Any) -> Any:
            r = await move_due(type_name, *args, **kwargs)
            self.moved[type_name] += r.moved
            self.calls[type_name] += 1
            return r

        async def counting_membership(token: str, ttl_ms: int, mode: str = "beat") -> Any:
            if mode.startswith("evict:"):
                self.evicted.append(mode[6:])
            return await membership(token, ttl_ms, mode)

        store.scheduling.move_due = counting_move  # type: ignore[method-assign]
        store.scheduling.scheduler_membership = counting_membership  # type: ignore[method-assign]

    def on(self, owned: set[str]) -> int:
        return sum(n for shard, n in self.moved.items() if shard in owned)


def _ids(prefix: str, owner: str, members: list[str], count: int) -> list[str]:
    """``count`` event ids whose partitions ``owner`` owns among ``members``."""
    ids: list[str] = []
    n = 0
    while len(ids) < count:
        event_id = f"{prefix}-{n}"
        if owner_of(shard_for(JoinJob.event_name, event_id, 6), members) == owner:
            ids.append(event_id)
        n += 1
    return ids


async def test_a_joining_process_moves_its_partitions_and_is_not_evicted(
    cluster: RedisClusterServer, prefix: str
) -> None:
    handled: Counter[str] = Counter()
    lateness: dict[str, float] = {}

    async def handle(event: JoinJob) -> None:
        handled[event.id] += 1
        delivery = current_delivery()
        if delivery is not None and delivery.lateness_ms is not None:
            lateness.setdefault(event.id, delivery.lateness_ms)

    def service() -> EventService:
        return EventService.from_url(cluster.url, cluster=True, prefix=prefix, **OPTIONS)

    raw = RedisCluster.from_url(cluster.url)
    members_key = PrefixKeys(prefix).members
    old, new = service(), service()
    old_moves, new_moves = Moves(old), Moves(new)
    gate = Gate()
    gate.install(new)
    try:
        old.add_handler(JoinJob, handle, concurrency=16)
        await old.start()
        # the type's layout is recorded: every process's scheduler knows the 6 partitions
        assert await old.enqueue_with_delay(JoinJob(id="seed"), 0)
        await wait_for(lambda: handled["seed"] == 1, timeout=15)
        assert old._scheduler is not None and new._scheduler is not None
        a = old._scheduler.token
        while True:  # tokens are random: 1 pair in 32 gives one of them all 6 partitions
            b = new._scheduler.token  # (new has not started: its token can still change)
            both = sorted([a, b])
            mine = {s for s in shards(JoinJob.event_name, 6) if owner_of(s, both) == b}
            if 0 < len(mine) < 6:
                break
            new._scheduler.token = uuid.uuid4().hex
        assert new._scheduler.spread.token == b  # (the spread moves under the same name)

        new.add_handler(JoinJob, handle, concurrency=16)
        await new.start()
        spread = new._scheduler.spread
        await wait_for(lambda: gate.waiting.is_set() and len(spread._units) == 6, timeout=15)

        # 1. not subscribed yet: wake-ups published now are lost on the newcomer, so it
        # must not own partitions (the old process moves everything, evicts no one)
        first = _ids("one", b, both, 30)
        assert all(await new.enqueue_many([(JoinJob(id=i), 1.5) for i in first]))
        await wait_for(lambda: all(handled[i] for i in first), timeout=30)
        assert [m.decode() for m in await raw.zrange(members_key, 0, -1)] == [a]
        assert old_moves.evicted == []

        # 2. subscribed: it joins, the old process hears of it at once, and the
        # newcomer moves what falls due on its partitions
        gate.open.set()
        old_spread = old._scheduler.spread

        async def agreed() -> bool:
            return spread.members == both and old_spread.members == both

        await wait_for(agreed, timeout=15)
        assert spread.owned() == mine
        before = old_moves.on(mine)
        second = _ids("two", b, both, 30)
        # due later than the old process's look ``takeover_delay`` after the wake-up
        assert all(await old.enqueue_many([(JoinJob(id=i), 3.0) for i in second]))
        await wait_for(lambda: all(handled[i] for i in second), timeout=30)
        assert old_moves.on(mine) == before, "the old process moved the newcomer's events"

        # 3. the subscription drops and comes back after wake-ups were missed: the
        # newcomer looks at its partitions again at once
        await wait_for(lambda: not set(spread._next) & mine, timeout=15)  # nothing planned
        gate.open.clear()
        gate.drop = True
        await wait_for(gate.waiting.is_set, timeout=15)
        third = _ids("three", b, both, 30)
        assert all(await old.enqueue_many([(JoinJob(id=i), 3.0) for i in third]))
        gate.open.set()
        await wait_for(lambda: all(handled[i] for i in third), timeout=30)
        assert old_moves.on(mine) == before, "the old process moved the newcomer's events"

        assert old_moves.evicted == [] and new_moves.evicted == []
        assert spread.members == both and old_spread.members == both

        # 4. evicted while alive (as a stalled process is): it comes back at once and,
        # its knowledge of its partitions being suspect, looks at every one of them
        await wait_for(lambda: not spread._next, timeout=15)  # nothing planned anywhere
        calls = Counter(new_moves.calls)
        await old.store.scheduling.scheduler_membership(a, 10_000, f"evict:{b}")

        def swept() -> bool:
            return all(new_moves.calls[s] > calls[s] for s in shards(JoinJob.event_name, 6))

        await wait_for(swept, timeout=5)
        await wait_for(agreed, timeout=15)
        assert all(handled[i] == 1 for i in [*first, *second, *third])
        worst = max(lateness[i] for i in [*second, *third])
        print(f"newcomer's partitions: max lateness {worst:.0f} ms")
    finally:
        await new.aclose()
        await old.aclose()
        await raw.aclose()


async def test_processes_without_wake_ups_still_join_and_move(
    cluster: RedisClusterServer, prefix: str
) -> None:
    """Pub/sub only makes moves faster: a process whose subscription never comes up joins
    at once when no other process moves the partitions, else after ten scheduling
    intervals, and moves its partitions on its timed looks."""
    handled: Counter[str] = Counter()

    async def handle(event: JoinJob) -> None:
        handled[event.id] += 1

    def service() -> EventService:
        options = {**OPTIONS, "scheduling_interval": 0.2, "lock_timeout": 2.0}
        return EventService.from_url(cluster.url, cluster=True, prefix=prefix, **options)

    first, second = service(), service()
    for s in (first, second):
        Gate().install(s)  # never opened
        s.add_handler(JoinJob, handle, concurrency=16)
    raw = RedisCluster.from_url(cluster.url)
    members_key = PrefixKeys(prefix).members
    try:
        await first.start()
        ids = [f"lone-{n}" for n in range(30)]
        assert all(await first.enqueue_many([(JoinJob(id=i), 0.5) for i in ids]))
        await wait_for(lambda: all(handled[i] == 1 for i in ids), timeout=30)
        assert first._scheduler is not None and second._scheduler is not None
        tokens = [first._scheduler.token]
        assert [m.decode() for m in await raw.zrange(members_key, 0, -1)] == tokens

        await second.start()
        tokens = sorted([*tokens, second._scheduler.token])

        async def both_members() -> bool:
            return [m.decode() for m in await raw.zrange(members_key, 0, -1)] == tokens

        await wait_for(both_members, timeout=30)
        more = [f"pair-{n}" for n in range(30)]
        assert all(await second.enqueue_many([(JoinJob(id=i), 0.5) for i in more]))
        await wait_for(lambda: all(handled[i] == 1 for i in more), timeout=30)
    finally:
        await second.aclose()
        await first.aclose()
        await raw.aclose()
