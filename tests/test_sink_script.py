"""sink_enqueue.lua on its own (no Spark): the streaming sink's ledger.

The Spark side (replays, killed drivers and executors) is in tests/test_spark.py
and tests/test_spark_stream.py; this checks the script's rules directly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from delayq import lua
from delayq.errors import error_code
from delayq.keys import PrefixKeys, TypeKeys

pytestmark = pytest.mark.servers

TYPE = "sink-probe"


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, protocol=2)
    try:
        yield c
    finally:
        c.close()


def call(client: redis.Redis, prefix: str, batch: int, *ids: str) -> list[int]:
    keys = TypeKeys(prefix, TYPE)
    args: list[str | int] = [
        "delay", f"0:{uuid.uuid4().hex}:1", PrefixKeys(prefix).wakeup_channel, TYPE, batch,
    ]  # fmt: skip
    for i in ids:
        args += [i, f"envelope-{i}", 3_600_000]
    return [
        int(c)
        for c in client.eval(lua.source("sink_enqueue"), 14, *keys.view(), keys.sink("s"), *args)
    ]  # type: ignore[union-attr]


def test_once_per_batch_and_id(client: redis.Redis, prefix: str) -> None:
    keys = TypeKeys(prefix, TYPE)
    assert call(client, prefix, 0, "a", "b", "a") == [1, 1, 4]  # a repeated id: skipped
    assert call(client, prefix, 0, "a", "c") == [4, 1]  # a replay, and a new row
    client.delete(keys.events, keys.scheduled)  # as if handled
    assert call(client, prefix, 0, "a", "b", "c") == [4, 4, 4]
    assert client.hlen(keys.events) == 0
    # a later batch: the ids are new rows (scheduled again), batch 0 is forgotten
    assert call(client, prefix, 1, "a") == [1]
    assert call(client, prefix, 1, "b", "a") == [1, 4]
    assert client.zrange(keys.sink("s"), 0, -1, withscores=True) == [(b"a", 1.0), (b"b", 1.0)]
    # pending ids follow enqueue's rule (kept)
    assert call(client, prefix, 2, "a") == [0]


def test_an_older_batch_is_refused(client: redis.Redis, prefix: str) -> None:
    keys = TypeKeys(prefix, TYPE)
    call(client, prefix, 5, "a")
    with pytest.raises(redis.ResponseError) as err:
        call(client, prefix, 4, "b")
    assert error_code(err.value) == "DELAYQ_SINK_REWOUND"
    assert client.hkeys(keys.events) == [b"a"]


def test_a_foreign_ledger_key_changes_nothing(client: redis.Redis, prefix: str) -> None:
    keys = TypeKeys(prefix, TYPE)
    client.set(keys.sink("s"), "x")
    with pytest.raises(redis.ResponseError) as err:
        call(client, prefix, 0, "a")
    assert error_code(err.value) == "WRONGTYPE"
    assert client.exists(keys.events) == 0
