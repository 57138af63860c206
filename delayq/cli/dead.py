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
    MAX_OFFSET,
    Connection,
    GroupName,
    Json,
    TypeName,
    confirm,
    known_type,
    parse_delay,
    pick_ids,
    run,
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
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="Most rows.")] = 20,
    offset: Annotated[
        int,
        typer.Option("--offset", min=0, max=MAX_OFFSET, help="Skip this many (oldest first)."),
    ] = 0,
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
        where = type_name if group == DEFAULT_GROUP else f"{type_name} [{group}]"
        table = Table(title=text(f"{where}: dead letters from #{offset}"), title_justify="left")
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
    ids: Annotated[
        list[str] | None,
        typer.Argument(metavar="[ID]...", help="Dead letters to requeue.", show_default=False),
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Requeue every dead letter of the type.")
    ] = False,
    delay: Annotated[
        str, typer.Option("--delay", help="Due after this long (250ms, 30s, 5m, 3h, 2d).")
    ] = "0",
    group: GroupName = DEFAULT_GROUP,
    yes: Annotated[
        bool,
        typer.Option("--yes", "-y", help="Do not ask (required off a terminal with --all)."),
    ] = False,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Schedule dead letters again (their attempt counts start over); with --group, that
    group's, delivered again to that group alone."""
    chosen = pick_ids(ids, all_, "requeue")
    seconds = parse_delay(delay)

    async def main() -> int:
        async with conn.connect() as service:
            name = await known_type(service, type_name)
            g = await _known_group(service, name, group)
            if chosen is None:
                count = await _dead_count(service, name, g)
                confirm(f"Requeue all {count} dead letters of {name}?", yes, True)

            async def apply(page: list[str]) -> int:
                return await service.requeue_dead_letters(name, ids=page, delay=seconds, group=g)

            return await _bulk(service, name, chosen, "requeueing", apply, not as_json, g)

    done = run(main)
    if as_json:
        print_json({"type": type_name, "group": group, "requeued": done})
    else:
        console.print(f"requeued {done} dead letters")


@dead.command("purge")
@with_connection
def dead_purge(
    type_name: TypeName,
    ids: Annotated[
        list[str] | None,
        typer.Argument(metavar="[ID]...", help="Dead letters to delete.", show_default=False),
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Delete every dead letter of the type.")
    ] = False,
    yes: Annotated[
        bool,
        typer.Option("--yes", "-y", help="Do not ask (required off a terminal with --all)."),
    ] = False,
    group: GroupName = DEFAULT_GROUP,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Delete dead letters (of one delivery group with --group) for good."""
    chosen = pick_ids(ids, all_, "purge")

    async def main() -> int:
        async with conn.connect() as service:
            name = await known_type(service, type_name)
            g = await _known_group(service, name, group)
            if chosen is None:
                count = await _dead_count(service, name, g)
                confirm(f"Delete all {count} dead letters of {name} for good?", yes, True)

            async def apply(page: list[str]) -> int:
                return await service.purge_dead_letters(name, ids=page, group=g)

            return await _bulk(service, name, chosen, "purging", apply, not as_json, g)

    done = run(main)
    if as_json:
        print_json({"type": type_name, "group": group, "purged": done})
    else:
        console.print(f"purged {done} dead letters")


def register(app: typer.Typer) -> None:
    """Add the ``dead`` command group to ``app``."""
    app.add_typer(dead, name="dead", rich_help_panel="Operate")
