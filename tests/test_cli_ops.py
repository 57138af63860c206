"""The operations commands on prepared queue states (``--json`` parsed and checked), and
every kind of bad input: one-line error, exit code 2, nothing written."""

from __future__ import annotations

import asyncio
import inspect
import json
import os

import pytest
import redis
from cli_app import CliJob

from delayq import Event, EventService, fixed
from delayq.cli.app import main
from delayq.cli.durations import parse_duration
from delayq.cli.ops import Connection, with_connection
from delayq.testing import free_port, wait_for


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
def sync_redis(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def snapshot(client: redis.Redis, prefix: str) -> dict[bytes, object]:
    """Every key of the prefix and its content: to prove nothing was written."""
    dump = {}
    for key in client.scan_iter(match=f"{{{prefix}*"):
        dump[key] = client.dump(key)
    return dump


def prepare(redis_url: str, prefix: str) -> None:
    """3 scheduled (one of them with a context), 2 ready, 3 dead letters of cli-job."""

    async def go() -> None:
        async def fail(event: CliJob) -> None:
            raise RuntimeError(f"planned {event.id}")

        worker = EventService.from_url(
            redis_url, prefix=prefix, retry_attempts=0, scheduling_interval=0.1, polling_timeout=1
        )
        worker.add_handler(CliJob, fail, concurrency=4)
        async with worker:
            await worker.enqueue_many([CliJob(id=f"d{i}", n=i) for i in range(3)])

            async def dead3() -> bool:
                return (await worker.stats_for(CliJob)).dead == 3

            await wait_for(dead3)
        producer = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
        await producer.enqueue_with_delay(CliJob(id="s1", n=1), 3600, context={"k": "v"})
        await producer.enqueue_with_delay(CliJob(id="s2", n=2), 7200)
        await producer.enqueue_with_delay(CliJob(id="s3", n=3), 60)
        await producer.enqueue_with_delay(CliJob(id="r1"), 0)
        await producer.enqueue_with_delay(CliJob(id="r2"), 0)
        await producer.aclose()

    asyncio.run(go())


def test_durations():
    assert parse_duration("250ms") == 0.25
    assert parse_duration("30s") == 30
    assert parse_duration("5m") == 300
    assert parse_duration("3h") == 10800
    assert parse_duration("2d") == 172800
    assert parse_duration("1.5") == 1.5
    for bad in ("", "-1s", "3 weeks", "1y", "abc", "1e9999"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_operations(cli, redis_url, prefix):
    prepare(redis_url, prefix)

    stats = cli("stats", "--json")
    job = stats["types"]["cli-job"]
    assert stats["prefix"] == prefix
    assert (job["scheduled"], job["ready"], job["in_flight"], job["dead"]) == (3, 2, 0, 3)
    assert job["due"] == 2 and job["next_due_at"].endswith("Z")
    assert job["backlog_age_seconds"] >= 0
    out, _ = cli("stats")
    assert "cli-job" in out and "backlog" in out  # headers on two lines: "backlog" / "age"

    info = cli("inspect", "cli-job", "s1", "--json")
    assert info["state"] == "scheduled" and info["context"] == {"k": "v"}
    assert info["payload"] == {"n": 1, "sleep_ms": 0, "fail": False, "id": "s1"}
    assert cli("inspect", "cli-job", "r1", "--json")["state"] == "ready"
    dead = cli("inspect", "cli-job", "d1", "--json")
    assert dead["state"] == "dead" and dead["last_error"] == "RuntimeError: planned d1"
    assert dead["attempts"] == 1
    assert cli("inspect", "cli-job", "nope", "--json")["state"] == "absent"
    out, _ = cli("inspect", "cli-job", "s1")
    assert "scheduled" in out

    page = cli("scheduled", "cli-job", "--json", "--limit", "2")
    assert [e["id"] for e in page["events"]] == ["s3", "s1"]
    page = cli("scheduled", "cli-job", "--json", "--offset", "2")
    assert [e["id"] for e in page["events"]] == ["s2"]
    out, _ = cli("scheduled", "cli-job")
    assert "s3" in out

    listed = cli("dead", "list", "cli-job", "--json")
    assert sorted(d["id"] for d in listed["dead"]) == ["d0", "d1", "d2"]
    assert all(d["error"].startswith("RuntimeError: planned") for d in listed["dead"])
    out, _ = cli("dead", "list", "cli-job")
    assert "d0" in out

    assert cli("dead", "requeue", "cli-job", "d0", "--delay", "1h", "--json")["requeued"] == 1
    requeued = cli("inspect", "cli-job", "d0", "--json")
    assert requeued["state"] == "scheduled" and requeued["attempts"] == 0
    assert cli("dead", "purge", "cli-job", "d1", "--json")["purged"] == 1
    assert cli("dead", "purge", "cli-job", "--all", "--yes", "--json")["purged"] == 1
    assert cli("stats", "--json")["types"]["cli-job"]["dead"] == 0

    enq = cli("enqueue", "cli_app:CliJob", "--id", "e1", "--delay", "3h",
              "--payload", '{"n": 42}', "--context", "who=cli", "--json")  # fmt: skip
    assert enq == {"type": "cli-job", "id": "e1", "enqueued": True, "delay_seconds": 10800}
    e1 = cli("inspect", "cli-job", "e1", "--json")
    assert e1["payload"]["n"] == 42 and e1["context"] == {"who": "cli"}
    again = cli("enqueue", "cli_app:CliJob", "--id", "e1", "--payload", '{"n": 1}', "--json")
    assert again["enqueued"] is False
    cli("enqueue", "cli_app:CliJob", "--id", "e1", "--payload", '{"n": 7}', "--replace", "--json")
    assert cli("inspect", "cli-job", "e1", "--json")["payload"]["n"] == 7
    # the dedup modes: debounce replaces (within its window), unique_for keeps the first
    cli("enqueue", "cli_app:CliJob", "--id", "e1", "--delay", "1m", "--payload", '{"n": 8}',
        "--debounce", "5m", "--json")  # fmt: skip
    assert cli("inspect", "cli-job", "e1", "--json")["payload"]["n"] == 8
    kept = cli("enqueue", "cli_app:CliJob", "--id", "e1", "--payload", '{"n": 9}',
               "--unique-for", "1h", "--json")  # fmt: skip
    assert kept["enqueued"] is False
    cli("enqueue", "cli_app:CliJob", "--id", "e2", "--delay", "1h", "--debounce", "1m", code=2)

    assert cli("cancel", "cli-job", "e1", "--json")["cancelled"] is True
    assert cli("inspect", "cli-job", "e1", "--json")["state"] == "absent"
    cli("cancel", "cli-job", "e1", "--json", code=1)


def test_requeue_all_with_progress(cli, redis_url, prefix):
    prepare(redis_url, prefix)
    out, _ = cli("dead", "requeue", "cli-job", "--all", "--delay", "5m", "--yes")
    assert "requeued 3" in out
    assert cli("stats", "--json")["types"]["cli-job"]["scheduled"] == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect", "no-such-type", "x"], "unknown event type 'no-such-type'"),
        (["inspect", "bad name", "x"], "may not contain"),
        (["scheduled", "no-such-type"], "unknown event type"),
        (["cancel", "no-such-type", "x"], "unknown event type"),
        (["dead", "purge", "no-such-type", "--all", "--yes"], "unknown event type"),
        (["dead", "requeue", "cli-job", "d0", "--delay", "soon"], "not a duration"),
        (["dead", "requeue", "cli-job"], "give the IDs"),
        (["dead", "requeue", "cli-job", "d0", "--all"], "not both"),
        (["dead", "purge", "cli-job", "--all"], "add --yes"),
        (["enqueue", "cli_app:CliJob", "--id", "x", "--delay", "3 weeks"], "not a duration"),
        (["enqueue", "cli_app:CliJob", "--id", "x", "--payload", "{oops"], "not valid JSON"),
        (["enqueue", "cli_app:CliJob", "--id", "x", "--payload", "[1]"], "must be a JSON object"),
        (
            ["enqueue", "cli_app:CliJob", "--id", "x", "--payload", '{"n": "many"}'],
            "invalid payload",
        ),
        (["enqueue", "cli_app:CliJob", "--id", "x", "--payload", '{"id": "y"}'], "differs"),
        (["enqueue", "cli_app:CliJob", "--id", "x", "--context", "novalue"], "key=value"),
        (["enqueue", "cli_app:nothing", "--id", "x"], "has no attribute"),
        (
            ["enqueue", "cli_app:service", "--id", "x"],
            "is an EventService object, not an event class (a subclass of delayq.Event); the module has cli_app:CliJob",
        ),
        # unknown fields would be dropped silently by msgspec: refused
        (
            ["enqueue", "cli_app:CliJob", "--id", "x", "--payload", '{"n": 1, "extra": 2}'],
            "--payload has fields cli-job does not have: extra (its fields: n, sleep_ms, fail)",
        ),
        # --all needs --yes off a terminal, for requeue as for purge
        (["dead", "requeue", "cli-job", "--all"], "add --yes"),
        (["dead", "requeue", "cli-job", "--all", "--json"], "add --yes"),
        (["purge", "cli-job", "--all"], "add --yes"),
        (["purge", "cli-job"], "give the IDs"),
        (["purge", "no-such-type", "--all", "--yes"], "unknown event type"),
        (["run-now", "no-such-type", "x"], "unknown event type"),
        (["run-now", "cli-job", "s1", "--group", "nope"], "no delivery group 'nope'"),
        # the same class elsewhere: what Redis or the encoder would refuse is refused first
        (
            ["scheduled", "cli-job", "--offset", "9223372036854775807"],
            "Invalid value for '--offset'",
        ),
        (
            ["dead", "list", "cli-job", "--offset", "99999999999999999999"],
            "Invalid value for '--offset'",
        ),
        (
            [
                "enqueue",
                "cli_app:CliJob",
                "--id",
                "x",
                "--payload",
                '{"n": 99999999999999999999999}',
            ],
            "cannot enqueue this cli-job: can't serialize ints",
        ),
        (["stats", "--interval", "0"], "at least 100ms"),
        (["dead", "list", "cli-job", "--group", "nope"], "no delivery group 'nope'"),
        (["dead", "purge", "cli-job", "--all", "--yes", "--group", "a:b"], "group name"),
    ],
)
def test_bad_input_writes_nothing(cli, redis_url, prefix, sync_redis, args, message):
    prepare(redis_url, prefix)
    before = snapshot(sync_redis, prefix)
    _, err = cli(*args, code=2)
    assert message in err, err
    assert len(err.strip().splitlines()) == 1
    assert snapshot(sync_redis, prefix) == before


