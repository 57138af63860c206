"""The testing kit's clock offset (delayq.lua.shift): every script reads Redis's clock in
the one form it replaces, an offset script reads a later time, and a store that was never
shifted runs the scripts byte for byte as before."""

from __future__ import annotations

import re

import redis.asyncio as aioredis

from delayq import lua
from delayq.lua.shift import TIME_CALL, shifted
from delayq.storage.store import Store

NAMES = (*lua.PER_TYPE, *lua.GROUPED, *lua.STANDALONE)


def test_every_clock_read_is_the_form_the_offset_replaces() -> None:
    for name in NAMES:
        source = lua.source(name)
        reads = re.findall(r"""['"]TIME['"]""", source)
        assert len(reads) == source.count(TIME_CALL), f"{name}.lua reads TIME another way"
        # the offset's reader holds the only read left
        assert shifted(source, 1500).count(TIME_CALL) == min(1, len(reads)), name


def test_an_unshifted_store_runs_the_scripts_as_they_are(redis_url: str) -> None:
    store = Store(aioredis.Redis.from_url(redis_url), "shift-check")
    assert {n: s.script for n, s in store.core.scripts.items()} == {n: lua.source(n) for n in NAMES}
    store.set_clock_offset(0)
    assert {n: s.script for n, s in store.core.scripts.items()} == {n: lua.source(n) for n in NAMES}
    store.set_clock_offset(5)
    changed = {n for n, s in store.core.scripts.items() if s.script != lua.source(n)}
    assert changed == {n for n in NAMES if TIME_CALL in lua.source(n)}


async def test_an_offset_moves_the_clock_a_script_reads(redis_client: aioredis.Redis) -> None:
    probe = "local t = " + TIME_CALL + "\nreturn {tonumber(t[1]), tonumber(t[2])}"
    for offset_ms in (1, 999, 1000, 3_600_000 + 999, 400 * 86_400_000):
        before = await redis_client.time()
        seconds, micros = await redis_client.eval(shifted(probe, offset_ms), 0)
        after = await redis_client.time()
        read = int(seconds) * 1_000_000 + int(micros)
        assert 0 <= int(micros) < 1_000_000
        low = before[0] * 1_000_000 + before[1] + offset_ms * 1000
        high = after[0] * 1_000_000 + after[1] + offset_ms * 1000
        assert low <= read <= high, offset_ms
