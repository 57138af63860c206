"""``delayq limits show|set|clear`` and ``delayq pause|resume`` (issue 22), against the
test Redis: JSON output checked, bad input fails with one line and exit code 2."""

from __future__ import annotations

import json

import pytest

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
        if "--json" in args and code == 0:
            return json.loads(out)
        return out, err

    return run


def test_limits_and_pause(cli) -> None:
    assert cli("limits", "show", "cli-flow", "--json") == {
        "type": "cli-flow", "group": "default", "concurrency": None, "rate": None,
        "paused": False, "per_key_concurrency": None, "per_key_rate": None,
    }  # fmt: skip
    got = cli("limits", "set", "cli-flow", "--concurrency", "4", "--rate", "50/s", "--json")
    assert got["concurrency"] == 4
    assert got["rate"] == {"count": 50, "period_ms": 1000, "burst": 5, "text": "50/s burst 5"}
    got = cli("limits", "set", "cli-flow", "--rate", "6000/min burst 20", "--json")
    assert got["concurrency"] == 4 and got["rate"]["burst"] == 20  # the other one is kept
    assert cli("pause", "cli-flow", "--json")["paused"] is True
    out, _ = cli("limits", "show", "cli-flow")
    assert "paused" in out and "yes" in out and "6000/min burst 20" in out
    assert cli("limits", "clear", "cli-flow", "--rate", "--json")["rate"] is None
    got = cli("limits", "clear", "cli-flow", "--json")
    assert got == {**got, "concurrency": None, "rate": None, "paused": True}  # pause is kept
    out, _ = cli("resume", "cli-flow")
    assert "cli-flow: running" in out
    got = cli("limits", "set", "cli-flow", "--concurrency", "2", "--group", "audit", "--json")
    assert got["group"] == "audit" and got["concurrency"] == 2
    assert cli("limits", "show", "cli-flow", "--json")["concurrency"] is None


def test_bad_input(cli) -> None:
    _, err = cli("limits", "set", "cli-flow", "--rate", "fast", code=2)
    assert "not like" in err
    _, err = cli("limits", "set", "cli-flow", code=2)
    assert "give --concurrency" in err
    cli("limits", "set", "cli-flow", "--concurrency", "0", code=2)
    cli("pause", "bad name!", code=2)


def test_per_key_limits_and_keys(cli, redis_url, prefix) -> None:
    """Per-key limits are set, shown and cleared; ``limits keys`` lists the backlogs."""
    import asyncio

    from delayq import Event, EventService

    class CliKeyed(Event, event_name="cli-keyed"):
        pass

    async def enqueue() -> None:
        async with EventService.from_url(redis_url, prefix=prefix) as svc:
            await svc.enqueue_many([CliKeyed(id=f"a{i}") for i in range(4)], key="acme")
            await svc.enqueue_many([CliKeyed(id="z")], key="[bold]zeta")

    asyncio.run(enqueue())
    got = cli("limits", "set", "cli-keyed", "--per-key-concurrency", "1", "--per-key-rate",
              "5/s", "--json")  # fmt: skip
    assert got["per_key_concurrency"] == 1 and got["per_key_rate"]["text"] == "5/s burst 1"
    out, _ = cli("limits", "show", "cli-keyed")
    assert "per-key concurrency" in out and "5/s burst 1" in out
    got = cli("limits", "keys", "cli-keyed", "--json")
    assert [(k["key"], k["ready"]) for k in got["keys"]] == [("acme", 4), ("[bold]zeta", 1)]
    assert got["in_rotation"] == 2
    out, _ = cli("limits", "keys", "cli-keyed")
    assert "[bold]zeta" in out  # shown as is, not as markup
    got = cli("limits", "clear", "cli-keyed", "--per-key", "--json")
    assert got["per_key_concurrency"] is None and got["per_key_rate"] is None
