"""Flow control from the shell: ``limits show|set|clear`` and ``pause`` / ``resume`` of a
type (or one of its delivery groups). See docs/FLOW.md."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from ..events import validate_name
from ..flow.keys import KeyBacklogs
from ..flow.limits import FlowLimits
from ..keys import DEFAULT_GROUP
from ..service import EventService
from .ops import (
    Connection,
    GroupName,
    Json,
    TypeName,
    known_type,
    run,
    shown,
    with_connection,
)
from .output import console, fail, print_json, text

__all__ = ["Scope", "limits", "pause", "register", "resume"]

T = TypeVar("T")


AllowUnknown = Annotated[
    bool,
    typer.Option(
        "--allow-unknown",
        help="Accept a type no service has used under the prefix yet (to set its limits "
        "or pause it before its first worker starts or event is enqueued).",
    ),
]


@dataclass(frozen=True)
class Scope:
    """The options every flow command has after its own: ``--group``, ``--json`` and
    ``--allow-unknown`` (declared once: see :func:`~delayq.cli.ops.with_connection`)."""

    group: GroupName = DEFAULT_GROUP
    as_json: Json = False
    allow_unknown: AllowUnknown = False

    def checked(self, type_name: str) -> str | None:
        """The group to pass on (None for the default group), once both names are valid
        (a one-line failure if not)."""
        try:
            validate_name(type_name)
            if self.group != DEFAULT_GROUP:
                validate_name(self.group, "group name")
        except (TypeError, ValueError) as exc:
            fail(str(exc))
        return None if self.group == DEFAULT_GROUP else self.group

    def run(
        self,
        conn: Connection,
        type_name: str,
        act: Callable[[EventService, str | None], Awaitable[T]],
    ) -> T:
        """``act(service, group)`` on the type (``group`` as :meth:`checked` gives it): a
        type the prefix does not know (a typo would store limits or a pause that nothing
        reads) is refused unless ``--allow-unknown``."""
        group = self.checked(type_name)

        async def main() -> T:
            async with conn.connect() as service:
                if not self.allow_unknown:
                    await known_type(service, type_name, "; --allow-unknown accepts it anyway")
                return await act(service, group)

        return run(main)


def _show(type_name: str, scope: Scope, limits: FlowLimits) -> None:
    if scope.as_json:
        print_json({"type": type_name, "group": scope.group, **limits.to_dict()})
        return
    where = shown(type_name, scope.group)
    table = Table(title=text(f"{where}: flow limits (fleet-wide)"), title_justify="left")
    table.add_column("limit")
    table.add_column("value")
    table.add_row("concurrency", "none" if limits.concurrency is None else str(limits.concurrency))
    table.add_row("rate", "none" if limits.rate is None else str(limits.rate))
    table.add_row("paused", "yes" if limits.paused else "no")
    if limits.per_key_concurrency is not None or limits.per_key_rate is not None:
        pkc, pkr = limits.per_key_concurrency, limits.per_key_rate
        table.add_row("per-key concurrency", "none" if pkc is None else str(pkc))
        table.add_row("per-key rate", "none" if pkr is None else str(pkr))
    console.print(table)


async def _call(service: EventService, what: str, **kwargs: Any) -> FlowLimits:
    try:
        return await getattr(service, what)(**kwargs)  # type: ignore[no-any-return]
    except (TypeError, ValueError) as exc:
        fail(str(exc))


_LIMITS = ("concurrency", "rate", "per_key_concurrency", "per_key_rate")
"""The limits ``limits set`` and ``limits clear`` change, in the order of their options."""


def _set_limits(type_name: str, scope: Scope, conn: Connection, changes: dict[str, Any]) -> None:
    """``set_limits`` with ``changes`` (a limit not in them is left as it is); show the
    limits it leaves."""

    async def act(service: EventService, group: str | None) -> FlowLimits:
        return await _call(service, "set_limits", event_type=type_name, group=group, **changes)

    _show(type_name, scope, scope.run(conn, type_name, act))


limits = typer.Typer(
    help="Fleet-wide flow limits of a type: concurrency and rate (docs/FLOW.md).",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


@limits.command("show")
@with_connection
def limits_show(
    type_name: TypeName, scope: Scope = Scope(), conn: Connection = Connection()
) -> None:
    """The flow limits and paused state of a type (of one delivery group)."""

    async def act(service: EventService, group: str | None) -> FlowLimits:
        return await _call(service, "limits", event_type=type_name, group=group)

    _show(type_name, scope, scope.run(conn, type_name, act))


@limits.command("set")
@with_connection
def limits_set(
    type_name: TypeName,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", help="Handlers in flight across all processes."),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option("--rate", help="Starts per period: 100/s, 6000/min, '100/s burst 20'."),
    ] = None,
    per_key_concurrency: Annotated[
        int | None,
        typer.Option(
            "--per-key-concurrency",
            help="Handlers in flight per flow key (1: each key in order).",
        ),
    ] = None,
    per_key_rate: Annotated[
        str | None, typer.Option("--per-key-rate", help="Starts per period per flow key.")
    ] = None,
    scope: Scope = Scope(),
    conn: Connection = Connection(),
) -> None:
    """Set limits; those not given are left as they are. Every worker obeys within ~1 s."""
    scope.checked(type_name)
    given = dict(zip(_LIMITS, (concurrency, rate, per_key_concurrency, per_key_rate)))
    if all(value is None for value in given.values()):
        fail(
            "limits set: give --concurrency, --rate, --per-key-concurrency and/or "
            "--per-key-rate (limits clear removes them)"
        )
    _set_limits(type_name, scope, conn, {k: v for k, v in given.items() if v is not None})


@limits.command("clear")
@with_connection
def limits_clear(
    type_name: TypeName,
    concurrency: Annotated[
        bool, typer.Option("--concurrency", help="Remove only the concurrency limit.")
    ] = False,
    rate: Annotated[bool, typer.Option("--rate", help="Remove only the rate limit.")] = False,
    per_key: Annotated[
        bool, typer.Option("--per-key", help="Remove only the per-key limits.")
    ] = False,
    scope: Scope = Scope(),
    conn: Connection = Connection(),
) -> None:
    """Remove limits (all, unless --concurrency, --rate or --per-key picks); pause is kept."""
    picked = dict(zip(_LIMITS, (concurrency, rate, per_key, per_key)))
    every = not any(picked.values())
    _set_limits(type_name, scope, conn, {k: None for k, pick in picked.items() if every or pick})


@limits.command("keys")
@with_connection
def limits_keys(
    type_name: TypeName,
    limit: Annotated[int, typer.Option("--limit", help="How many keys (1-1000).")] = 20,
    scope: Scope = Scope(),
    conn: Connection = Connection(),
) -> None:
    """The flow keys with the most ready events: ready, running, held back by a
    per-key limit (read-only)."""

    async def act(service: EventService, group: str | None) -> KeyBacklogs:
        try:
            return await service.key_backlog(type_name, group=group, limit=limit)
        except (TypeError, ValueError) as exc:
            fail(str(exc))

    got = scope.run(conn, type_name, act)
    if scope.as_json:
        print_json(
            {
                "type": type_name,
                "group": scope.group,
                "in_rotation": got.in_rotation,
                "parked": got.parked,
                "scanned": got.scanned,
                "keys": [
                    {
                        "key": k.key,
                        "ready": k.ready,
                        "running": k.running,
                        "parked_until": k.parked_until.isoformat() if k.parked_until else None,
                    }
                    for k in got.keys
                ],
            }
        )
        return
    where = shown(type_name, scope.group)
    table = Table(
        title=text(f"{where}: {got.in_rotation} flow keys taking turns, {got.parked} held back"),
        title_justify="left",
    )
    for column in ("key", "ready", "running", "held back until"):
        table.add_column(column, justify="right" if column in ("ready", "running") else "left")
    for k in got.keys:
        table.add_row(
            text(k.key or "(no key)"),
            f"{k.ready:,}",
            str(k.running),
            k.parked_until.isoformat() if k.parked_until else "",
        )
    console.print(table)


def _set_paused(paused: bool, type_name: str, scope: Scope, conn: Connection) -> None:
    async def act(service: EventService, group: str | None) -> FlowLimits:
        await _call(service, "pause" if paused else "resume", event_type=type_name, group=group)
        return await _call(service, "limits", event_type=type_name, group=group)

    got = scope.run(conn, type_name, act)
    if scope.as_json:
        print_json({"type": type_name, "group": scope.group, **got.to_dict()})
    else:
        where = shown(type_name, scope.group)
        console.print(text(f"{where}: {'paused' if got.paused else 'running'}"))


@with_connection
def pause(type_name: TypeName, scope: Scope = Scope(), conn: Connection = Connection()) -> None:
    """Pause a type (or group) fleet-wide: no new handler starts; events are still accepted."""
    _set_paused(True, type_name, scope, conn)


@with_connection
def resume(type_name: TypeName, scope: Scope = Scope(), conn: Connection = Connection()) -> None:
    """Resume a paused type (or group): waiting workers start at once."""
    _set_paused(False, type_name, scope, conn)


def register(app: typer.Typer) -> None:
    """Add ``limits`` (show, set, clear, keys), ``pause`` and ``resume`` to ``app``."""
    app.add_typer(limits, name="limits", rich_help_panel="Operate")
    app.command("pause", rich_help_panel="Operate")(pause)
    app.command("resume", rich_help_panel="Operate")(resume)
