"""Hostile and bad input: garbage in delayq's keys, odd ids, payload limits, name collisions.

Garbage in a key (wrong Redis type, undecodable envelope, unknown type, missing envelope,
junk in a ready list) ends as a dead letter with a reason or a logged skip: the loops go on,
other types are unaffected, and no event that was accepted is stranded.
"""

from __future__ import annotations

import collections
import logging
import pickle

import msgspec
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from delayq import Event, EventService, current_delivery
from delayq.errors import error_code
from delayq.keys import PrefixKeys, TypeKeys


class HostileA(Event, event_name="hostile-a"):
    """The type whose keys get garbage."""

    n: int = 0


class HostileB(Event, event_name="hostile-b"):
    """A healthy type under the same prefix."""

    n: int = 0


class Needy(Event, event_name="hostile-needy"):
    """A type with a required field."""

    amount: int


TYPE_KEYS = [
    "events",
    "scheduled",
    "ready",
    "queued",
    "inflight",
    "leases",
    "attempts",
    "errors",
    "dead",
    "meta",
]


class Harness:
    """A service handling both types, recording what each handler saw."""

    def __init__(self, url: str, prefix: str, **options):
        self.seen: collections.Counter[tuple[str, str]] = collections.Counter()
        options = {"scheduling_interval": 0.1, "polling_timeout": 0.5, **options}
        self.service = EventService.from_url(url, prefix=prefix, **options)
        for t in (HostileA, HostileB, Needy):
            self.service.add_handler(t, self.handle, concurrency=4)
        self.admin = aioredis.Redis.from_url(url, protocol=2)
        self.a = TypeKeys(prefix, HostileA.event_name)
        self.b = TypeKeys(prefix, HostileB.event_name)
        self.p = PrefixKeys(prefix)

    async def handle(self, event) -> None:
        self.seen[type(event).event_name, event.id] += 1
        assert current_delivery() is not None

    def handled(self, t, ids) -> bool:
        return all(self.seen[t.event_name, i] for i in ids)

    async def drained(self, *types) -> bool:
        stats = await self.service.stats()
        return all(
            (c := stats.get(t.event_name)) is None or c.scheduled == c.ready == c.in_flight == 0
            for t in types
        )

    async def __aenter__(self):
        await self.service.__aenter__()
        return self

    async def __aexit__(self, *exc):
        await self.service.__aexit__(*exc)
        await self.admin.aclose()


async def _try_enqueue(service, event, delay) -> bool:
    try:
        return await service.enqueue_with_delay(event, delay)
    except ResponseError as exc:
        assert error_code(exc) == "WRONGTYPE", exc  # not ERR (Redis 7+, Valkey)
        return False


@pytest.mark.parametrize("suffix", TYPE_KEYS)
async def test_wrong_type_in_a_type_key(redis_url, prefix, wait_for, caplog, suffix):
    caplog.set_level(logging.WARNING, logger="delayq")
    async with Harness(redis_url, prefix) as h:
        # both types known and working
        await h.service.enqueue_with_delay(HostileA(id="a-first"), 0)
        await wait_for(lambda: h.handled(HostileA, ["a-first"]), timeout=10)
        key = getattr(h.a, suffix)
        assert not await h.admin.exists(key) or suffix == "meta"
        await h.admin.delete(key)
        await h.admin.set(key, "garbage")

        accepted = []
        for i in range(4):
            if await _try_enqueue(h.service, HostileA(id=f"a-{i}"), 0.2 * i):
                accepted.append(f"a-{i}")
        b_ids = [f"b-{i}" for i in range(4)]
        for i, b in enumerate(b_ids):
            assert await h.service.enqueue_with_delay(HostileB(id=b), 0.2 * i)
        # the healthy type is unaffected
        await wait_for(
            lambda: h.handled(HostileB, b_ids),
            timeout=10,
            message=f"{suffix}: the other type is handled",
        )
        # the problem is logged, naming the key
        await wait_for(
            lambda: any("WRONGTYPE" in r.getMessage() for r in caplog.records),
            timeout=10,
            message=f"{suffix}: a WRONGTYPE error is logged",
        )

        # repaired: everything accepted comes through; nothing was stranded half-way
        await h.admin.delete(key)
        assert await h.service.enqueue_with_delay(HostileA(id="a-after"), 0.1)
        await wait_for(
            lambda: h.handled(HostileA, [*accepted, "a-after"]),
            timeout=20,
            message=f"{suffix}: accepted events handled after the repair",
        )
        await wait_for(lambda: h.drained(HostileA, HostileB), timeout=20)
    assert max(h.seen.values()) == 1


