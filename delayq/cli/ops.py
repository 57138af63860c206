"""Operating queues without the application's code: stats, inspect, scheduled, dead letters,
enqueue, cancel. Types are named by their wire name; ``--json`` prints stable fields."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import msgspec
import typer
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from ..events import validate_name
from ..keys import DEFAULT_GROUP
from ..service import EventService
from ..store import QueueCounts
from .durations import parse_duration
from .output import console, fail, human_seconds, print_json, text, when
from .target import load_event_type

__all__ = ["register"]

T = TypeVar("T")

RedisUrl = Annotated[
    str,
    typer.Option(
        "--redis-url",
        envvar="REDIS_URL",
        help="Redis to connect to (redis://, rediss://, unix://).",
        rich_help_panel="Connection",
    ),
]
Prefix = Annotated[
    str,
    typer.Option(
        "--prefix",
        envvar="DELAYQ_PREFIX",
        help="The services' key prefix (their prefix= option).",
        rich_help_panel="Connection",
    ),
]
Cluster = Annotated[
    bool,
    typer.Option(
        "--cluster",
        help="The URL names a node of a Redis Cluster.",
        rich_help_panel="Connection",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON (stable field names) for scripts.")]
TypeName = Annotated[
    str, typer.Argument(metavar="TYPE", help="The event type's wire name.", show_default=False)
]
GroupName = Annotated[
    str,
    typer.Option("--group", help="The delivery group (handlers added without a group: default)."),
]
EventId = Annotated[str, typer.Argument(metavar="ID", help="The event id.", show_default=False)]
DEFAULT_URL = "redis://localhost:6379/0"


def _safe_url(url: str) -> str:
    """``url`` without its password (for messages)."""
    try:
        parts = urlsplit(url)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
            return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        pass
    return url


@asynccontextmanager
async def _connect(url: str, prefix: str, cluster: bool) -> AsyncIterator[EventService]:
    """An unstarted service (no scheduler) on ``url``; fails with one line if Redis is away."""
    try:
        service = EventService.from_url(url, cluster=cluster, prefix=prefix, enable_scheduling=False)
    except (ValueError, TypeError) as exc:
        fail(f"bad connection settings: {exc}")
    try:
        try:
            await asyncio.wait_for(service.store.server_time_ms(), 10)
        except Exception as exc:
            reason = "no answer" if isinstance(exc, asyncio.TimeoutError) else str(exc)
            fail(f"cannot reach Redis at {_safe_url(url)}: {reason or type(exc).__name__}")
        yield service
    finally:
        try:
            await service.aclose()
        except Exception:  # closing a client that never connected
            pass


async def _known(service: EventService, name: str) -> str:
    """``name`` if it is a valid type name used under the prefix; else a one-line failure."""
    try:
        validate_name(name)
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    known = await service.store.known_types()
    if name not in known:
        listed = ", ".join(sorted(known)[:20]) or "none"
        fail(f"unknown event type {name!r} under prefix {service.options.prefix!r} (known: {listed})")
    return name


def _run(main: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(main())  # type: ignore[arg-type]


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
    }


_Read = tuple[dict[str, QueueCounts], dict[str, dict[str, QueueCounts]]]


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


async def _group_stats(
    service: EventService, names: list[str]
) -> dict[str, dict[str, QueueCounts]]:
    """Counts per delivery group of the types (among ``names``) that have named groups."""
    found: dict[str, dict[str, QueueCounts]] = {}
    for name in names:
        if await service.groups(name) != [DEFAULT_GROUP]:
            found[name] = await service.group_stats(name)
    return found


def _stats_table(
    prefix: str,
    stats: dict[str, QueueCounts],
    groups: dict[str, dict[str, QueueCounts]] | None = None,
) -> Table:
    table = Table(title=f"delayq · prefix {prefix}", title_justify="left")
    for column in ("type", "scheduled", "ready", "in flight", "dead", "due", "next due", "backlog age"):
        table.add_column(column, justify="left" if column in ("type", "next due") else "right")
    now = datetime.now(timezone.utc)
    for name, c in sorted(stats.items()):
        age = text(human_seconds(c.backlog_age) if c.backlog_age else "0")
        if c.backlog_age >= 60:
            age.stylize("bold red")
        table.add_row(
            text(name),
            str(c.scheduled),
            str(c.ready),
            str(c.in_flight),
            str(c.dead) if not c.dead else f"[red]{c.dead}[/red]",
            str(c.due),
            when(c.next_due_at, now),
            age,
        )
        for group, g in sorted((groups or {}).get(name, {}).items()):
            # a group has its own ready, in-flight and dead sets; due times are the type's
            table.add_row(
                text(f"  {name} [{group}]"),
                str(g.scheduled),
                str(g.ready),
                str(g.in_flight),
                str(g.dead) if not g.dead else f"[red]{g.dead}[/red]",
                "",
                "",
                "",
            )
    if not stats:
        table.caption = "no event types under this prefix"
    return table


def _parse_delay(value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        fail(str(exc))


def _pick_ids(ids: list[str] | None, all_: bool, action: str) -> list[str] | None:
    if all_ and ids:
        fail(f"{action}: give IDs or --all, not both")
    if not all_ and not ids:
        fail(f"{action}: give the IDs to {action}, or --all")
    return None if all_ else list(ids or [])


def _confirm(question: str, yes: bool, required: bool) -> None:
    if yes:
        return
    if sys.stdin.isatty() and sys.stdout.isatty():
        if not typer.confirm(question, default=False):
            raise typer.Exit(1)
    elif required:
        fail("not on a terminal: add --yes to confirm")


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


def register(app: typer.Typer) -> None:
    """Add the operations commands to ``app``."""
    dead = typer.Typer(
        help="List, requeue or purge dead letters.", no_args_is_help=True, rich_markup_mode="rich"
    )
    app.add_typer(dead, name="dead", rich_help_panel="Operate")

    @app.command(rich_help_panel="Operate")
    def stats(
        watch: Annotated[
            bool, typer.Option("--watch", "-w", help="Refresh until Ctrl-C.")
        ] = False,
        interval: Annotated[
            str, typer.Option("--interval", help="Refresh period with --watch (a duration).")
        ] = "2s",
        as_json: Json = False,
        redis_url: RedisUrl = DEFAULT_URL,
        prefix: Prefix = "delayq",
        cluster: Cluster = False,
    ) -> None:
        """Per event type: scheduled, ready, in flight, dead, due now, the next due time and
        the backlog's age (how long the oldest due, unclaimed event has waited).

        With --watch --json, one JSON object per line at every refresh.
        Types with named delivery groups get one more row per group ("type [group]"; in
        JSON, a "groups" object of the same fields per group).
        """
        period = _parse_delay(interval)
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
                    types[n]["groups"] = {
                        g: _counts_dict(gc) for g, gc in sorted(groups[n].items())
                    }
            return {"prefix": prefix, "types": types}

        async def main() -> None:
            async with _connect(redis_url, prefix, cluster) as service:
                if not watch:
                    got = await read(service)
                    if as_json:
                        print_json(as_data(got))
                    else:
                        console.print(_stats_table(prefix, *got))
                    return
                if as_json:
                    while True:
                        sys.stdout.write(json.dumps(as_data(await read(service))) + "\n")
                        sys.stdout.flush()
                        await asyncio.sleep(period)
                with Live(console=console, auto_refresh=False) as live:
                    while True:
                        live.update(_stats_table(prefix, *await read(service)), refresh=True)
                        await asyncio.sleep(period)

        try:
            _run(main)
        except KeyboardInterrupt:
            raise typer.Exit(0) from None

    @app.command(rich_help_panel="Operate")
    def inspect(
        type_name: TypeName,
        event_id: EventId,
        as_json: Json = False,
        redis_url: RedisUrl = DEFAULT_URL,
        prefix: Prefix = "delayq",
        cluster: Cluster = False,
    ) -> None:
        """Where one event is (scheduled, ready, in_flight, dead or absent) and all that is
        known: due time, attempts, lease deadline, last error, context, payload as JSON."""

        async def main() -> None:
            async with _connect(redis_url, prefix, cluster) as service:
                info = await service.inspect(await _known(service, type_name), event_id)
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
                ("enqueued at", when(info.enqueued_at)),
                ("context", text(dict(info.context) or None)),
                ("payload", text(json.dumps(info.payload, ensure_ascii=False, indent=2))),
            ]
            if info.decode_error:
                rows.append(("decode error", text(info.decode_error)))
            for name, g in info.groups.items():  # a type with delivery groups: each group's
                detail = g.due_at or g.lease_deadline or g.failed_at
                line = f"{g.state}, {g.attempts} attempt(s)" + (
                    f", {detail.isoformat()}" if detail else ""
                ) + (f", {g.last_error}" if g.last_error else "")
                rows.append((f"group {name}", text(line)))
            for label, value in rows:
                table.add_row(label, value)
            console.print(table)

        _run(main)

    @app.command(rich_help_panel="Operate")
    def scheduled(
        type_name: TypeName,
        limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="Most rows.")] = 20,
        offset: Annotated[
            int, typer.Option("--offset", min=0, help="Skip this many (earliest first).")
        ] = 0,
        as_json: Json = False,
        redis_url: RedisUrl = DEFAULT_URL,
        prefix: Prefix = "delayq",
        cluster: Cluster = False,
    ) -> None:
        """Upcoming events of one type, earliest due first (retries waiting included)."""

        async def main() -> None:
            async with _connect(redis_url, prefix, cluster) as service:
                items = await service.scheduled(await _known(service, type_name), limit, offset)
            if as_json:
                print_json({"type": type_name, "offset": offset, "events": [e.to_dict() for e in items]})
                return
            table = Table(title=f"{type_name}: scheduled from #{offset}", title_justify="left")
            for column in ("id", "due", "attempts", "payload", "last error"):
                table.add_column(column)
            for e in items:
                table.add_row(
                    text(e.id),
                    when(e.due_at),
                    str(e.attempts),
                    text(json.dumps(e.payload, ensure_ascii=False)),
                    text(e.last_error),
                )
            console.print(table)

        _run(main)

    @dead.command("list")
    def dead_list(
        type_name: TypeName,
        limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="Most rows.")] = 20,
        offset: Annotated[int, typer.Option("--offset", min=0, help="Skip this many (oldest first).")] = 0,
        group: GroupName = DEFAULT_GROUP,
        as_json: Json = False,
        redis_url: RedisUrl = DEFAULT_URL,
        prefix: Prefix = "delayq",
        cluster: Cluster = False,
    ) -> None:
        """Dead letters of one type (of one delivery group), oldest first, with their last error."""

        async def main() -> None:
            async with _connect(redis_url, prefix, cluster) as service:
                name = await _known(service, type_name)
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
            for column in ("id", "failed", "attempts", "error", "payload"):
                table.add_column(column)
            for d in items:
                table.add_row(
                    text(d.id),
                    when(d.failed_at),
                    str(d.attempts),
                    text(d.error),
                    text(json.dumps(d.payload, ensure_ascii=False)),
                )
            console.print(table)

        _run(main)

    @dead.command("requeue")
    def dead_requeue(
        type_name: TypeName,
        ids: Annotated[list[str] | None, typer.Argument(metavar="[ID]...", help="Dead letters to requeue.", show_default=False)] = None,
        all_: Annotated[bool, typer.Option("--all", help="Requeue every dead letter of the type.")] = False,
        delay: Annotated[str, typer.Option("--delay", help="Due after this long (250ms, 30s, 5m, 3h, 2d).")] = "0",
        group: GroupName = DEFAULT_GROUP,
        yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
        as_json: Json = False,
        redis_url: RedisUrl = DEFAULT_URL,
        prefix: Prefix = "delayq",
        cluster: Cluster = False,
    ) -> None:
        """Schedule dead letters again (their attempt counts start over); with --group, that
        group's, delivered again to that group alone."""
        chosen = _pick_ids(ids, all_, "requeue")
        seconds = _parse_delay(delay)

        async def main() -> int:
            async with _connect(redis_url, prefix, cluster) as service:
                name = await _known(service, type_name)
                g = await _known_group(service, name, group)
                if chosen is None:
                    count = await _dead_count(service, name, g)
                    _confirm(f"Requeue all {count} dead letters of {name}?", yes or as_json, False)

                async def apply(page: list[str]) -> int:
                    return await service.requeue_dead_letters(name, ids=page, delay=seconds, group=g)

                return await _bulk(service, name, chosen, "requeueing", apply, not as_json, g)

        done = _run(main)
        if as_json:
            print_json({"type": type_name, "group": group, "requeued": done})
        else:
            console.print(f"requeued {done} dead letters")

    @dead.command("purge")
    def dead_purge(
        type_name: TypeName,
        ids: Annotated[list[str] | None, typer.Argument(metavar="[ID]...", help="Dead letters to delete.", show_default=False)] = None,
        all_: Annotated[bool, typer.Option("--all", help="Delete every dead letter of the type.")] = False,
        yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask (required off a terminal with --all).")] = False,
        group: GroupName = DEFAULT_GROUP,
        as_json: Json = False,
        redis_url: RedisUrl = DEFAULT_URL,
        prefix: Prefix = "delayq",
        cluster: Cluster = False,
    ) -> None:
        """Delete dead letters (of one delivery group with --group) for good."""
        chosen = _pick_ids(ids, all_, "purge")

        async def main() -> int:
            async with _connect(redis_url, prefix, cluster) as service:
                name = await _known(service, type_name)
                g = await _known_group(service, name, group)
                if chosen is None:
                    count = await _dead_count(service, name, g)
                    _confirm(f"Delete all {count} dead letters of {name} for good?", yes, True)

                async def apply(page: list[str]) -> int:
                    return await service.purge_dead_letters(name, ids=page, group=g)

                return await _bulk(service, name, chosen, "purging", apply, not as_json, g)

        done = _run(main)
        if as_json:
            print_json({"type": type_name, "group": group, "purged": done})
        else:
            console.print(f"purged {done} dead letters")

    @app.command(rich_help_panel="Operate")
    def enqueue(
        event_class: Annotated[str, typer.Argument(metavar="MODULE:CLASS", help="The Event subclass, e.g. myapp.events:PaymentCheck (its fields validate the payload).", show_default=False)],
        event_id: Annotated[str, typer.Option("--id", help="The event id.", show_default=False)],
        delay: Annotated[str, typer.Option("--delay", help="Due after this long (250ms, 30s, 5m, 3h, 2d or seconds).")] = "0",
        payload: Annotated[str, typer.Option("--payload", help="The event's fields as a JSON object (without id).")] = "{}",
        context: Annotated[list[str] | None, typer.Option("--context", help="key=value context entry (repeatable).", show_default=False)] = None,
        replace: Annotated[bool, typer.Option("--replace", help="Replace an existing event with this id (payload, context and due time together).")] = False,
        as_json: Json = False,
        redis_url: RedisUrl = DEFAULT_URL,
        prefix: Prefix = "delayq",
        cluster: Cluster = False,
    ) -> None:
        """Enqueue one event, validated against its class before anything is written."""
        cls = load_event_type(event_class)
        seconds = _parse_delay(delay)
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
            async with _connect(redis_url, prefix, cluster) as service:
                return await service.enqueue_with_delay(
                    event, seconds, context=ctx or None, replace=replace
                )

        added = _run(main)
        if as_json:
            print_json({"type": cls.event_name, "id": event_id, "enqueued": added, "delay_seconds": seconds})
        elif added:
            console.print(f"enqueued {cls.event_name} {event_id!r}, due in {human_seconds(seconds)}")
        else:
            console.print(f"kept the existing {cls.event_name} {event_id!r} (use --replace to replace it)")

    @app.command(rich_help_panel="Operate")
    def cancel(
        type_name: TypeName,
        event_id: EventId,
        as_json: Json = False,
        redis_url: RedisUrl = DEFAULT_URL,
        prefix: Prefix = "delayq",
        cluster: Cluster = False,
    ) -> None:
        """Remove a pending (scheduled, ready or in-flight) event. Exit code 1 when there was
        none (dead letters are removed with `dead purge`)."""

        async def main() -> bool:
            async with _connect(redis_url, prefix, cluster) as service:
                return await service.cancel(await _known(service, type_name), event_id)

        removed = _run(main)
        if as_json:
            print_json({"type": type_name, "id": event_id, "cancelled": removed})
        else:
            console.print("cancelled" if removed else "no such pending event")
        raise typer.Exit(0 if removed else 1)