@pytest.mark.parametrize(
    "args",
    [
        ["stats"],
        ["inspect", "cli-job", "x"],
        ["enqueue", "cli_app:CliJob", "--id", "x"],
        ["dead", "list", "cli-job"],
    ],
)
def test_redis_that_does_not_answer(cli, args):
    _, err = cli(*args, "--redis-url", f"redis://127.0.0.1:{free_port()}/0", code=2)
    assert err.startswith("error: cannot reach Redis at redis://127.0.0.1:")
    assert len(err.strip().splitlines()) == 1


def test_untrusted_text_is_not_markup(cli, redis_url, prefix):
    async def go() -> None:
        producer = EventService.from_url(redis_url, prefix=prefix, enable_scheduling=False)
        await producer.enqueue_with_delay(CliJob(id="[bold red]x[/]"), 60)
        await producer.aclose()

    asyncio.run(go())
    out, _ = cli("scheduled", "cli-job")
    assert "[bold red]x[/]" in out


class CliFan(Event, event_name="cli-fan"):
    """A type with a named delivery group whose handler fails."""


def test_delivery_groups(cli, redis_url, prefix):
    prepare(redis_url, prefix)

    async def go() -> None:
        async def ok(event: CliFan) -> None:
            pass

        async def fail(event: CliFan) -> None:
            raise RuntimeError(f"audit {event.id}")

        worker = EventService.from_url(
            redis_url, prefix=prefix, scheduling_interval=0.1, polling_timeout=1
        )
        worker.add_handler(CliFan, ok)
        worker.add_handler(CliFan, fail, group="audit", retry_attempts=0)
        async with worker:

            async def registered() -> bool:  # groups register as their consumers start
                return "audit" in await worker.groups("cli-fan")

            await wait_for(registered)
            await worker.enqueue_many([CliFan(id=f"f{i}") for i in range(3)])

            async def settled() -> bool:
                counts = await worker.group_stats("cli-fan")
                audit, default = counts.get("audit"), counts.get("default")
                return bool(audit and default and audit.dead == 3 and not default.in_flight)

            await wait_for(settled)

    asyncio.run(go())

    types = cli("stats", "--json")["types"]
    assert "groups" not in types["cli-job"]
    fan = types["cli-fan"]
    assert set(fan["groups"]) == {"audit", "default"}
    audit, default = fan["groups"]["audit"], fan["groups"]["default"]
    assert (audit["scheduled"], audit["ready"], audit["in_flight"], audit["dead"]) == (0, 0, 0, 3)
    assert (default["ready"], default["in_flight"], default["dead"]) == (0, 0, 0)
    assert set(audit) == set(types["cli-job"])  # the same count fields
    out, _ = cli("stats")
    assert "  cli-fan [audit]" in out and "  cli-fan [default]" in out
    assert "cli-job [" not in out

    assert cli("dead", "list", "cli-fan", "--json")["dead"] == []
    listed = cli("dead", "list", "cli-fan", "--group", "audit", "--json")
    assert listed["group"] == "audit"
    assert sorted(d["id"] for d in listed["dead"]) == ["f0", "f1", "f2"]
    assert listed["dead"][0]["error"].startswith("RuntimeError: audit")
    out, _ = cli("dead", "list", "cli-fan", "--group", "audit")
    assert "cli-fan [audit]" in out and "f0" in out
    # inspect shows the event in each group (dead for audit, handled by the default group)
    info = cli("inspect", "cli-fan", "f0", "--json")
    assert info["state"] == "dead"
    assert {g: v["state"] for g, v in info["groups"].items()} == {
        "audit": "dead",
        "default": "absent",
    }
    assert cli("inspect", "cli-job", "nope", "--json")["groups"] == {}
    out, _ = cli("inspect", "cli-fan", "f0")
    assert "group audit" in out and "RuntimeError: audit" in out and "group default" in out

    got = cli("dead", "requeue", "cli-fan", "f0", "--group", "audit", "--delay", "1h", "--json")
    assert got == {"type": "cli-fan", "group": "audit", "requeued": 1}
    # the default group has no dead letters to requeue
    assert cli("dead", "requeue", "cli-fan", "--all", "--yes", "--json")["requeued"] == 0
    audit = cli("stats", "--json")["types"]["cli-fan"]["groups"]["audit"]
    assert (audit["scheduled"], audit["dead"]) == (1, 2)
    assert cli("dead", "purge", "cli-fan", "f1", "--group", "audit", "--json")["purged"] == 1
    purged = cli("dead", "purge", "cli-fan", "--all", "--yes", "--group", "audit", "--json")
    assert purged["purged"] == 1
    assert cli("stats", "--json")["types"]["cli-fan"]["groups"]["audit"]["dead"] == 0


