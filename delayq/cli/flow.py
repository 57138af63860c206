"""Flow control from the shell: ``limits show|set|clear`` and ``pause`` / ``resume`` of a
type (or one of its delivery groups). See docs/FLOW.md."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from ..events import validate_name
from ..flow.control import KEEP
from ..flow.limits import FlowLimits
from ..keys import DEFAULT_GROUP
from ..service import EventService
from .ops import DEFAULT_URL, Cluster, GroupName, Json, Prefix, RedisUrl, TypeName, connect, run
from .output import console, fail, print_json, text

__all__ = ["register"]


def _checked(type_name: str, group: str) -> str | None:
    try:
        validate_name(type_name)
        if group != DEFAULT_GROUP:
            validate_name(group, "group name")
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    return None if group == DEFAULT_GROUP else group


def _show(type_name: str, group: str, limits: FlowLimits, as_json: bool) -> None:
    if as_json:
        print_json({"type": type_name, "group": group, **limits.to_dict()})
        return
    where = type_name if group == DEFAULT_GROUP else f"{type_name} [{group}]"
    table = Table(title=text(f"{where}: flow limits (fleet-wide)"), title_justify="left")
    table.add_column("limit")
    table.add_column("value")
    table.add_row("concurrency", "none" if limits.concurrency is None else str(limits.concurrency))
    table.add_row("rate", "none" if limits.rate is None else str(limits.rate))
    table.add_row("paused", "yes" if limits.paused else "no")
    console.print(table)


async def _call(service: EventService, what: str, **kwargs: Any) -> FlowLimits:
    try:
        return await getattr(service, what)(**kwargs)  # type: ignore[no-any-return]
    except (TypeError, ValueError) as exc:
        fail(str(exc))


def register(app: typer.Typer) -> None:
    """Add ``limits`` (show, set, clear), ``pause`` and ``resume`` to ``app``."""
    limits = typer.Typer(
        help="Fleet-wide flow limits of a type: concurrency and rate (docs/FLOW.md).",
        no_args_is_help=True,
        rich_markup_mode="rich",
    )
    app.add_typer(limits, name="limits", rich_help_panel="Operate")

    @limits.command("show")
    def limits_show(
        type_name: TypeName,
        group: GroupName = DEFAULT_GROUP,
        as_json: Json = False,
        redis_url: RedisUrl = DEFAULT_URL,
        prefix: Prefix = "delayq",
        cluster: Cluster = False,
    ) -> None:
        """The flow limits and paused state of a type (of one delivery group)."""
        g = _checked(type_name, group)

        async def main() -> FlowLimits:
            async with connect(redis_url, prefix, cluster) as service:
                return await _call(service, "limits", event_type=type_name, group=g)

        _show(type_name, group, run(main), as_json)

    @limits.command("set")
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
        group: GroupName = DEFAULT_GROUP,
        as_json: Json = False,
        redis_url: RedisUrl = DEFAULT_URL,
        prefix: Prefix = "delayq",
        cluster: Cluster = False,
    ) -> None:
        """Set limits; those not given are left as they are. Every worker obeys within ~1 s."""
        g = _checked(type_name, group)
        if concurrency is None and rate is None:
            fail("limits set: give --concurrency and/or --rate (limits clear removes them)")

        async def main() -> FlowLimits:
            async with connect(redis_url, prefix, cluster) as service:
                return await _call(
                    service, "set_limits", event_type=type_name, group=g,
                    concurrency=KEEP if concurrency is None else concurrency,
                    rate=KEEP if rate is None else rate,
                )  # fmt: skip

        _show(type_name, group, run(main), as_json)

    @limits.command("clear")
    def limits_clear(
        type_name: TypeName,
        concurrency: Annotated[
            bool, typer.Option("--concurrency", help="Remove only the concurrency limit.")
        ] = False,
        rate: Annotated[bool, typer.Option("--rate", help="Remove only the rate limit.")] = False,
        group: GroupName = DEFAULT_GROUP,
        as_json: Json = False,
        redis_url: RedisUrl = DEFAULT_URL,
        prefix: Prefix = "delayq",
        cluster: Cluster = False,
    ) -> None:
        """Remove limits (both, unless --concurrency or --rate picks one); pause is kept."""
        g = _checked(type_name, group)
        both = not concurrency and not rate

        async def main() -> FlowLimits:
            async with connect(redis_url, prefix, cluster) as service:
                return await _call(
                    service, "set_limits", event_type=type_name, group=g,
                    concurrency=None if both or concurrency else KEEP,
                    rate=None if both or rate else KEEP,
                )  # fmt: skip

        _show(type_name, group, run(main), as_json)

    for paused in (True, False):
        _register_pause(app, paused)


def _register_pause(app: typer.Typer, paused: bool) -> None:
    name = "pause" if paused else "resume"
    doc = (
        "Pause a type (or group) fleet-wide: no new handler starts; events are still accepted."
        if paused
        else "Resume a paused type (or group): waiting workers start at once."
    )

    def command(
        type_name: TypeName,
        group: GroupName = DEFAULT_GROUP,
        as_json: Json = False,
        redis_url: RedisUrl = DEFAULT_URL,
        prefix: Prefix = "delayq",
        cluster: Cluster = False,
    ) -> None:
        g = _checked(type_name, group)

        async def main() -> FlowLimits:
            async with connect(redis_url, prefix, cluster) as service:
                await _call(service, name, event_type=type_name, group=g)
                return await _call(service, "limits", event_type=type_name, group=g)

        limits = run(main)
        if as_json:
            print_json({"type": type_name, "group": group, **limits.to_dict()})
        else:
            where = type_name if group == DEFAULT_GROUP else f"{type_name} [{group}]"
            console.print(text(f"{where}: {'paused' if limits.paused else 'running'}"))

    command.__doc__ = doc
    app.command(name, rich_help_panel="Operate")(command)
