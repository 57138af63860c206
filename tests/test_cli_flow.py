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


@pytest.fixture
def flow_type(redis_url, prefix) -> str:
    """A type the prefix knows (one event enqueued): the commands refuse unknown ones."""
    import asyncio

    from delayq import Event, EventService

    class CliFlow(Event, event_name="cli-flow"):
        pass

    async def enqueue() -> None:
        async with EventService.from_url(redis_url, prefix=prefix) as svc:
            await svc.enqueue_with_delay(CliFlow(id="one"), 3600)

    asyncio.run(enqueue())
    return "cli-flow"


def test_limits_and_pause(cli, flow_type) -> None:
    assert cli("limits", "show", "cli-flow", "--json") == {
        "type": "cli-flow", "group": "default", "concurrency": None, "rate": None,
        "paused": False, "per_key_concurrency": None, "per_key_rate": None,
        "priority_aging_ms": None,
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


def test_bad_input(cli, flow_type) -> None:
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


def test_an_unknown_type_is_refused(cli, flow_type) -> None:
    """A mistyped type name would store limits or a pause nothing reads: exit 2, nothing
    written, unless --allow-unknown (a type whose first worker has not started yet)."""
    for args in (
        ("limits", "set", "cli-flwo", "--concurrency", "3"),
        ("pause", "cli-flwo"),
        ("resume", "cli-flwo"),
        ("limits", "show", "cli-flwo"),
        ("limits", "clear", "cli-flwo"),
        ("limits", "keys", "cli-flwo"),
    ):
        _, err = cli(*args, code=2)
        assert "unknown event type 'cli-flwo'" in err and "known: cli-flow" in err, err
        assert "--allow-unknown" in err
    got = cli("limits", "show", "cli-flwo", "--allow-unknown", "--json")
    assert got["concurrency"] is None and got["paused"] is False  # nothing was written
    got = cli("limits", "set", "cli-new", "--concurrency", "3", "--allow-unknown", "--json")
    assert got["concurrency"] == 3
    assert cli("pause", "cli-new", "--allow-unknown", "--json")["paused"] is True
    assert cli("resume", "cli-new", "--allow-unknown", "--json")["paused"] is False
