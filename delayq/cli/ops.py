"""What the operations commands share: their connection options (declared once, here:
:func:`with_connection`), connecting to Redis from the shell, and checking a type name
against the prefix's types."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import sys
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import typer

from ..errors import RedisError
from ..events import validate_name
from ..keys import DEFAULT_GROUP
from ..service import EventService
from .durations import parse_duration
from .output import fail

__all__ = [
    "CHOOSE_WHERE",
    "DEFAULT_PREFIX",
    "DEFAULT_URL",
    "MAX_OFFSET",
    "Connection",
    "EventId",
    "GroupName",
    "Json",
    "Limit",
    "TypeName",
    "Yes",
    "confirm",
    "connect",
    "ids_argument",
    "known_type",
    "offset_option",
    "parse_delay",
    "pick_ids",
    "run",
    "safe_url",
    "shown",
    "with_connection",
]

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
Limit = Annotated[int, typer.Option("--limit", min=1, max=1000, help="Most rows.")]
Yes = Annotated[
    bool, typer.Option("--yes", "-y", help="Do not ask (required off a terminal with --all).")
]
MAX_OFFSET = 1_000_000_000
"""The largest ``--offset`` (Redis takes ranks as 64-bit integers; pages are read by rank)."""
DEFAULT_URL = "redis://localhost:6379/0"
DEFAULT_PREFIX = "delayq"


CHOOSE_WHERE = (
    "choose the prefix with --prefix or DELAYQ_PREFIX (the services' prefix= option) "
    "and the Redis with --redis-url or REDIS_URL"
)


def offset_option(order: str) -> Any:
    """The ``--offset`` option of a listing whose first rows are the ``order`` ones."""
    return typer.Option("--offset", min=0, max=MAX_OFFSET, help=f"Skip this many ({order} first).")


def safe_url(url: str) -> str:
    """``url`` without its password (for messages)."""
    try:
        parts = urlsplit(url)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
            return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        pass
    return url


@dataclass(frozen=True)
class Connection:
    """Where a command looks: the values of ``--redis-url``, ``--prefix`` and ``--cluster``."""

    redis_url: RedisUrl = DEFAULT_URL
    prefix: Prefix = DEFAULT_PREFIX
    cluster: Cluster = False

    def connect(self) -> AbstractAsyncContextManager[EventService]:
        """An unstarted service on this Redis and prefix (see :func:`connect`)."""
        return connect(self.redis_url, self.prefix, self.cluster)

    def nothing(self, what: str) -> str:
        """``no <what>`` here, saying where it looked and how to look elsewhere (a newcomer
        whose services use another prefix or Redis sees an empty answer, not an error)."""
        return (
            f"no {what} under prefix {self.prefix!r} on {safe_url(self.redis_url)}; {CHOOSE_WHERE}"
        )


def with_connection(command: Callable[..., T]) -> Callable[..., T]:
    """``command`` with the connection options in place of its ``conn: Connection``
    parameter, so that every command declares them by taking a :class:`Connection`.

    Typer reads a command's options from its signature: the one it sees has
    ``--redis-url``, ``--prefix`` and ``--cluster`` where ``conn`` was (their place in
    ``--help``), and the command gets them as one :class:`Connection`. Any other
    parameter whose type is a dataclass of options (each field annotated as a Typer
    option, such as :class:`Connection`'s) is declared the same way, in its place.
    """
    signature = inspect.signature(command)
    if "conn" not in signature.parameters:
        raise TypeError(f"{command.__qualname__} has no 'conn: Connection' parameter")
    hints = typing.get_type_hints(command, include_extras=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, tuple[type[Any], list[str]]] = {}  # parameter -> its class, its fields
    for param in signature.parameters.values():
        hint = hints.get(param.name, param.annotation)
        if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
            params.append(param.replace(annotation=hint))
            continue
        fields = typing.get_type_hints(hint, include_extras=True)
        groups[param.name] = (hint, [f.name for f in dataclasses.fields(hint)])
        for f in dataclasses.fields(hint):
            params.append(
                inspect.Parameter(f.name, param.kind, default=f.default, annotation=fields[f.name])
            )

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        for name, (cls, names) in groups.items():
            kwargs[name] = cls(**{n: kwargs.pop(n) for n in names})
        return command(*args, **kwargs)

    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=params, return_annotation=hints.get("return", inspect.Signature.empty)
    )
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


@asynccontextmanager
async def connect(url: str, prefix: str, cluster: bool) -> AsyncIterator[EventService]:
    """An unstarted service (no scheduler) on ``url``; fails with one line if Redis is away."""
    try:
        service = EventService.from_url(
            url, cluster=cluster, prefix=prefix, enable_scheduling=False
        )
    except (ValueError, TypeError) as exc:
        fail(f"bad connection settings: {exc}")
    try:
        try:
            await asyncio.wait_for(service.store.browsing.server_time_ms(), 10)
        except Exception as exc:
            reason = "no answer" if isinstance(exc, asyncio.TimeoutError) else str(exc)
            fail(f"cannot reach Redis at {safe_url(url)}: {reason or type(exc).__name__}")
        yield service
    finally:
        try:
            await service.aclose()
        except Exception:  # closing a client that never connected
            pass


async def known_type(service: EventService, name: str, hint: str = "") -> str:
    """``name`` if it is a valid type name used under the prefix; else a one-line failure
    (ending with ``hint``)."""
    try:
        validate_name(name)
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    known = await service.store.types.known_types()
    if name not in known:
        listed = ", ".join(sorted(known)[:20]) or f"none; {CHOOSE_WHERE}"
        fail(
            f"unknown event type {name!r} under prefix {service.options.prefix!r} (known: {listed})"
            + hint
        )
    return name


def shown(type_name: str, group: str) -> str:
    """A type, or one of its delivery groups, as a title names it: ``type [group]``."""
    return type_name if group == DEFAULT_GROUP else f"{type_name} [{group}]"


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run one command's ``main`` coroutine function in a new event loop; a Redis error
    on the way (a refused script, a key of the wrong type, a lost connection) is one line
    with exit code 1, not a traceback."""
    try:
        return asyncio.run(main())  # type: ignore[arg-type]
    except RedisError as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        fail(f"Redis error ({type(exc).__name__}): {detail}", code=1)


def parse_delay(value: str) -> float:
    """A duration option's value in seconds; a one-line failure if it is not one."""
    try:
        return parse_duration(value)
    except ValueError as exc:
        fail(str(exc))


def ids_argument(help: str) -> Any:
    """The ``[ID]...`` argument of a command given IDs or ``--all`` (see :func:`pick_ids`)."""
    return typer.Argument(metavar="[ID]...", help=help, show_default=False)


def pick_ids(ids: list[str] | None, all_: bool, action: str) -> list[str] | None:
    """The IDs an action applies to, or None for ``--all``; exactly one of them is needed."""
    if all_ and ids:
        fail(f"{action}: give IDs or --all, not both")
    if not all_ and not ids:
        fail(f"{action}: give the IDs to {action}, or --all")
    return None if all_ else list(ids or [])


def confirm(question: str, yes: bool, required: bool) -> None:
    """Ask ``question`` on a terminal (declined: exit 1). Off a terminal, a ``required``
    confirmation needs ``--yes`` (a one-line failure without it)."""
    if yes:
        return
    if sys.stdin.isatty() and sys.stdout.isatty():
        if not typer.confirm(question, default=False):
            raise typer.Exit(1)
    elif required:
        fail("not on a terminal: add --yes to confirm")
