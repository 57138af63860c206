"""An add of more members than a script call takes, and an ``enqueue_many(after=...)`` of
more children: every step goes in chunks of ``CHUNK`` (1,024) links, one script call
each, so no call holds Redis for the whole add (a batch of 100,000 members made one
``dep_link`` call of 100,000 links). The script calls are counted with ``MONITOR``."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
import redis

from delayq import Event, EventService
from delayq.keyspace.layout import PrefixKeys
from delayq.keyspace.shards import shard_for
from delayq.operations import batches as batch_ops
from delayq.operations.dependencies import CHUNK
from delayq.testing import RedisServer

N = 2 * CHUNK + 500  # three chunks: 1,024, 1,024 and 500


class ChunkMember(Event, event_name="ck-member"):
    """A batch member (and a child)."""


class ChunkParent(Event, event_name="ck-parent"):
    """A parent."""


_LINE = re.compile(rb"^\+\d+\.\d+ \[\d+ ([^\]]+)\] (.*)$")
_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"')


class ScriptCalls:
    """The script calls clients send (``EVALSHA``), by script name: the number of
    arguments (ARGV) of each, read from ``MONITOR`` up to a marker command."""

    def __init__(self, server: RedisServer, service: EventService):
        self.server = server
        self.names = {s.sha: name for name, s in service.store.core.scripts.items()}

    async def __aenter__(self) -> ScriptCalls:
        self.reader, self.writer = await asyncio.open_connection(self.server.host, self.server.port)
        self.writer.write(b"MONITOR\r\n")
        await self.writer.drain()
        assert await self.reader.readline() == b"+OK\r\n"
        return self

    async def calls(self) -> dict[str, list[int]]:
        """Send a marker through another connection; the script calls before it."""
        marker = b"ck-monitor-marker"
        _, w = await asyncio.open_connection(self.server.host, self.server.port)
        w.write(b"ECHO " + marker + b"\r\n")
        await w.drain()
        seen = b""  # read in large pieces: the scripts' own commands make many lines
        while marker not in seen:
            seen += await asyncio.wait_for(self.reader.read(1 << 20), 10)
        w.close()
        calls: dict[str, list[int]] = {}
        for line in seen[: seen.index(marker)].split(b"\r\n")[:-1]:
            match = _LINE.match(line)
            assert match, line[:200]
            if match.group(1) == b"lua" or not match.group(2).upper().startswith(b'"EVALSHA"'):
                continue
            args = _ARG.findall(match.group(2))
            name = self.names[args[1].decode()]
            calls.setdefault(name, []).append(len(args) - 3 - int(args[2]))
        return calls

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()
        await self.writer.wait_closed()


@pytest.fixture
async def producer(private_server: RedisServer, prefix: str) -> AsyncIterator[EventService]:
    """A producer (nothing in the background) whose scripts are loaded (no call is sent
    twice for a NOSCRIPT)."""
    service = EventService.from_url(private_server.url, prefix=prefix, enable_scheduling=False)
    try:
        for script in service.store.core.scripts.values():
            await service.store.redis.script_load(script.script)
        yield service
    finally:
        await service.aclose()


def _chunks(total: int, per: int) -> list[int]:
    return [min(per, total - i) for i in range(0, total, per)]


async def test_an_add_of_more_members_than_a_chunk(
    private_server: RedisServer, producer: EventService
) -> None:
    members = [ChunkMember(id=f"m{i}") for i in range(N)]
    async with ScriptCalls(private_server, producer) as monitor:
        async with producer.batch() as batch:
            assert all(await batch.enqueue_many(members))
        calls = await monitor.calls()
    refs = _chunks(N, CHUNK)  # [1024, 1024, 500]
    assert calls["batch_add"] == [3 + n for n in refs]  # batch id, grace, adder, the refs
    # batch shard, batch id, (member id, "n"): each linked before its enqueue
    assert calls["dep_prelink"] == [2 + 2 * n for n in refs]
    assert "dep_link" not in calls  # every member enqueued now: linked already
    assert calls["batch_confirm"] == [1 + n for n in refs]
    assert "batch_apply" not in calls  # every member pending
    assert len(calls["enqueue"]) == len(_chunks(N, 200))  # the usual route: 200 a call
    info = await producer.batch_info(batch.id)
    assert (info.state, info.total, info.pending, info.unconfirmed) == ("waiting", N, N, 0)


async def test_a_failed_add_is_settled_in_chunks(
    private_server: RedisServer, producer: EventService, prefix: str
) -> None:
    """An add whose enqueue fails (Redis gone, say) after its members were linked settles
    them at once: linked before an enqueue that never came, each is dropped (``dep_link``
    answers "vanished" and unlinks it), applied to the batch in chunks."""

    def enqueue_fails(step: str) -> None:
        if step == "prelinked":
            raise ConnectionError("the enqueue failed")

    batch_ops.STEP_HOOK = enqueue_fails
    try:
        async with ScriptCalls(private_server, producer) as monitor:
            with pytest.raises(ConnectionError):
                async with producer.batch() as batch:
                    await batch.enqueue_many([ChunkMember(id=f"m{i}") for i in range(N)])
            calls = await monitor.calls()
    finally:
        batch_ops.STEP_HOOK = None
    refs = _chunks(N, CHUNK)
    assert calls["dep_prelink"] == [2 + 2 * n for n in refs]
    assert "enqueue" not in calls
    assert calls["dep_link"] == [3 * n for n in refs]
    assert calls["batch_apply"] == [2 + 2 * n for n in refs]  # batch id, n, (ref, '')s
    assert "batch_confirm" not in calls  # dropped, not confirmed
    info = await producer.batch_info(batch.id)
    assert (info.state, info.total, info.unconfirmed) == ("done", 0, 0)
    raw = redis.Redis.from_url(private_server.url)
    try:  # nothing of the links is left in the members' slot
        assert raw.hkeys(PrefixKeys(prefix).for_shard(shard_for("ck-member", "m0", 1)).deps) == []
    finally:
        raw.close()


async def test_children_of_many_links_go_in_chunks(
    private_server: RedisServer, producer: EventService
) -> None:
    """Two parents pending: a child's two edges count, so 512 children a ``dep_wait``
    call; 2 links a child, 1,024 a ``dep_link`` call. A parent gone: its answers are
    applied 1,024 a call."""
    await producer.enqueue_many([ChunkParent(id="a"), ChunkParent(id="b")], 3600)
    children = [ChunkMember(id=f"c{i}") for i in range(N)]
    async with ScriptCalls(private_server, producer) as monitor:
        codes = await producer.enqueue_many(
            children, after=[(ChunkParent, "a"), (ChunkParent, "b")]
        )
        calls = await monitor.calls()
    assert all(codes)
    assert calls["dep_wait"] == [4 + 3 * n for n in _chunks(N, CHUNK // 2)]
    assert calls["dep_link"] == [3 * n for n in _chunks(2 * N, CHUNK)]
    assert "dep_apply" not in calls
    assert (await producer.stats())["ck-member"].waiting == N

    orphans = [ChunkMember(id=f"o{i}") for i in range(N)]
    async with ScriptCalls(private_server, producer) as monitor:
        codes = await producer.enqueue_many(orphans, after=[(ChunkParent, "never")])
        calls = await monitor.calls()
    assert all(codes)
    assert calls["dep_wait"] == [4 + 3 * n for n in _chunks(N, CHUNK)]
    assert calls["dep_link"] == [3 * n for n in _chunks(N, CHUNK)]
    assert calls["dep_apply"] == [4 + 3 * n for n in _chunks(N, CHUNK)]
    # the first N still wait; the orphans were released
    assert (await producer.stats())["ck-member"].waiting == N