def test_run_now(cli, redis_url, prefix):
    prepare(redis_url, prefix)
    assert cli("inspect", "cli-job", "s2", "--json")["state"] == "scheduled"
    got = cli("run-now", "cli-job", "s2", "--json")
    assert got == {"type": "cli-job", "id": "s2", "group": None, "run_now": True}
    assert cli("inspect", "cli-job", "s2", "--json")["state"] == "ready"
    # not scheduled (ready now, a dead letter, or unknown): exit 1, nothing changes
    for event_id in ("s2", "d0", "nope"):
        out, _ = cli("run-now", "cli-job", event_id, code=1)
        assert "no such scheduled event" in out
    stats = cli("stats", "--json")["types"]["cli-job"]
    assert (stats["scheduled"], stats["ready"], stats["dead"]) == (2, 3, 3)


def test_purge_waiting_events(cli, redis_url, prefix):
    prepare(redis_url, prefix)  # 3 scheduled, 2 ready, 3 dead letters
    assert cli("purge", "cli-job", "s1", "nope", "--json") == {"type": "cli-job", "purged": 1}
    assert cli("purge", "cli-job", "--all", "--yes", "--json") == {"type": "cli-job", "purged": 4}
    job = cli("stats", "--json")["types"]["cli-job"]
    assert (job["scheduled"], job["ready"], job["in_flight"], job["dead"]) == (0, 0, 0, 3)
    out, _ = cli("purge", "cli-job", "--all", "--yes")
    assert "cancelled 0 waiting events" in out

    # a type with delivery groups: the type's schedule, every group's ready list, and
    # retries only one group holds (here the default group's; audit has acked them)
    async def go() -> None:
        async def fail(event: CliFan) -> None:
            raise RuntimeError("later")

        async def ok(event: CliFan) -> None:
            pass

        service = EventService.from_url(
            redis_url, prefix=prefix, scheduling_interval=0.1, polling_timeout=1
        )
        await service.register_group(CliFan, "audit")
        async with service:  # no handlers yet: due events wait in each group
            await service.enqueue_many([CliFan(id=f"f{i}") for i in range(3)])
            await service.enqueue_with_delay(CliFan(id="later"), 3600)

            async def fanned() -> bool:
                counts = await service.group_stats(CliFan)
                return all(c.ready == 3 for c in counts.values())

            await wait_for(fanned)
            ready = await service.ready(CliFan, group="audit")
            assert sorted(e.id for e in ready) == ["f0", "f1", "f2"]
            assert [e.id for e in await service.ready(CliFan, 2, 1)] == ["f1", "f2"]
            service.add_handler(CliFan, fail, retry_backoff=fixed(3600))
            service.add_handler(CliFan, ok, group="audit")

            async def settled() -> bool:
                counts = await service.group_stats(CliFan)
                audit, default = counts["audit"], counts["default"]
                return (audit.ready, audit.in_flight, default.ready, default.in_flight) == (
                    0, 0, 0, 0) and default.scheduled == 4  # fmt: skip

            await wait_for(settled)

    asyncio.run(go())
    assert cli("purge", "cli-fan", "--all", "--yes", "--json")["purged"] == 4
    fan = cli("stats", "--json")["types"]["cli-fan"]
    assert fan["scheduled"] == 0
    assert all((g["scheduled"], g["ready"]) == (0, 0) for g in fan["groups"].values())