async def test_wrong_type_in_prefix_keys(redis_url, prefix, wait_for, caplog):
    caplog.set_level(logging.WARNING, logger="delayq")
    async with Harness(redis_url, prefix, scheduling_interval=0.05) as h:
        await h.service.enqueue_with_delay(HostileA(id="warm-a"), 0)
        await h.service.enqueue_with_delay(HostileB(id="warm-b"), 0)
        await wait_for(lambda: h.handled(HostileA, ["warm-a"]) and h.handled(HostileB, ["warm-b"]))
        # the type set becomes a string, the lock a hash (and later a string without TTL)
        await h.admin.delete(h.p.types)
        await h.admin.set(h.p.types, "garbage")
        await h.admin.delete(h.p.scheduler_lock)
        await h.admin.hset(h.p.scheduler_lock, "x", "y")
        # and someone publishes junk on the wake-up channel
        for junk in ("not a type", "bad{name}", "unknown-type", "\x00"):
            await h.admin.publish(h.p.wakeup_channel, junk)
        ids = [f"late-{i}" for i in range(5)]
        for i, x in enumerate(ids):
            assert await h.service.enqueue_with_delay(HostileB(id=x), 0.1 + 0.1 * i)
        await wait_for(
            lambda: h.handled(HostileB, ids),
            timeout=15,
            message="scheduling goes on despite garbage prefix keys",
        )
        await h.admin.delete(h.p.scheduler_lock)
        await h.admin.set(h.p.scheduler_lock, "someone-else")  # no TTL: can never expire
        more = [f"later-{i}" for i in range(3)]
        for i, x in enumerate(more):
            assert await h.service.enqueue_with_delay(HostileB(id=x), 0.1 * i)
        await wait_for(
            lambda: h.handled(HostileB, more),
            timeout=15,
            message="a lock key without TTL is taken over",
        )
        await h.admin.delete(h.p.types)


async def test_undecodable_envelopes_become_dead_letters(redis_url, prefix, wait_for):
    async with Harness(redis_url, prefix) as h:
        garbage = {
            "not-an-envelope": b"hello",
            "empty": b"",
            "json-wrong-shape": b'{"a": 1}',
            "json-truncated": b'[{"id": "x"',
            "msgpack-garbage": b"\x93\xff\xff\xff",
            "pickle": pickle.dumps({"boom": 1}),
            "json-bad-utf8": b'[{"id": "\xff\xfe"}, null, 0]',
            "msgpack-bad-utf8": b"\x93\x81\xa2id\xa2\xff\xfe\xc0\x00",
            "payload-not-object": msgspec.json.encode([[1, 2], None, 0]),
            "payload-wrong-field-type": msgspec.json.encode([{"id": "x", "n": "NaN"}, None, 0]),
        }
        for i, (name, raw) in enumerate(garbage.items()):
            await h.admin.hset(h.a.events, name, raw)
            await h.admin.zadd(h.a.scheduled, {name: i})  # long due
        # a required field missing, for a type that needs it
        needy = TypeKeys(prefix, Needy.event_name)
        await h.admin.sadd(h.p.types, Needy.event_name)
        await h.admin.hset(needy.events, "no-amount", msgspec.json.encode([{"id": "x"}, None, 0]))
        await h.admin.zadd(needy.scheduled, {"no-amount": 0})
        await h.service.enqueue_with_delay(HostileA(id="good", n=1), 0)

        async def dead():
            a = await h.service.stats_for(HostileA)
            n = await h.service.stats_for(Needy)
            return a.dead == len(garbage) and n.dead == 1 and a.scheduled == a.ready == 0

        await wait_for(dead, timeout=15)
        letters = {d.id: d for d in await h.service.dead_letters(HostileA)}
        letters.update({d.id: d for d in await h.service.dead_letters(Needy)})
    assert h.seen[HostileA.event_name, "good"] == 1
    assert set(letters) == {*garbage, "no-amount"}
    for d in letters.values():
        assert d.event is None
        assert d.decode_error
        assert d.error.startswith("DecodeError"), d.error
        assert d.attempts == 1  # never retried: it cannot get better


