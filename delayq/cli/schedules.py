"""``delayq schedules list|show|pause|resume|trigger|remove``: recurring schedules from the
shell (they are created by the application's ``EventService.schedule``)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from ..events import validate_name
from ..schedules.api import ScheduleInfo
from .ops import Connection, Json, run, with_connection
from .output import add_columns, console, fail, not_found, print_json, text, when

__all__ = ["register", "schedule_json"]

Name = Annotated[
    str, typer.Argument(metavar="NAME", help="The schedule's name.", show_default=False)
]


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(timespec="milliseconds")


def schedule_json(info: ScheduleInfo) -> dict[str, Any]:
    """One schedule as the ``--json`` output shows it (stable field names)."""
    return {
        "name": info.name,
        "type": info.event_type,
        "cron": info.cron,
        "every_seconds": None if info.every is None else info.every.total_seconds(),
        "timezone": info.timezone,
        "next_fire": _iso(info.next_fire),
        "last_fire": _iso(info.last_fire),
        "last_slot": _iso(info.last_slot),
        "last_event_id": info.last_event_id,
        "lag_seconds": None if info.lag is None else info.lag.total_seconds(),
        "paused": info.paused,
        "overlap": info.overlap,
        "priority": info.priority,
        "catch_up_seconds": None if info.catch_up is None else info.catch_up.total_seconds(),
        "jitter_seconds": info.jitter.total_seconds(),
        "start_at": _iso(info.start_at),
        "end_at": _iso(info.end_at),
        "fires": info.fires,
        "skipped": info.skipped,
        "triggers": info.triggers,
        "buffered": _iso(info.buffered),
        "payload": info.payload,
        "context": info.context,
    }


def _check(name: str) -> None:
    try:
        validate_name(name, "schedule name")
    except (TypeError, ValueError) as exc:
        fail(str(exc))


schedules = typer.Typer(
    help="Recurring schedules: list, show, pause, resume, trigger, remove.",
    no_args_is_help=True,
)


@schedules.command("list")
@with_connection
def list_(
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Every schedule under the prefix: expression and zone, next and last fire, lag,
    state, fires (and skipped slots)."""

    async def main() -> list[ScheduleInfo]:
        async with conn.connect() as service:
            return await service.schedules()

    infos = run(main)
    if as_json:
        print_json([schedule_json(i) for i in infos])
        return
    if not infos:
        console.print(text(conn.nothing("schedules")))
        return
    console.print(_schedules_table(infos, console.width))


def _schedules_table(infos: list[ScheduleInfo], width: int) -> Table:
    """Every schedule, one row each, the type under the name and the zone under the
    expression. On a terminal too narrow for it (80 columns) the times wrap between
    date, time and how far off, so that names stay whole; nothing is cut."""
    now = datetime.now(timezone.utc)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    add_columns(table, ("name\ntype", "expression\nzone", "next fire", "last fire", "fires"))
    for i in infos:
        name = text(i.name)
        if i.paused:
            name.append(" (paused)", style="bold yellow")
        name.append("\n" + i.event_type, style="dim")
        last = when(i.last_fire, now, short=True)
        if i.lag is not None:
            last.append(f" lag {i.lag.total_seconds() * 1000:.0f}ms")
        fires = f"{i.fires}" + (f", {i.skipped} skipped" if i.skipped else "")
        table.add_row(
            name,
            text(f"{i.expression}\n{i.timezone}"),
            when(i.next_fire, now, short=True),
            last,
            text(fires),
        )
    if console.measure(table, options=console.options.update(max_width=10_000)).maximum > width:
        for column in table.columns[2:4]:  # "2026-11-29" is the longest word of a time
            column.width = len("(in 23h59m)")
    return table


@schedules.command()
@with_connection
def show(
    name: Name,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """One schedule in full. Exit code 1 when there is none by that name."""
    _check(name)

    async def main() -> ScheduleInfo | None:
        async with conn.connect() as service:
            return await service.schedule_info(name)

    info = run(main)
    if info is None:
        not_found(f"no schedule named {name!r}", as_json)
    data = schedule_json(info)
    if as_json:
        print_json(data)
        return
    table = Table("field", "value", show_header=False)
    for key, value in data.items():
        table.add_row(text(key), text(value))
    console.print(table)


def _action(verb: str, name: str, as_json: bool, conn: Connection) -> None:
    _check(name)

    async def main() -> bool | str | None:
        async with conn.connect() as service:
            if verb == "pause":
                return await service.pause_schedule(name)
            if verb == "resume":
                return await service.resume_schedule(name)
            if verb == "trigger":
                return await service.trigger_schedule(name)
            return await service.unschedule(name)

    result = run(main)
    done = bool(result)
    if as_json:
        data: dict[str, Any] = {"name": name, "action": verb, "done": done}
        if verb == "trigger":
            data["id"] = result if isinstance(result, str) else None
        print_json(data)
    elif not done:
        console.print(text(f"no schedule named {name!r}"))
    elif verb == "trigger":
        console.print(text(f"fired {name!r} now: event {result}"))
    else:
        console.print(text(f"{verb}d {name!r}" if verb.endswith("e") else f"{verb}ed {name!r}"))
    raise typer.Exit(0 if done else 1)


@schedules.command()
@with_connection
def pause(name: Name, as_json: Json = False, conn: Connection = Connection()) -> None:
    """Stop firing a schedule until resumed. Exit code 1 when there is none."""
    _action("pause", name, as_json, conn)


@schedules.command()
@with_connection
def resume(name: Name, as_json: Json = False, conn: Connection = Connection()) -> None:
    """Fire a paused schedule again from its next slot. Exit code 1 when there is none."""
    _action("resume", name, as_json, conn)


@schedules.command()
@with_connection
def trigger(name: Name, as_json: Json = False, conn: Connection = Connection()) -> None:
    """Fire a schedule once now, besides its regular slots. Exit code 1 when there is none."""
    _action("trigger", name, as_json, conn)


@schedules.command()
@with_connection
def remove(name: Name, as_json: Json = False, conn: Connection = Connection()) -> None:
    """Delete a schedule (fires already enqueued stay). Exit code 1 when there is none."""
    _action("remove", name, as_json, conn)


def register(app: typer.Typer) -> None:
    """Add the ``schedules`` command group to ``app``."""
    app.add_typer(schedules, name="schedules", rich_help_panel="Operate")