def test_workers(cli, redis_url, prefix):
    out, _ = cli("workers")
    assert "no live workers" in out
    assert cli("workers", "--json") == {"prefix": prefix, "workers": []}

    async def go() -> dict:
        async def ok(event: CliJob) -> None:
            pass

        service = EventService.from_url(redis_url, prefix=prefix, heartbeat_interval=0.5)
        service.add_handler(CliJob, ok, concurrency=3)
        async with service:

            async def seen() -> bool:
                return len(await service.workers()) == 1

            await wait_for(seen)
            got = await asyncio.to_thread(cli, "workers", "--json")
            text, _ = await asyncio.to_thread(cli, "workers")
            assert "cli-job 0/3" in text
            return got

    got = asyncio.run(go())
    (worker,) = got["workers"]
    assert worker["types"] == {"cli-job": 3}
    assert worker["pid"] > 0 and worker["seen_at"].endswith("Z")
    assert set(worker) == {
        "id",
        "host",
        "pid",
        "version",
        "types",
        "in_flight",
        "started_at",
        "seen_at",
        "ttl_seconds",
    }


def test_stats_fits_80_columns_and_watch_says_when():
    from datetime import datetime, timedelta, timezone
    from io import StringIO

    from rich.console import Console

    from delayq.cli.queues import _stats_table
    from delayq.storage.store import QueueCounts

    soon = datetime.now(timezone.utc) + timedelta(minutes=5, seconds=30)
    counts = QueueCounts(scheduled=123456, ready=7, in_flight=3, dead=12, due=7,
                         next_due_at=soon, backlog_age=125.0)  # fmt: skip
    stats = {"payment-check": counts, "a-much-longer-event-type-name-for-reports": counts}
    out = StringIO()
    Console(file=out, width=80, color_system=None).print(
        _stats_table("shop", stats, None, "refreshed 12:00:01 UTC, every 2.0s")
    )
    rendered = out.getvalue()
    assert max(len(line) for line in rendered.splitlines()) <= 80
    assert "in 5m" in rendered and "…" not in rendered  # the next due time is whole
    assert "2m05s" in rendered and "123456" in rendered
    assert "refreshed 12:00:01 UTC" in rendered


