"""Dead letters from the shell: ``dead list``, ``dead requeue`` and ``dead purge``, of a
type or of one of its delivery groups, page by page with a progress bar."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from ..events import validate_name
from ..keys import DEFAULT_GROUP
from ..service import EventService
from .ops import (
    Connection,
    GroupName,
    Json,
    Limit,
    TypeName,
    Yes,
    confirm,
    ids_argument,
    known_type,
    offset_option,
    parse_delay,
    pick_ids,
    run,
    shown,
    with_connection,
)
from .output import add_columns, console, fail, print_json, text, when

__all__ = ["dead", "register"]


async def _known_group(service: EventService, name: str, group: str) -> str | None:
    """``group`` if ``name`` has it (None for the default group); else a one-line failure."""
    if group == DEFAULT_GROUP:
        return None
    try:
        validate_name(group, "group name")
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    groups = await service.groups(name)
    if group not in groups:
        fail(f"{name!r} has no delivery group {group!r} (groups: {', '.join(groups)})")
    return group


async def _dead_count(service: EventService, name: str, group: str | None) -> int:
    if group is None:
        return (await service.stats_for(name)).dead
    counts = await service.group_stats(name)
    return counts[group].dead if group in counts else 0


async def _bulk(
    service: EventService,
    name: str,
    ids: list[str] | None,
    label: str,
    apply: Callable[[list[str]], Awaitable[int]],
    show: bool,
    group: str | None = None,
) -> int:
    """Apply ``apply`` page by page (all dead letters now present, or ``ids``), with a progress bar."""
    total = len(ids) if ids is not None else await _dead_count(service, name, group)
    done = 0
    with Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        disable=not show or not console.is_terminal,
        transient=True,
    ) as progress:
        bar = progress.add_task(label, total=total)
        seen = 0
        while seen < total:
            if ids is not None:
                page = ids[seen : seen + 500]
            else:
                page = [
                    d.id
                    for d in await service.dead_letters(
                        name, limit=min(500, total - seen), group=group
                    )
                ]
                if not page:
                    break
            seen += len(page)
            done += await apply(page)
            progress.update(bar, completed=seen)
    return done


_Apply = Callable[[list[str]], Awaitable[int]]
_REQUEUE_ALL = "Requeue all {count} dead letters of {name}?"
_PURGE_ALL = "Delete all {count} dead letters of {name} for good?"


def _act(
    conn: Connection,
    type_name: str,
    group: str,
    chosen: list[str] | None,
    yes: bool,
    as_json: bool,
    label: str,
    question: str,
    action: Callable[[EventService, str, str | None], _Apply],
) -> int:
    """Requeue or purge (``label``) the ``chosen`` dead letters, or all of them once
    ``question`` (on ``{count}`` and ``{name}``) is answered; return how many it did."""

    async def main() -> int:
        async with conn.connect() as service:
            name = await known_type(service, type_name)
            g = await _known_group(service, name, group)
            if chosen is None:
                count = await _dead_count(service, name, g)
                confirm(question.format(count=count, name=name), yes, True)
            apply = action(service, name, g)
            return await _bulk(service, name, chosen, label, apply, not as_json, g)

    return run(main)


dead = typer.Typer(help="List, requeue or purge dead letters.", rich_markup_mode="rich")


@dead.callback(invoke_without_command=True)
def dead_group(ctx: typer.Context) -> None:
    """List, requeue or purge dead letters."""
    # not no_args_is_help: what click does then differs between versions (help and
    # exit 0, or an exception); a missing command is bad input like any other
    if ctx.invoked_subcommand is None:
        fail("missing command: delayq dead list|requeue|purge TYPE ... (see 'delayq dead --help')")


@dead.command("list")
@with_connection
def dead_list(
    type_name: TypeName,
    limit: Limit = 20,
    offset: Annotated[int, offset_option("oldest")] = 0,
    group: GroupName = DEFAULT_GROUP,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Dead letters of one type (of one delivery group), oldest first, with their last error."""

    async def main() -> None:
        async with conn.connect() as service:
            name = await known_type(service, type_name)
            chosen = await _known_group(service, name, group)
            items = await service.dead_letters(name, limit, offset, group=chosen)
        if as_json:
            print_json(
                {
                    "type": type_name,
                    "group": group,
                    "offset": offset,
                    "dead": [d.to_dict() for d in items],
                }
            )
            return
        table = Table(
            title=text(f"{shown(type_name, group)}: dead letters from #{offset}"),
            title_justify="left",
        )
        add_columns(table, ("id", "failed", "attempts", "error", "payload"))
        for d in items:
            table.add_row(
                text(d.id),
                when(d.failed_at, short=True),
                str(d.attempts),
                text(d.error),
                text(json.dumps(d.payload, ensure_ascii=False)),
            )
        console.print(table)

    run(main)


@dead.command("requeue")
@with_connection
def dead_requeue(
    type_name: TypeName,
    ids: Annotated[list[str] | None, ids_argument("Dead letters to requeue.")] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Requeue every dead letter of the type.")
    ] = False,
    delay: Annotated[
        str, typer.Option("--delay", help="Due after this long (250ms, 30s, 5m, 3h, 2d).")
    ] = "0",
    group: GroupName = DEFAULT_GROUP,
    yes: Yes = False,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Schedule dead letters again (their attempt counts start over); with --group, that
    group's, delivered again to that group alone."""
    chosen = pick_ids(ids, all_, "requeue")
    seconds = parse_delay(delay)

    def requeue(service: EventService, name: str, group: str | None) -> _Apply:
        async def apply(page: list[str]) -> int:
            return await service.requeue_dead_letters(name, ids=page, delay=seconds, group=group)

        return apply

    done = _act(conn, type_name, group, chosen, yes, as_json, "requeueing", _REQUEUE_ALL, requeue)
    if as_json:
        print_json({"type": type_name, "group": group, "requeued": done})
    else:
        console.print(f"requeued {done} dead letters")


@dead.command("purge")
@with_connection
def dead_purge(
    type_name: TypeName,
    ids: Annotated[list[str] | None, ids_argument("Dead letters to delete.")] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Delete every dead letter of the type.")
    ] = False,
    yes: Yes = False,
    group: GroupName = DEFAULT_GROUP,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Delete dead letters (of one delivery group with --group) for good."""
    chosen = pick_ids(ids, all_, "purge")

    def purge(service: EventService, name: str, group: str | None) -> _Apply:
        async def apply(page: list[str]) -> int:
            return await service.purge_dead_letters(name, ids=page, group=group)

        return apply

    done = _act(conn, type_name, group, chosen, yes, as_json, "purging", _PURGE_ALL, purge)
    if as_json:
        print_json({"type": type_name, "group": group, "purged": done})
    else:
        console.print(f"purged {done} dead letters")


def register(app: typer.Typer) -> None:
    """Add the ``dead`` command group to ``app``."""
    app.add_typer(dead, name="dead", rich_help_panel="Operate")
