"""Writing events from the shell: ``enqueue`` (validated against its class before
anything is written), ``cancel``, ``run-now`` and ``purge`` (a type's waiting events)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import msgspec
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from ..keys import DEFAULT_GROUP
from ..operations.enqueueing import CancelResult
from ..service import EventService
from .ops import (
    Connection,
    EventId,
    Json,
    TypeName,
    Yes,
    confirm,
    ids_argument,
    known_type,
    parse_delay,
    pick_ids,
    run,
    with_connection,
)
from .output import console, fail, human_seconds, print_json
from .target import load_event_type

__all__ = ["purge_waiting", "register"]

_PAGE = 500


async def purge_waiting(
    service: EventService, name: str, step: Callable[[int], None] | None = None
) -> int:
    """Cancel the events of a type that wait (scheduled, retries waiting, ready), page by
    page; running ones and dead letters stay. Returns how many were cancelled.

    The work is bounded by the counts read first: events enqueued meanwhile may stay.
    """
    names = await service.groups(name)
    # a type with named groups: each group's view has the type's schedule, the group's
    # retries and its ready list ("default" included); without: the type's own keys
    groups: list[str | None] = [None] if names == [DEFAULT_GROUP] else list(names)
    budget = await waiting_count(service, name)
    done = 0
    listers: list[Callable[[int, str | None], Awaitable[list[str]]]] = [
        lambda skip, g: _scheduled_ids(service, name, skip, g),
        lambda skip, g: _ready_ids(service, name, skip, g),
    ]
    for group in groups:
        for lister in listers:
            skip = 0  # ids that were not cancelled (claimed meanwhile) stay in the list
            while budget > 0:
                page = await lister(skip, group)
                if not page:
                    break
                removed = await asyncio.gather(*(service.cancel(name, i) for i in page))
                cancelled = sum(map(bool, removed))
                skip += len(page) - cancelled
                done += cancelled
                budget -= len(page)
                if step is not None:
                    step(len(page))
    return done


async def _ready_ids(service: EventService, name: str, skip: int, group: str | None) -> list[str]:
    return [e.id for e in await service.ready(name, _PAGE, skip, group=group)]


async def _scheduled_ids(
    service: EventService, name: str, skip: int, group: str | None
) -> list[str]:
    return [e.id for e in await service.scheduled(name, _PAGE, skip, group=group)]


async def waiting_count(service: EventService, name: str) -> int:
    """Scheduled and ready events of a type, its delivery groups' retries and ready lists
    included (an event waiting in several groups counts once per group)."""
    base = await service.stats_for(name)
    if await service.groups(name) == [DEFAULT_GROUP]:
        return base.scheduled + base.ready
    # a group's scheduled count is the type's schedule plus the group's own retries
    groups = (await service.group_stats(name)).values()
    return base.scheduled + sum(g.ready + max(0, g.scheduled - base.scheduled) for g in groups)


@with_connection
def enqueue(
    event_class: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:CLASS",
            help="The Event subclass, e.g. myapp.events:PaymentCheck (its fields validate the payload).",
            show_default=False,
        ),
    ],
    event_id: Annotated[str, typer.Option("--id", help="The event id.", show_default=False)],
    delay: Annotated[
        str,
        typer.Option("--delay", help="Due after this long (250ms, 30s, 5m, 3h, 2d or seconds)."),
    ] = "0",
    payload: Annotated[
        str, typer.Option("--payload", help="The event's fields as a JSON object (without id).")
    ] = "{}",
    context: Annotated[
        list[str] | None,
        typer.Option("--context", help="key=value context entry (repeatable).", show_default=False),
    ] = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Replace an existing event with this id (payload, context and due time together).",
        ),
    ] = False,
    debounce: Annotated[
        str | None,
        typer.Option(
            "--debounce",
            help="Debounce: replace an existing event with this id, but never past its first enqueue + this long (docs/FLOW.md).",
            show_default=False,
        ),
    ] = None,
    unique_for: Annotated[
        str | None,
        typer.Option(
            "--unique-for",
            help="Once handled, refuse this id for this long (docs/FLOW.md).",
            show_default=False,
        ),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority",
            help="Priority level, 0 (most urgent) to 9 (default: the class's, else 0; docs/guides/priorities.md).",
            show_default=False,
        ),
    ] = None,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Enqueue one event, validated against its class before anything is written."""
    cls = load_event_type(event_class)
    seconds = parse_delay(delay)
    debounce_s = None if debounce is None else parse_delay(debounce)
    unique_s = None if unique_for is None else parse_delay(unique_for)
    try:
        fields = json.loads(payload)
    except json.JSONDecodeError as exc:
        fail(f"--payload is not valid JSON: {exc}")
    if not isinstance(fields, dict):
        fail("--payload must be a JSON object")
    if "id" in fields and fields["id"] != event_id:
        fail("--payload has an 'id' that differs from --id")
    if not event_id:
        fail("--id must not be empty")
    known = set(cls.__struct_encode_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:  # msgspec would drop them silently: a typo must not lose data
        fail(
            f"--payload has fields {cls.event_name} does not have: {', '.join(unknown)} "
            f"(its fields: {', '.join(f for f in cls.__struct_encode_fields__ if f != 'id')})"
        )
    try:
        event = msgspec.convert({**fields, "id": event_id}, cls)
    except msgspec.ValidationError as exc:
        fail(f"invalid payload for {cls.event_name}: {exc}")
    ctx: dict[str, str] = {}
    for item in context or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--context must be key=value, not {item!r}")
        ctx[key] = value

    async def main() -> bool:
        async with conn.connect() as service:
            try:
                return await service.enqueue_with_delay(
                    event,
                    seconds,
                    context=ctx or None,
                    replace=replace,
                    debounce=debounce_s,
                    unique_for=unique_s,
                    priority=priority,
                )
            except (OverflowError, TypeError, ValueError) as exc:  # encoding: nothing written
                fail(f"cannot enqueue this {cls.event_name}: {exc}")

    added = run(main)
    if as_json:
        print_json(
            {
                "type": cls.event_name,
                "id": event_id,
                "enqueued": added,
                "delay_seconds": seconds,
            }
        )
    elif added:
        console.print(f"enqueued {cls.event_name} {event_id!r}, due in {human_seconds(seconds)}")
    else:
        console.print(
            f"kept the existing {cls.event_name} {event_id!r} (use --replace to replace it)"
        )


def _one_group(action: str) -> Any:
    """The ``--group`` option of a command acting on every delivery group unless given one."""
    return typer.Option(
        "--group",
        help=f"{action} for this delivery group only (default: every group).",
        show_default=False,
    )


@with_connection
def cancel(
    type_name: TypeName,
    event_id: EventId,
    group: Annotated[str | None, _one_group("Cancel it")] = None,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Remove a pending (scheduled, ready or in-flight) event; a running handler of it is
    cancelled wherever it runs. With --group, only that delivery group's delivery and run:
    the other groups keep theirs. Exit code 1 when there was none (dead letters are removed
    with `dead purge`)."""

    async def main() -> CancelResult:
        async with conn.connect() as service:
            name = await known_type(service, type_name)
            await _known_group(service, name, group)
            return await service.cancel(name, event_id, group=group)

    result = run(main)
    if as_json:
        print_json(
            {
                "type": type_name,
                "id": event_id,
                "group": group,
                "cancelled": bool(result),
                "result": result.value,
            }
        )
    else:
        console.print(_CANCEL_SAID[result])
    raise typer.Exit(0 if result else 1)


async def _known_group(service: EventService, name: str, group: str | None) -> None:
    """Exit with a message unless ``group`` (None: every group) is one of the type's."""
    if group is not None and group != DEFAULT_GROUP:
        groups = await service.groups(name)
        if group not in groups:
            fail(f"{name!r} has no delivery group {group!r} (groups: {', '.join(groups)})")


@with_connection
def run_now(
    type_name: TypeName,
    event_id: EventId,
    group: Annotated[str | None, _one_group("Run it now")] = None,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Hand a scheduled event (or a retry waiting for its backoff) to the consumers now;
    its attempts and last error are kept. Exit code 1 when it is not scheduled."""

    async def main() -> bool:
        async with conn.connect() as service:
            name = await known_type(service, type_name)
            await _known_group(service, name, group)
            try:
                return await service.run_now(name, event_id, group=group)
            except (TypeError, ValueError) as exc:
                fail(str(exc))

    moved = run(main)
    if as_json:
        print_json({"type": type_name, "id": event_id, "group": group, "run_now": moved})
    else:
        console.print("handed to the consumers" if moved else "no such scheduled event")
    raise typer.Exit(0 if moved else 1)


@with_connection
def purge(
    type_name: TypeName,
    ids: Annotated[list[str] | None, ids_argument("Events to cancel.")] = None,
    all_: Annotated[
        bool,
        typer.Option("--all", help="Cancel every waiting (scheduled or ready) event of the type."),
    ] = False,
    yes: Yes = False,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """Cancel a type's waiting events: the IDs given (as `cancel` does), or with --all
    every scheduled and ready one, retries waiting and every delivery group's included.
    Running events and dead letters stay (dead letters: `dead purge`)."""
    chosen = pick_ids(ids, all_, "purge")

    async def main() -> int:
        async with conn.connect() as service:
            name = await known_type(service, type_name)
            if chosen is not None:
                removed = await asyncio.gather(*(service.cancel(name, i) for i in chosen))
                return sum(map(bool, removed))
            count = await waiting_count(service, name)
            confirm(f"Cancel all {count} waiting events of {name} for good?", yes, True)
            with Progress(
                TextColumn("purging"),
                BarColumn(),
                MofNCompleteColumn(),
                console=console,
                disable=as_json or not console.is_terminal,
                transient=True,
            ) as progress:
                bar = progress.add_task("purging", total=count)
                return await purge_waiting(service, name, lambda n: progress.advance(bar, n))

    done = run(main)
    if as_json:
        print_json({"type": type_name, "purged": done})
    else:
        console.print(f"cancelled {done} waiting events")


def register(app: typer.Typer) -> None:
    """Add ``enqueue``, ``cancel``, ``run-now`` and ``purge`` to ``app``."""
    app.command(rich_help_panel="Operate")(enqueue)
    app.command(rich_help_panel="Operate")(cancel)
    app.command("run-now", rich_help_panel="Operate")(run_now)
    app.command(rich_help_panel="Operate")(purge)


_CANCEL_SAID = {
    CancelResult.REMOVED: "cancelled",
    CancelResult.SIGNALLED: "cancelled; its running handler was told to stop",
    CancelResult.UNKNOWN: "no such pending event",
}
