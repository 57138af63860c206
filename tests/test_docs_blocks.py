"""Every Python block of the README and of the documentation site runs as written.

The pages are read in the order of the site's menu (mkdocs.yml), the README first, and
their ```python blocks run in that order in one namespace with top-level await, as if
pasted into one ``python -m asyncio`` session (each guide continues the examples before
it). They run against a private Redis: ``redis://localhost:6379/0`` and the prefix
``"shop"`` are replaced by the test's, the PostgreSQL URL by a private server's, and
``asyncio.run(main())`` by ``await main()`` (the session's loop is already running).

A block that cannot run here (it needs Spark, a cluster, hosts it names, or it is a
fragment) is marked on the line before it::

    <!-- docs-test: skip: needs a Spark session -->

Pages other parts of the project are editing keep their reasons in :data:`SKIPPED` instead.
``py`` blocks headed ``# name.py:`` are excerpts of the FastAPI example's files: every line
shown is in the file (tests/test_examples.py runs those).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from delayq import EventService, events

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
SKIP = re.compile(r"<!-- docs-test: skip: (.+?) -->\s*\Z")

#: (page, the block's first line) -> why it does not run here: blocks of pages that other
#: changes are editing now (a marker in the page says the same and is preferred)
SKIPPED = {
    ("docs/OBSERVABILITY.md", "from delayq import EventService"): "a fragment: `url` and `stop` come from your app",
    ("docs/OBSERVABILITY.md", "service = EventService.from_url(url, tracing=True)"): "a fragment: `url` and `tracer_provider` come from your app",
    ("docs/SCHEDULES.md", "from datetime import timedelta"): "its `async with service:` would stop the session's service; tests/test_schedules.py runs the same calls",
    ("docs/SPARK.md", "from delayq.spark import enqueue_dataframe"): "needs a Spark session and its `orders` DataFrame (tests/test_spark.py)",
    ("docs/SPARK.md", "from pyspark.sql import SparkSession, functions as F"): "a streaming query that runs until stopped, on hosts it names (tests/test_spark_stream.py)",
    ("docs/SPARK.md", "orders = ("): "needs a Kafka broker",
    ("docs/SPARK.md", "from delayq.spark import read_queue"): "needs a Spark session and the hosts it names (tests/test_spark.py)",
}  # fmt: skip


def pages() -> list[Path]:
    """The README, then the site's pages in menu order (a page that only includes another
    file, as index.md includes the README, counts as that file)."""
    nav = re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    found = [ROOT / "README.md"]
    for name in nav:
        page = DOCS / name
        include = re.fullmatch(r"<!-- include (\S+) -->\n", page.read_text(encoding="utf-8"))
        page = (page.parent / include.group(1)).resolve() if include else page
        if page not in found:
            found.append(page)
    return found


def blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """(line, source, skip reason or None) of each ```python block of the page."""
    text = page.read_text(encoding="utf-8")
    name = page.relative_to(ROOT).as_posix()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        source = match.group(1)
        marker = SKIP.search(text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1] + "\n")
        first = source.splitlines()[0].strip() if source.strip() else ""
        reason = marker.group(1) if marker else SKIPPED.get((name, first))
        found.append((line, source, reason))
    return found


def test_every_skip_has_a_block() -> None:
    """The table names blocks that exist (a block edited away leaves no stale reason)."""
    firsts = {
        (page.relative_to(ROOT).as_posix(), source.splitlines()[0].strip())
        for page in pages()
        for _, source, _ in blocks(page)
        if source.strip()
    }
    assert set(SKIPPED) <= firsts, set(SKIPPED) - firsts


@pytest.fixture(autouse=True)
def _hand_back_type_names():
    """The pages' classes take wire names in the process-wide registry; hand them back."""
    saved = dict(events._registry)
    yield
    events._registry.clear()
    events._registry.update(saved)


def _postgres_dsn() -> tuple[str | None, object]:
    """A PostgreSQL for the outbox blocks: DATABASE_URL, else a private server (or none)."""
    import os

    if os.environ.get("DATABASE_URL"):
        return os.environ["DATABASE_URL"], None
    from delayq.testing import PostgresServer

    try:
        server = PostgresServer().start()
    except Exception:  # no initdb/postgres here: those blocks alone are left out
        return None, None
    return server.url, server


async def test_the_blocks_run_in_order_as_pasted(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    made: list[EventService] = []
    setup = EventService._setup

    def tracked(self: EventService, *args: object) -> None:
        setup(self, *args)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(EventService, "_setup", tracked)
    monkeypatch.setenv("REDIS_URL", redis_url)
    dsn, pg_server = _postgres_dsn()
    namespace: dict[str, object] = {"__name__": "__main__"}
    ran, skipped = [], []
    try:
        for page in pages():
            name = page.relative_to(ROOT).as_posix()
            for line, block, reason in blocks(page):
                where = f"{name}:{line}"
                if reason is not None:
                    skipped.append((where, reason))
                    continue
                source = block.replace("redis://localhost:6379/0", redis_url)
                source = source.replace('"shop"', repr(prefix))
                source = source.replace("asyncio.run(main())", "await main()")
                if "postgresql://localhost/shop" in source:
                    if dsn is None:
                        skipped.append((where, "no PostgreSQL here"))
                        continue
                    source = source.replace('"postgresql://localhost/shop"', repr(dsn))
                code = compile(source, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                try:
                    result = eval(code, namespace)  # our own documentation, never a payload
                    if result is not None:
                        await result
                except Exception as exc:
                    raise AssertionError(f"the block at {where} failed:\n{block}") from exc
                ran.append(where)
                out = capsys.readouterr().out
                for shown_line in block.splitlines():  # a value shown in a comment is printed
                    if shown_line.startswith("print(") and "# " in shown_line:
                        shown = shown_line.split("# ", 1)[1].strip()
                        if (shown[:1] in "[{" and "..." not in shown) or shown in ("True", "False"):
                            assert shown in out, (where, shown_line, out)
    finally:
        for service in made:
            await service.aclose()
        if pg_server is not None:
            pg_server.stop()  # type: ignore[attr-defined]
    print(f"{len(ran)} blocks ran, {len(skipped)} skipped:", *skipped, sep="\n  ")
    assert len(ran) >= 30


def test_the_fastapi_files_shown_are_the_examples() -> None:
    """The ``py`` blocks headed ``# name.py:`` are excerpts of examples/fastapi_worker/name.py:
    every line shown, comments aside, is in the file, except ``...`` lines."""
    page = DOCS / "guides" / "fastapi.md"
    found = re.findall(r"```py\n# (\w+\.py):.*?\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    assert {name for name, _ in found} == {"events.py", "tasks.py", "web.py"}
    folder = ROOT / "examples" / "fastapi_worker"
    for name, body in found:
        text = (folder / name).read_text(encoding="utf-8")
        lines = {line.split("  #")[0].rstrip() for line in text.splitlines()}
        for line in body.splitlines():
            code = line.split("  #")[0].rstrip()
            if code and not code.lstrip().startswith("...") and not code.startswith("#"):
                assert code in lines, f"{name}: {line!r} is not in {folder / name}"
