"""Looking at queues from the shell: ``stats`` (counts per type and delivery group),
``inspect`` (one event) and ``scheduled`` (upcoming events of a type)."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime, timezone
from typing import Annotated, Any

import typer
from rich import box
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..batches import BATCH_TYPE
from ..context import BATCH_KEY
from ..keys import DEFAULT_GROUP
from ..service import EventService
from ..storage.store import QueueCounts
from ..views.inspection import EventInfo
from .ops import (
    Connection,
    EventId,
    Json,
    Limit,
    TypeName,
    known_type,
    offset_option,
    parse_delay,
    run,
    with_connection,
)
from .output import add_columns, console, fail, human_seconds, print_json, text, when

__all__ = ["inspect", "register", "scheduled", "stats"]


def _counts_dict(c: QueueCounts) -> dict[str, Any]:
    return {
        "scheduled": c.scheduled,
        "ready": c.ready,
        "in_flight": c.in_flight,
        "dead": c.dead,
        "due": c.due,
        "next_due_at": None
        if c.next_due_at is None
        else c.next_due_at.isoformat().replace("+00:00", "Z"),
        "backlog_age_seconds": round(c.backlog_age, 3),
        "paused": c.paused,
        # levels in use only; absent for a type whose ready events are all at level 0
        **(
            {"ready_by_priority": {str(n): k for n, k in c.ready_by_priority.items()}}
            if c.ready_by_priority
            else {}
        ),
        "waiting": c.waiting,
    }


def _level_rows(table: Table, label: str, c: QueueCounts) -> None:
    """One row per priority level in use under a type's (or group's) row: its ready count
    (nothing for a type whose ready events are all at level 0)."""
    for level, n in sorted(c.ready_by_priority.items()):
        cell = Text(f"{label}  priority {level}", style="dim")
        table.add_row(cell, "", str(n), "", "", "", "", "")


_Read = tuple[dict[str, QueueCounts], dict[str, dict[str, QueueCounts]]]


async def _group_stats(
    service: EventService, names: list[str]
) -> dict[str, dict[str, QueueCounts]]:
    """Counts per delivery group of the types (among ``names``) that have named groups."""
    found: dict[str, dict[str, QueueCounts]] = {}
    for name in names:
        if await service.groups(name) != [DEFAULT_GROUP]:
            found[name] = await service.group_stats(name)
    return found


def _next_due(moment: datetime | None, now: datetime) -> Text:
    """The next due time, short enough for an 80-column terminal (``--json`` has the time)."""
    if moment is None:
        return Text("-", style="dim")
    delta = (moment - now).total_seconds()
    return Text(f"in {human_seconds(delta)}" if delta >= 0 else f"{human_seconds(-delta)} ago")


def _type_cell(label: str, paused: bool) -> Text:
    """A type's (or group's) name, and ``paused`` beside it while it is paused."""
    cell = text(label)
    if paused:  # why its backlog grows while workers run
        cell.append(" (paused)", style="bold yellow")
    return cell


def _stats_table(
    prefix: str,
    stats: dict[str, QueueCounts],
    groups: dict[str, dict[str, QueueCounts]] | None = None,
    refreshed: str | None = None,
    *,
    empty: str = "no event types under this prefix",
) -> Table:
    """The ``stats`` table. It fits 80 columns with type names of up to ~23 characters
    whole: no vertical rules, two-line headers, numbers and times that never wrap."""
    title = f"delayq · prefix {prefix}" + (f" · {refreshed}" if refreshed else "")
    table = Table(
        title=text(title),
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("type", overflow="fold")  # only a name longer than the room folds
    for column in ("scheduled", "ready", "in\nflight", "dead", "due", "next\ndue", "backlog\nage"):
        table.add_column(column, justify="left" if "next" in column else "right", no_wrap=True)
    now = datetime.now(timezone.utc)
    for name, c in sorted(stats.items()):
        age = text(human_seconds(c.backlog_age) if c.backlog_age else "0")
        if c.backlog_age >= 60:
            age.stylize("bold red")
        table.add_row(
            _type_cell(name, c.paused),
            str(c.scheduled),
            str(c.ready),
            str(c.in_flight),
            str(c.dead) if not c.dead else f"[red]{c.dead}[/red]",
            str(c.due),
            _next_due(c.next_due_at, now),
            age,
        )
        _level_rows(table, "", c)
        for group, g in sorted((groups or {}).get(name, {}).items()):
            # a group has its own ready, in-flight and dead sets; due times are the type's
            table.add_row(
                _type_cell(f"  {name} [{group}]", g.paused),
                str(g.scheduled),
                str(g.ready),
                str(g.in_flight),
                str(g.dead) if not g.dead else f"[red]{g.dead}[/red]",
                "",
                "",
                "",
            )
            _level_rows(table, "  ", g)
    if not stats:
        table.caption = text(empty)
    waiting = {n: c.waiting for n, c in stats.items() if c.waiting}
    if waiting:  # events waiting for their parents (after=[...]): none, no line
        table.caption = text(
            "waiting for parents: " + ", ".join(f"{n} {w}" for n, w in sorted(waiting.items()))
        )
    return table


@with_connection
def stats(
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh until Ctrl-C.")] = False,
    interval: Annotated[
        str, typer.Option("--interval", help="Refresh period with --watch (a duration).")
    ] = "2s",
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Per event type: scheduled, ready, in flight, dead, due now, the next due time and
    the backlog's age (how long the oldest due, unclaimed event has waited).

    With --watch --json, one JSON object per line at every refresh.
    Types with named delivery groups get one more row per group ("type \\[group]"; in
    JSON, a "groups" object of the same fields per group). A type (group) with ready
    events above priority level 0 gets a row per level in use under it, with that
    level's ready count (in JSON, "ready_by_priority": level -> count).
    """
    period = parse_delay(interval)
    if period < 0.1:
        fail("--interval must be at least 100ms")

    async def read(service: EventService) -> _Read:
        stats = await service.stats()
        return stats, await _group_stats(service, sorted(stats))

    def as_data(got: _Read) -> dict[str, Any]:
        stats, groups = got
        types: dict[str, Any] = {}
        for n, c in sorted(stats.items()):
            types[n] = _counts_dict(c)
            if n in groups:
                types[n]["groups"] = {g: _counts_dict(gc) for g, gc in sorted(groups[n].items())}
        return {"prefix": conn.prefix, "types": types}

    async def main() -> None:
        async with conn.connect() as service:
            if not watch:
                got = await read(service)
                if as_json:
                    print_json(as_data(got))
                else:
                    console.print(
                        _stats_table(conn.prefix, *got, empty=conn.nothing("event types"))
                    )
                return
            if as_json:
                while True:
                    data = as_data(await read(service))
                    data["checked_at"] = (
                        datetime.now(timezone.utc)
                        .isoformat(timespec="milliseconds")
                        .replace("+00:00", "Z")
                    )
                    sys.stdout.write(json.dumps(data) + "\n")
                    sys.stdout.flush()
                    await asyncio.sleep(period)
            with Live(console=console, auto_refresh=False) as live:
                while True:
                    got = await read(service)
                    at = datetime.now(timezone.utc).strftime("%H:%M:%S UTC")
                    refreshed = f"refreshed {at}, every {human_seconds(period)} · Ctrl-C to stop"
                    live.update(
                        _stats_table(
                            conn.prefix, *got, refreshed, empty=conn.nothing("event types")
                        ),
                        refresh=True,
                    )
                    await asyncio.sleep(period)

    try:
        run(main)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@with_connection
