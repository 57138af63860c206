"""The key layout has one owner, ``delayq.keyspace``: no key position is written elsewhere, each
script's list of keys is exactly what its code uses, and docs/ARCHITECTURE.md's key table
agrees with the package. Pure Python, no service."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from delayq import lua
from delayq.keyspace import PrefixKeys, TypeKeys
from delayq.keyspace.scripts import BLOCKS, GROUPED, KEY_KINDS, SCRIPT_KEYS, lua_header, lua_name
from delayq.keyspace.shards import BATCH_SHARDS, BATCH_TYPE

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "delayq"


def _code(text: str, comment: str = "--") -> str:
    """Lua (or with ``comment="#"``, Python) without its comments: what runs."""
    return "\n".join(line.split(comment, 1)[0] for line in text.splitlines())


def test_no_lua_file_writes_a_key_position() -> None:
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted((PACKAGE / "lua").glob("*.lua"))
        for n, line in enumerate(_code(path.read_text(encoding="utf-8")).splitlines(), 1)
        if "KEYS[" in line or re.search(r"check_keys\(\s*\d", line)
    ]
    assert found == [], "KEYS by position outside delayq/keyspace:\n" + "\n".join(found)


# a list of keys indexed or sliced by number, a key count: k[3], keys[:10], view[1], n=21
_NUMBERED = re.compile(
    r"\b(?:k|g|keys|view|tk|\w+_keys)\[\s*:?\s*-?\d"
    r"|\bn\s*=\s*(?:\d+\s+if\b|None if\b.*\belse\s+\d)"
    r"|\bkey_count\b"
)


def test_no_python_module_counts_or_indexes_keys() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "keyspace" not in path.relative_to(PACKAGE).parts
        for n, line in enumerate(_code(path.read_text(encoding="utf-8"), "#").splitlines(), 1)
        if _NUMBERED.search(line)
    ]
    assert found == [], "keys by position outside delayq/keyspace:\n" + "\n".join(found)


@pytest.mark.parametrize("name", sorted(set(SCRIPT_KEYS) - set(BLOCKS)))
def test_a_script_lists_exactly_the_keys_it_uses(name: str) -> None:
    source = lua.source(name)
    body = source[len(lua_header(name)) :]
    used = set(re.findall(r"\bK_[A-Z0-9_]+\b", _code(body)))
    checked = {
        name
        for call in re.findall(r"check_keys\(([^)]*)\)", _code(body))
        for name in re.findall(r"'(\w+)'", call)
    }
    listed = {lua_name(n) for n in SCRIPT_KEYS[name]}
    if name in GROUPED:  # and the type's fkeys after the groups' (group_header)
        used.discard(lua_name("fkeys"))
    assert used == listed
    assert checked <= set(SCRIPT_KEYS[name])


def test_every_script_has_a_list() -> None:
    assert set(SCRIPT_KEYS) == {*lua.PER_TYPE, *lua.GROUPED, *lua.STANDALONE}


def _table() -> dict[str, tuple[str, str]]:
    """docs/ARCHITECTURE.md's key table: each key it names -> (its type cell, what it holds)."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("\n## Keys\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if "|" in line else []
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        first = ""
        for key in re.findall(r"`([^`]+)`", cells[0]):
            if key.startswith(":"):  # `:krot` after `{p:T}:klines`: same tag
                key = first.rsplit(":", 1)[0] + key
            first = first or key
            rows[key] = (cells[1], cells[2])
    return rows


def _documented_keys() -> dict[str, str]:
    """Each name of KEY_KINDS -> its key for prefix p and type T, as the table writes it."""
    tk, pk = TypeKeys("p", "T"), PrefixKeys("p")
    named = {**tk.named(), "retries": "{p:T}:g:<G>:scheduled"}
    named.update(
        sink="{p:T}:sink:<n>",
        index=pk.schedule_index,
        homes=pk.schedule_homes,
        lock=pk.scheduler_lock,
        members=pk.members,
        workers=pk.workers,
        worker=pk.worker("<id>"),
        minute=pk.history("<T>", "minute"),
        coarse=pk.history("<T>", "coarse"),
        types=pk.types,
        format=pk.format,
        dshards=pk.dependency_shards,
    )
    # a batch shard's own keys, its tag written as the table writes it
    bk = TypeKeys("p", BATCH_TYPE, 0, BATCH_SHARDS)
    record, members, failed = bk.batch("<id>")
    batch = {
        "bindex": bk.batch_index,
        "bopen": bk.batch_open,
        "bclosed": bk.batch_closed,
        "bdone": bk.batch_done,
        "bunconf": bk.batch_unconfirmed,
        "baudit": bk.batch_audit,
        "brec": record,
        "bmembers": members,
        "bfailed": failed,
    }
    named.update({n: k.replace(bk.tag, "{p:#batches/k}") for n, k in batch.items()})
    return named


