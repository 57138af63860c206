"""``delayq schedules ...`` on a prepared schedule: --json parsed, bad input exits 2."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from cli_app import CliJob

from delayq import EventService
from delayq.cli.app import main


@pytest.fixture
def cli(redis_url, prefix, capsys, monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DELAYQ_PREFIX", prefix)
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str, code: int = 0):
        got = main(list(args))
        out, err = capsys.readouterr()
        assert got == code, f"exit {got}, wanted {code}\nstdout: {out}\nstderr: {err}"
        if "--json" in args and code in (0, 1):
            return json.loads(out)
        return out, err

    return run


def prepare(redis_url: str, prefix: str) -> None:
    async def go() -> None:
        service = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
        await service.schedule("nightly", CliJob, cron="0 3 * * *", timezone="Europe/Berlin")
        await service.schedule("<b>x</b>", CliJob, every=timedelta(minutes=5))
        await service.aclose()

    asyncio.run(go())


def test_schedules_commands(cli, redis_url, prefix) -> None:
    assert cli("schedules", "list", "--json") == []
    prepare(redis_url, prefix)
    listed = cli("schedules", "list", "--json")
    assert [s["name"] for s in listed] == ["<b>x</b>", "nightly"]
    nightly = cli("schedules", "show", "nightly", "--json")
    assert nightly["cron"] == "0 3 * * *" and nightly["timezone"] == "Europe/Berlin"
    assert nightly["paused"] is False and nightly["next_fire"]
    out, _ = cli("schedules", "list")
    assert "<b>x</b>" in out and "nightly" in out  # shown as text, never as markup
    assert cli("schedules", "pause", "nightly", "--json")["done"] is True
    assert cli("schedules", "show", "nightly", "--json")["paused"] is True
    assert cli("schedules", "resume", "nightly", "--json")["done"] is True
    fired = cli("schedules", "trigger", "nightly", "--json")
    assert fired["done"] and fired["id"].startswith("nightly@trigger-")
    assert cli("schedules", "remove", "nightly", "--json")["done"] is True
    assert cli("schedules", "remove", "nightly", "--json", code=1)["done"] is False
    assert cli("schedules", "show", "nightly", "--json", code=1) is None
    out, _ = cli("schedules", "pause", "nope", code=1)
    assert "no schedule" in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("show", ""), "schedule name"),
        (("show", "", "--json"), "schedule name"),
        (("pause", "a b"), "schedule name"),
        (("resume", "x" * 201), "schedule name"),
        (("trigger", "{tag}", "--json"), "schedule name"),
        (("remove", "bad\nname"), "schedule name"),
        (("show",), "Missing argument"),
        (("list", "extra"), "unexpected extra argument"),
        (("list", "--bogus"), "No such option"),
        (("explode",), "No such command"),
    ],
)
def test_bad_input_exits_2(cli, args: tuple[str, ...], says: str) -> None:
    # refused before any connection: exit 2 and a message on stderr, with --json too
    out, err = cli("schedules", *args, code=2)
    assert says in err and not out