def inspect(
    type_name: TypeName,
    event_id: EventId,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Where one event is (scheduled, ready, in_flight, dead or absent) and all that is
    known: due time, attempts, lease deadline, last error, context, payload as JSON."""

    async def main() -> None:
        async with conn.connect() as service:
            info = await service.inspect(await known_type(service, type_name), event_id)
        if as_json:
            print_json(info.to_dict())
            return
        table = Table(show_header=False, box=None)
        table.add_column(style="bold")
        table.add_column()
        rows = [
            ("type", text(info.type_name)),
            ("id", text(info.id)),
            ("state", text(info.state)),
            ("due at", when(info.due_at)),
            ("attempts", text(str(info.attempts))),
            ("lease deadline", when(info.lease_deadline)),
            ("failed at", when(info.failed_at)),
            ("last error", text(info.last_error)),
            ("progress", text(_progress(info))),
            ("enqueued at", when(info.enqueued_at)),
            ("context", text(dict(info.context) or None)),
            ("payload", text(json.dumps(info.payload, ensure_ascii=False, indent=2))),
        ]
        if info.decode_error:
            rows.append(("decode error", text(info.decode_error)))
        for p in info.parents:  # enqueued with after=[...]: what it waits on, or waited on
            line = p.status + (f" ({p.error})" if p.error else "")
            kind = "batch" if p.event_type == BATCH_TYPE else p.event_type  # a callback's
            rows.append((f"parent {kind} {p.id}", text(line)))
        if BATCH_KEY in info.context:  # a batch's member: `delayq batches show` has it
            rows.append(("batch", text(f"member of {info.context[BATCH_KEY]}")))
        if info.outcome is not None:  # a type with results=: its outcome is kept
            kept = "kept" if info.outcome == "ok" else "kept: failed (a dead letter's error)"
            rows.append(("result", text(kept)))
        for name, g in info.groups.items():  # a type with delivery groups: each group's
            detail = g.due_at or g.lease_deadline or g.failed_at
            line = (
                f"{g.state}, {g.attempts} attempt(s)"
                + (f", {detail.isoformat()}" if detail else "")
                + (f", {g.last_error}" if g.last_error else "")
            )
            rows.append((f"group {name}", text(line)))
        for label, value in rows:  # a parent's label holds its id: text, not markup
            table.add_row(text(label), value)
        console.print(table)

    run(main)


@with_connection
def scheduled(
    type_name: TypeName,
    limit: Limit = 20,
    offset: Annotated[int, offset_option("earliest")] = 0,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Upcoming events of one type, earliest due first (retries waiting included)."""

    async def main() -> None:
        async with conn.connect() as service:
            items = await service.scheduled(await known_type(service, type_name), limit, offset)
        if as_json:
            print_json(
                {"type": type_name, "offset": offset, "events": [e.to_dict() for e in items]}
            )
            return
        table = Table(title=f"{type_name}: scheduled from #{offset}", title_justify="left")
        add_columns(table, ("id", "due", "attempts", "payload", "last error"))
        for e in items:
            table.add_row(
                text(e.id),
                when(e.due_at, short=True),
                str(e.attempts),
                text(json.dumps(e.payload, ensure_ascii=False)),
                text(e.last_error),
            )
        console.print(table)

    run(main)


def register(app: typer.Typer) -> None:
    """Add the ``stats``, ``inspect`` and ``scheduled`` commands to ``app``."""
    for command in (stats, inspect, scheduled):
        app.command(rich_help_panel="Operate")(command)


def _progress(info: EventInfo) -> str | None:
    """A running handler's last progress report as one line (None: none)."""
    p = info.progress
    if p is None:
        return None
    value = json.dumps(p.value, ensure_ascii=False)
    return value if p.note is None else f"{value} ({p.note})"
