"""``delayq batches list|show`` on real batches: open, waiting, done (with a failure) and
stuck; ``--json`` parsed and checked, Redis text shown literally, bad input one line."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from core_support import ServicePool

from delayq import Event, EventService
from delayq.cli.app import main


class CliRow(Event, event_name="cli-batch-row"):
    """A member: fails when ``fail`` is set (no retries: a dead letter at once)."""

    fail: bool = False


class CliDone(Event, event_name="cli-batch-done"):
    """A callback."""


NAME = "[bold red]import[/] <7>"


@pytest.fixture
def cli(redis_url, prefix, capsys, monkeypatch):
    """Run ``delayq ARGS`` in a thread (the test's loop keeps a batch open meanwhile)."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DELAYQ_PREFIX", prefix)
    monkeypatch.setenv("COLUMNS", "200")

    async def run(*args: str, code: int = 0) -> Any:
        got = await asyncio.to_thread(main, list(args))
        out, err = capsys.readouterr()
        assert got == code, f"exit {got}, wanted {code}\nstdout: {out}\nstderr: {err}"
        if "--json" in args and code in (0, 1):
            return json.loads(out)
        return out, err

    return run


@pytest.fixture
async def worker(redis_url: str, prefix: str) -> AsyncIterator[EventService]:
    pool = ServicePool(redis_url, prefix, retry_attempts=0)

    async def row(event: CliRow) -> None:
        if event.fail:
            raise RuntimeError("[red]planned[/red]")

    async def done(event: CliDone) -> None:
        pass

    try:
        service = await pool.start()
        service.add_handler(CliRow, row)
        service.add_handler(CliDone, done)
        yield service
    finally:
        await pool.aclose()


async def test_list_and_show_every_state(cli, worker, wait_for) -> None:
    service = worker
    out, _ = await cli("batches", "list")
    assert "no batches under prefix" in " ".join(out.split())
    # done, with one member failed (so on_success is skipped)
    async with service.batch(
        on_complete=CliDone(id="a-done"), on_success=CliDone(id="a-ok"), name=NAME
    ) as a:
        await a.enqueue_many([CliRow(id="a1"), CliRow(id="a2", fail=True)])

    async def a_done() -> bool:
        return (await service.batch_info(a.id)).state == "done"

    await wait_for(a_done)
    # waiting: its member is due in an hour
    async with service.batch(name="later") as b:
        await b.enqueue_with_delay(CliRow(id="b1"), 3600)
    async with service.batch() as c:  # open while the commands run
        await c.enqueue_with_delay(CliRow(id="c1"), 3600)
        got = await cli("batches", "list", "--json")
        assert got["prefix"] == service.options.prefix and got["state"] is None
        assert [(x["id"], x["state"]) for x in got["batches"]] == [
            (c.id, "open"), (b.id, "waiting"), (a.id, "done"),
        ]  # fmt: skip
        first = got["batches"][2]
        assert first["name"] == NAME and first["failed_ids"] == [["cli-batch-row", "a2"]]
        assert (first["total"], first["succeeded"], first["failed"]) == (2, 1, 1)
        assert first["on_complete"] == ["cli-batch-done", "a-done"]
        for state, wanted in (("open", c.id), ("waiting", b.id), ("done", a.id)):
            got = await cli("batches", "list", "--state", state, "--json")
            assert [x["id"] for x in got["batches"]] == [wanted], state
        got = await cli("batches", "list", "--limit", "1", "--json")
        assert [x["id"] for x in got["batches"]] == [c.id]
        out, _ = await cli("batches", "list")
        assert NAME in out and "[red]" not in out.replace(NAME, "")
        for batch_id in (a.id, b.id, c.id):
            assert batch_id in out
        assert "1 ok, 1 failed, 0 pending of 2" in out
        assert "0 ok, 0 failed, 1 pending of 1" in out

    # stuck: waiting with nothing finished for longer than --stuck-after
    async def stuck() -> Any:
        got = await cli("batches", "list", "--state", "stuck", "--stuck-after", "50ms", "--json")
        return [x for x in got["batches"] if x["id"] == b.id]

    (found,) = await wait_for(stuck)
    assert found["state"] == "stuck" and "no member finished" in found["stuck_reason"]
    got = await cli("batches", "list", "--state", "stuck", "--json")  # default: an hour
    assert got["batches"] == []

    got = await cli("batches", "show", a.id, "--json")
    assert got["id"] == a.id and got["state"] == "done" and got["done_at"].endswith("Z")
    assert got["on_success"] == ["cli-batch-done", "a-ok"] and got["expires_at"]
    out, _ = await cli("batches", "show", a.id)
    flat = " ".join(out.split())
    assert NAME in out and "done: a member failed, on_success skipped" in flat
    assert "failed cli-batch-row a2" in flat and "on_complete cli-batch-done a-done" in flat
    assert "1 ok, 1 failed, 0 pending of 2" in flat
    # `delayq inspect`: a member names its batch; a callback its batch as its parent
    out, _ = await cli("inspect", "cli-batch-row", "b1")
    assert f"member of {b.id}" in " ".join(out.split())
    async with service.batch(on_complete=CliDone(id="[bold]cb[/]")) as d:
        await d.enqueue_with_delay(CliRow(id="d1"), 3600)
    out, _ = await cli("inspect", "cli-batch-done", "[bold]cb[/]")
    assert f"parent batch {d.id}" in " ".join(out.split()) and "[bold]cb[/]" in out
    got = await cli("batches", "show", b.id, "--members", "5", "--json")
    assert got["waiting_on"] == [["cli-batch-row", "b1"]]
    out, _ = await cli("batches", "show", b.id)
    assert "waiting on cli-batch-row b1" in " ".join(out.split())
    out, _ = await cli("batches", "show", b.id, "--members", "0")
    assert "waiting on 1 (--members N lists them)" in " ".join(out.split())
    # no such batch: exit 1 (null with --json); a malformed id: one line, exit 2
    out, _ = await cli("batches", "show", "nothing-here", code=1)
    assert "no batch 'nothing-here'" in out
    assert await cli("batches", "show", "nothing-here", "--json", code=1) is None
    _, err = await cli("batches", "show", "bad id!", code=2)
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["batches", "list", "--state", "closed"], "--state must be one of open, waiting"),
        (["batches", "list", "--stuck-after", "soon"], "not a duration"),
        (["batches", "list", "--stuck-after", "0"], "--stuck-after must be more than 0"),
        (["batches", "list", "--limit", "0"], "--limit"),
        (["batches", "show"], "Missing argument 'BATCH_ID'"),
        (["batches", "show", "x", "--members", "1001"], "--members"),
    ],
)
async def test_bad_input_is_one_line(cli, args: list[str], message: str) -> None:
    _, err = await cli(*args, code=2)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


async def test_tables_cut_nothing_at_80_columns(cli, worker, monkeypatch, wait_for) -> None:
    from delayq.cli.output import console

    service = worker
    long_name = "nightly import of the customer ledger 2026-11-28 " + "x" * 30
    async with service.batch(name=long_name, on_complete=CliDone(id="n-done")) as batch:
        await batch.enqueue_many([CliRow(id=f"row-with-a-long-id-{n:04d}") for n in range(3)], 3600)
    monkeypatch.setattr(console, "width", 80)
    for args in (("batches", "list"), ("batches", "show", batch.id)):
        out, _ = await cli(*args)
        assert "…" not in out, out
        assert max(len(line) for line in out.splitlines()) <= 80, out
        assert batch.id in out  # whole, on one line: to be pasted into the next command