def test_the_docs_key_table_matches_the_keyspace() -> None:
    table = _table()
    keys = _documented_keys()
    assert set(keys) == set(KEY_KINDS)
    wrong = [
        f"{name}: {key} is {table[key][0] if key in table else 'not in the table'}, "
        f"not {KEY_KINDS[name].upper()}"
        for name, key in sorted(keys.items())
        if key not in table or KEY_KINDS[name].upper() not in table[key][0].split(", ")
    ]
    assert wrong == []


def test_the_docs_name_every_field_of_meta() -> None:
    written = {
        field
        for path in (PACKAGE / "lua").glob("*.lua")
        for pair in re.findall(
            r"redis\.call\('H\w+', (?:K_META|k_meta), (?:front and )?'(\w+)'(?: or '(\w+)')?",
            _code(path.read_text(encoding="utf-8")),
        )
        for field in pair
        if field
    }
    described = set(re.findall(r"`(\w+)`", _table()[TypeKeys("p", "T").meta][1]))
    assert written and written <= described, written - described


@pytest.mark.parametrize("name", sorted(SCRIPT_KEYS))
def test_a_script_names_its_keys_in_its_opening_comment(name: str) -> None:
    text = (PACKAGE / "lua" / f"{name}.lua").read_text(encoding="utf-8")
    block = text.split("-- KEYS", 1)[1].split("\n-- ARG", 1)[0].split("\n-- Returns", 1)[0]
    named = [w for w in re.findall(r"`(\w+)`", block) if w in KEY_KINDS]
    assert named[: len(SCRIPT_KEYS[name])] == list(SCRIPT_KEYS[name])


def test_durations_round_up_to_whole_ms_without_float_noise() -> None:
    from datetime import datetime, timedelta, timezone

    from delayq.durations import delay_ms, due_unix_ms, seconds_to_ms
    from delayq.flow.dedup import dedup_mode

    # 4.03 * 1000 is 4030.0000000000005 in floats: still 4030 ms (it was 4031)
    assert [delay_ms(0.1), delay_ms(4.03), delay_ms(8.13), delay_ms(1.001)] == [
        100,
        4030,
        8130,
        1001,
    ]
    assert seconds_to_ms(0.0004) == 1  # a part of a ms is a whole one: never shorter
    assert delay_ms(timedelta(microseconds=1500)) == 2
    when = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=250)
    assert (
        due_unix_ms(when) == int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()) * 1000 + 1
    )
    # the dedup modes round as every other duration does
    assert dedup_mode(False, 0.0004, None) == dedup_mode(False, 0.001, None)


def test_delay_ms_of_a_timedelta_counts_its_whole_us_as_seconds_would() -> None:
    from datetime import timedelta

    from delayq.durations import delay_ms, seconds_to_ms

    # a timedelta goes by its whole µs (no float): the same ms as its seconds would give
    for us in (0, 1, 999, 1000, 1001, 1500, 100_000, 4_030_000, 3_600_000_000, 86_400 * 10**6 + 7):
        td = timedelta(microseconds=us)
        assert delay_ms(td) == seconds_to_ms(td.total_seconds()) == -(-us // 1000)
    assert delay_ms(timedelta(days=400, seconds=1, microseconds=1)) == 34_560_001_001
    for bad in (timedelta(microseconds=-1), timedelta(days=-1, hours=23)):
        with pytest.raises(ValueError, match="delay must be finite and >= 0"):
            delay_ms(bad)
    with pytest.raises(ValueError, match="debounce must be"):
        delay_ms(timedelta(seconds=-3), "debounce")
