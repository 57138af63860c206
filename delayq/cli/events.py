"""Writing one event from the shell: ``enqueue`` (validated against its class before
anything is written) and ``cancel``."""

from __future__ import annotations

import json
from typing import Annotated

import msgspec
import typer

from .ops import (
    DEFAULT_URL,
    Cluster,
    EventId,
    Json,
    Prefix,
    RedisUrl,
    TypeName,
    connect,
    known_type,
    parse_delay,
    run,
)
from .output import console, fail, human_seconds, print_json
from .target import load_event_type

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``enqueue`` and ``cancel`` commands to ``app``."""

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
        seconds = parse_delay(delay)
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
            async with connect(redis_url, prefix, cluster) as service:
                return await service.enqueue_with_delay(
                    event, seconds, context=ctx or None, replace=replace
                )

        added = run(main)
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
            async with connect(redis_url, prefix, cluster) as service:
                return await service.cancel(await known_type(service, type_name), event_id)

        removed = run(main)
        if as_json:
            print_json({"type": type_name, "id": event_id, "cancelled": removed})
        else:
            console.print("cancelled" if removed else "no such pending event")
        raise typer.Exit(0 if removed else 1)
