"""The README as a landing page: its first example runs as written (against the test Redis
instead of localhost), its length and its figures' commands."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from delayq import events

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture(autouse=True)
def _hand_back_type_names():
    """The README's classes (``PaymentCheck``...) take wire names in the process-wide registry;
    hand them back afterwards so that other tests (the examples) may use those names."""
    saved = dict(events._registry)
    yield
    events._registry.clear()
    events._registry.update(saved)


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


async def _run(source: str) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "readme_example"}
    code = compile(source, str(README), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)  # our own README, never a payload
    if result is not None:
        await result
    return namespace


async def test_first_example_schedules_the_payment_check(redis_url: str, prefix: str) -> None:
    first = _python_blocks()[0]
    assert 'EventService.from_url("redis://localhost:6379/0", prefix="shop")' in first
    source = first.replace("redis://localhost:6379/0", redis_url).replace('"shop"', repr(prefix))
    namespace = await _run(source)
    client = aioredis.Redis.from_url(redis_url, protocol=2)
    try:
        name = namespace["PaymentCheck"].event_name  # type: ignore[attr-defined]
        due = await client.zscore(f"{{{prefix}:{name}}}:scheduled", "order-42")
        seconds, micros = await client.time()
        now_ms = seconds * 1000 + micros // 1000
        assert due is not None
        assert 3 * 3600 * 1000 - 60_000 < due - now_ms <= 3 * 3600 * 1000
    finally:
        await client.aclose()


def test_the_readme_is_a_landing_page() -> None:
    """At most ~250 lines, names the test command (.ci/run calls it), and every figure of
    its table carries the command that measured it. Its guide is the documentation site:
    tests/test_docs_blocks.py runs every page's blocks, this README's included."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert "bash scripts/test.sh" in text
    section = text.split("## How fast, how late, how big", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| delayq")]
    assert len(rows) >= 5
    for row in rows:
        command = row.rstrip(" |").rsplit("|", 1)[1].strip()
        assert re.fullmatch(r"`python (-m )?benchmarks([ ./].*)?`", command), row