async def test_unknown_and_invalid_type_names_in_the_type_set(redis_url, prefix, wait_for, caplog):
    caplog.set_level(logging.WARNING, logger="delayq")
    async with Harness(redis_url, prefix) as h:
        await h.admin.sadd(h.p.types, "ghost-type", "bad{name", "with space", b"\xff\xfe", "a:b")
        ids = [f"x-{i}" for i in range(5)]
        for i, x in enumerate(ids):
            assert await h.service.enqueue_with_delay(HostileB(id=x), 0.1 * i)
        await wait_for(lambda: h.handled(HostileB, ids), timeout=10)
        stats = await h.service.stats()
    assert "ghost-type" in stats  # a valid name with nothing in it: zeros, no harm
    assert stats["ghost-type"].scheduled == 0
    assert not {"bad{name", "with space", "a:b", "\ufffd\ufffd"} & set(stats)
    skipped = [
        r.getMessage() for r in caplog.records if "invalid event type name" in r.getMessage()
    ]
    assert len(skipped) >= 4


async def test_index_entries_without_envelopes_are_dropped_and_logged(
    redis_url, prefix, wait_for, caplog
):
    caplog.set_level(logging.WARNING, logger="delayq")
    async with Harness(redis_url, prefix, visibility_timeout=1) as h:
        await h.admin.sadd(h.p.types, HostileA.event_name)
        await h.admin.zadd(h.a.scheduled, {"ghost-scheduled": 0})  # due, no envelope
        await h.admin.zadd(h.a.inflight, {"ghost-inflight": 0})  # lease expired, no envelope
        await h.admin.hset(h.a.leases, "ghost-inflight", "1")
        ids = [f"ok-{i}" for i in range(5)]
        for i, x in enumerate(ids):
            assert await h.service.enqueue_with_delay(HostileA(id=x), 0.05 * i)
        await wait_for(lambda: h.handled(HostileA, ids), timeout=10)

        async def clean():
            c = await h.service.stats_for(HostileA)
            return c.scheduled == c.ready == c.in_flight == c.dead == 0

        await wait_for(clean, timeout=10)

        def logged(ghost: str) -> bool:
            return any(
                "no stored event" in r.getMessage() and ghost in r.getMessage()
                for r in caplog.records
            )

        # the due ghost is dropped by the consumer's claim, the expired one by the scheduler
        await wait_for(lambda: logged("ghost-scheduled") and logged("ghost-inflight"), timeout=5)
    assert ("hostile-a", "ghost-scheduled") not in h.seen
    assert max(h.seen.values()) == 1


async def test_junk_in_the_ready_list_is_skipped(redis_url, prefix, wait_for):
    async with Harness(redis_url, prefix) as h:
        await h.service.enqueue_with_delay(HostileA(id="before"), 0)
        await wait_for(lambda: h.handled(HostileA, ["before"]))
        junk = ["junk", "", ":", "123:", "999:no-such-id", "x" * 10_000, "\xff"]
        await h.admin.lpush(h.a.ready, *junk)
        await h.admin.rpush(h.a.ready, "456:also-no-such-id")
        ids = [f"r-{i}" for i in range(20)]
        assert all(await h.service.enqueue_many([HostileA(id=x) for x in ids], delay=0.05))
        await wait_for(lambda: h.handled(HostileA, ids), timeout=10)

        async def clean():
            c = await h.service.stats_for(HostileA)
            return c.scheduled == c.ready == c.in_flight == 0 and await h.admin.llen(h.a.ready) == 0

        await wait_for(clean, timeout=10)
    assert max(h.seen.values()) == 1
    assert not {i for (_, i) in h.seen} & set(junk)


ODD_IDS = [
    "with:colons:1",
    "0:looks-like-an-entry",
    "{braces}",
    "}{",
    "{prefix:type}:events",
    "ünïcødé ✓ 漢字",
    "emoji 🎉",
    "new\nline\ttab",
    " leading and trailing ",
    "nul\x00byte",
    "x" * 20_000,
]


