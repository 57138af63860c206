"""The README's examples run as written (against the test Redis instead of localhost)."""

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


async def test_testing_example_runs() -> None:
    (block,) = [b for b in _python_blocks() if "with RedisServer() as server" in b]
    namespace = await _run(block)
    service = namespace["service"]
    await service.aclose()  # type: ignore[attr-defined]


async def test_dashboard_example_mounts_and_serves(redis_url: str, prefix: str) -> None:
    import httpx

    (block,) = [b for b in _python_blocks() if 'app.mount("/delayq", create_app(' in b]
    source = block.replace("redis://localhost:6379/0", redis_url).replace('"shop"', repr(prefix))
    namespace = await _run(source)
    transport = httpx.ASGITransport(app=namespace["app"])  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            r = await http.get("/delayq/")
            assert r.status_code == 200 and "Event types" in r.text
    finally:
        await namespace["service"].aclose()  # type: ignore[attr-defined]


def _postgres_dsn() -> tuple[str | None, object]:
    """A PostgreSQL for the outbox block: DATABASE_URL, else a private server (or none)."""
    import os

    if os.environ.get("DATABASE_URL"):
        return os.environ["DATABASE_URL"], None
    from delayq.testing import PostgresServer

    try:
        server = PostgresServer().start()
    except Exception:  # no initdb/postgres here: that block alone is left out
        return None, None
    return server.url, server


async def test_the_blocks_run_in_order_as_pasted(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the README invites: every ```python block, in order, in one `python -m asyncio`
    session (one namespace, top-level await), against a private Redis (and PostgreSQL)."""
    from delayq import EventService

    made: list[EventService] = []
    setup = EventService._setup

    def tracked(self: EventService, *args: object) -> None:
        setup(self, *args)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(EventService, "_setup", tracked)
    dsn, pg_server = _postgres_dsn()
    namespace: dict[str, object] = {"__name__": "__main__"}
    ran = []
    try:
        for number, block in enumerate(_python_blocks(), 1):
            source = block.replace("redis://localhost:6379/0", redis_url)
            source = source.replace('"shop"', repr(prefix))
            if "postgresql://localhost/shop" in source:
                if dsn is None:
                    continue
                source = source.replace('"postgresql://localhost/shop"', repr(dsn))
            code = compile(
                source, f"README.md block {number}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            )
            try:
                result = eval(code, namespace)  # our own README, never a payload
                if result is not None:
                    await result
            except Exception as exc:
                raise AssertionError(f"README block {number} failed:\n{block}") from exc
            ran.append(number)
            out = capsys.readouterr().out
            for line in block.splitlines():  # a value shown in full in a comment is what prints
                if line.startswith("print(") and "# " in line:
                    shown = line.split("# ", 1)[1].strip()
                    if shown[:1] in "[{" and "..." not in shown:
                        assert shown in out, (number, line, out)
    finally:
        for service in made:
            await service.aclose()
        if pg_server is not None:
            pg_server.stop()  # type: ignore[attr-defined]
    assert len(ran) >= len(_python_blocks()) - (1 if dsn is None else 0)


def test_the_fastapi_files_shown_are_the_examples() -> None:
    """The README's ``py`` blocks headed ``# name.py:`` are excerpts of
    examples/fastapi_worker/name.py (which tests/test_examples.py runs): every line shown,
    comments aside, is in the file, except ``...`` lines (what the excerpt leaves out)."""
    blocks = re.findall(
        r"```py\n# (\w+\.py):.*?\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S
    )
    assert {name for name, _ in blocks} == {"events.py", "tasks.py", "web.py"}
    folder = README.parent / "examples" / "fastapi_worker"
    for name, body in blocks:
        text = (folder / name).read_text(encoding="utf-8")
        lines = {line.split("  #")[0].rstrip() for line in text.splitlines()}
        for line in body.splitlines():
            code = line.split("  #")[0].rstrip()
            if code and not code.lstrip().startswith("...") and not code.startswith("#"):
                assert code in lines, f"{name}: {line!r} is not in {folder / name}"