def test_a_redis_error_is_one_line(cli, redis_url, prefix, sync_redis):
    """A key of the wrong type (written by something else) makes Redis refuse the script:
    one line naming the error, exit 1, not a traceback."""
    sync_redis.sadd(f"{{{prefix}}}:types", "wrong")
    sync_redis.set(f"{{{prefix}:wrong}}:scheduled", "x")
    for args in (["inspect", "wrong", "x"], ["scheduled", "wrong"], ["stats"]):
        _, err = cli(*args, code=1)
        assert err.startswith("error: Redis error (ResponseError): "), err
        assert "WRONGTYPE" in err
        assert len(err.strip().splitlines()) == 1


def test_lists_cut_nothing_at_80_columns(cli, redis_url, prefix, monkeypatch):
    """Ids (to be pasted into the next command) and times fold or wrap, never end in '…'."""
    from delayq.cli.output import console

    prepare(redis_url, prefix)
    long_id = "order-2026-11-25-with-a-rather-long-id-0001"
    cli("enqueue", "cli_app:CliJob", "--id", long_id, "--delay", "2h", "--payload", '{"n": 12345}')
    monkeypatch.setattr(console, "width", 80)
    for args in (["scheduled", "cli-job"], ["dead", "list", "cli-job"]):
        out, _ = cli(*args)
        assert "…" not in out, out
        assert max(len(line) for line in out.splitlines()) <= 80, out
    out, _ = cli("scheduled", "cli-job")
    cells = "".join(line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│"))
    assert long_id in cells  # the id column, read top to bottom


def test_stats_and_schedules_list_at_80_columns(redis_url, prefix):
    """The real commands on an 80-column terminal: type and schedule names of everyday
    length stay whole on one line, nothing ends in '…', and a paused type or schedule says
    so (a paused type's backlog grows while workers run: stats must show why)."""
    import subprocess
    import sys
    from pathlib import Path

    class Reminder(Event, event_name="send-reminder"):
        user: str = ""

    class Renewal(Event, event_name="payment-check-for-subscription-renewals"):
        pass

    async def setup() -> None:
        async with EventService.from_url(redis_url, prefix=prefix) as svc:
            await svc.enqueue_with_delay(Reminder(id="r1", user="ann"), 300)
            await svc.enqueue_with_delay(Renewal(id="p1"), 0)
            await svc.schedule("nightly-reminders-berlin", Reminder, payload={"user": "all"},
                               cron="0 9 * * *", timezone="Europe/Berlin")  # fmt: skip
            await svc.schedule("hourly-digest", Reminder, every=3600)
            await svc.pause(Reminder)
            await svc.pause_schedule("hourly-digest")

    asyncio.run(setup())
    env = {**os.environ, "COLUMNS": "80", "REDIS_URL": redis_url, "DELAYQ_PREFIX": prefix}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent.parent), env.get("PYTHONPATH", "")])  # fmt: skip

    def shown(*args: str) -> list[str]:
        got = subprocess.run([sys.executable, "-m", "delayq", *args], env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert got.returncode == 0, got.stderr
        lines = got.stdout.splitlines()
        assert "…" not in got.stdout, got.stdout
        assert max(len(line) for line in lines) <= 80, got.stdout
        return lines

    lines = shown("stats")
    assert any(line.startswith("send-reminder (paused) ") for line in lines), lines
    assert any("payment-check-for" in line for line in lines), lines
    lines = shown("schedules", "list")
    assert any(line.startswith("nightly-reminders-berlin ") for line in lines), lines
    assert any(line.startswith("hourly-digest (paused) ") for line in lines), lines
    assert any("Europe/Berlin" in line for line in lines), lines
    assert sum("send-reminder" in line for line in lines) == 2, lines
    got = json.loads(subprocess.run([sys.executable, "-m", "delayq", "stats", "--json"],
                                    env=env, capture_output=True, text=True, timeout=60,
                                    check=True).stdout)  # fmt: skip
    assert got["types"]["send-reminder"]["paused"] is True
    assert got["types"]["payment-check-for-subscription-renewals"]["paused"] is False


def test_an_empty_answer_says_where_it_looked(cli, redis_url):
    """No types, workers or schedules under the prefix: the answer names the prefix and
    the Redis (without its password) it looked at, and how to choose them."""
    url = redis_url.replace("redis://", "redis://:hunter2@") if "@" not in redis_url else None
    for args in (["stats"], ["workers"], ["schedules", "list"]):
        out, _ = cli(*args)
        flat = " ".join(out.split())
        assert "under prefix 't-" in flat and redis_url in flat, out
        assert "--prefix or DELAYQ_PREFIX" in flat and "--redis-url or REDIS_URL" in flat
    _, err = cli("inspect", "nothing-here", "x", code=2)
    assert "--prefix or DELAYQ_PREFIX" in err
    if url:  # a password in the URL is never shown
        from delayq.cli.ops import Connection

        assert "hunter2" not in Connection(url, "p").nothing("event types")


def test_with_connection_puts_the_options_where_conn_was() -> None:
    """The connection options are declared once (delayq.cli.ops): a command takes
    ``conn: Connection`` and Typer sees --redis-url, --prefix and --cluster in its place."""

    def command(name: str, as_json: bool = False, conn: Connection = Connection()) -> Connection:
        return conn

    wrapped = with_connection(command)
    assert list(inspect.signature(wrapped).parameters) == [
        "name", "as_json", "redis_url", "prefix", "cluster",
    ]  # fmt: skip
    got = wrapped("x", redis_url="redis://h:1/0", prefix="p", cluster=True)
    assert got == Connection("redis://h:1/0", "p", True)
    with pytest.raises(TypeError, match="conn"):
        with_connection(lambda name: None)