async def test_odd_ids_round_trip(redis_url, prefix, wait_for):
    async with Harness(redis_url, prefix) as h:
        # due in an hour: still scheduled whatever the machine's load when the same ids
        # come again (a short delay let a loaded run handle one first, then take it anew)
        results = [
            await h.service.enqueue_with_delay(HostileA(id=i, n=k), 3600)
            for k, i in enumerate(ODD_IDS)
        ]
        assert all(results)
        # same id again: kept, not duplicated
        assert not any([await h.service.enqueue_with_delay(HostileA(id=i), 0) for i in ODD_IDS])
        # run now, found by its odd id
        assert all([await h.service.run_now(HostileA, i) for i in ODD_IDS])
        await wait_for(lambda: h.handled(HostileA, ODD_IDS), timeout=10)
        # cancel with odd ids
        assert await h.service.enqueue_with_delay(HostileA(id="{x}:y ü"), 3600)
        assert await h.service.cancel(HostileA, "{x}:y ü")
        assert not await h.service.cancel(HostileA, "{x}:y ü")
        await wait_for(lambda: h.drained(HostileA), timeout=10)
    assert {i for (t, i) in h.seen if t == "hostile-a"} == set(ODD_IDS)
    assert max(h.seen.values()) == 1


async def test_empty_id_is_rejected(redis_url, prefix):
    service = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
    async with service:
        with pytest.raises(ValueError, match="must not be empty"):
            await service.enqueue_with_delay(HostileA(id=""), 0)
        with pytest.raises(ValueError, match="must not be empty"):
            await service.enqueue_many([HostileA(id="fine"), HostileA(id="")])
        # validated before anything was written
        assert (await service.stats_for(HostileA)).ready == 0


class Sized(Event, event_name="hostile-sized"):
    """An event whose size the test controls."""

    blob: str = ""


def _sized(id: str, size: int, encode) -> Sized:
    """The Sized event whose encoding is exactly ``size`` bytes."""
    n = size - len(encode(Sized(id=id)))
    while len(encode(Sized(id=id, blob="y" * n))) > size:
        n -= 1
    event = Sized(id=id, blob="y" * n)
    assert len(encode(event)) == size
    return event


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
async def test_payload_at_and_over_max_payload_bytes(redis_url, prefix, wait_for, serializer):
    limit = 4096
    encode = msgspec.json.encode if serializer == "json" else msgspec.msgpack.encode
    seen = []

    async def handle(e: Sized) -> None:
        seen.append(e)

    service = EventService.from_url(
        redis_url,
        prefix=prefix,
        max_payload_bytes=limit,
        serializer=serializer,
        scheduling_interval=0.1,
    )
    service.add_handler(Sized, handle)
    async with service:
        at_limit = _sized("at", limit, encode)
        assert await service.enqueue_with_delay(at_limit, 0)
        over = _sized("over", limit + 1, encode)
        with pytest.raises(ValueError, match="max_payload_bytes"):
            await service.enqueue_with_delay(over, 0)
        with pytest.raises(ValueError, match="max_payload_bytes"):
            await service.enqueue_many([Sized(id="small"), over])
        await wait_for(lambda: at_limit in seen, timeout=10)
        stats = await service.stats_for(Sized)
        assert stats.ready == stats.scheduled == stats.in_flight == 0
    assert seen == [at_limit]  # nothing of the refused calls was written


def test_colliding_type_names():
    class Original(Event, event_name="hostile-collide"):
        pass

    # another class claiming the same wire name is refused at definition time
    with pytest.raises(TypeError, match="already used"):
        type("Impostor", (Event,), {"__module__": "elsewhere"}, event_name="hostile-collide")

    # a subclass does not inherit its parent's explicit name
    class Child(Original):
        pass

    assert Child.event_name != Original.event_name

    # names that could alias keys across prefixes, or break hash tags, are refused
    for bad in ("a:b", "x{y}", "with space", ""):
        with pytest.raises(ValueError):

            class Bad(Event, event_name=bad):
                pass


async def test_colon_in_prefix_cannot_alias_another_prefix(redis_url, prefix):
    # prefix "p" + type "a:b" would be {p:a:b}:...; prefix "p:a" + type "b" is the same key:
    # type names may not contain ':' so the first cannot exist.
    keys = TypeKeys(f"{prefix}:a", "b")
    assert keys.events == f"{{{prefix}:a:b}}:events"
    with pytest.raises(ValueError):
        TypeKeys(prefix, "a:b")
