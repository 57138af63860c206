"""``delayq batches list|show``: batches from the shell (docs/WORKFLOWS.md, "Batches").

Read-only: both read through ``service.batches()`` and ``service.batch_info()``; the
batches themselves are made by the application's ``async with service.batch(...)``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from ..batches import BATCH_TYPE, BatchInfo, BatchState
from .ops import Connection, Json, Limit, parse_delay, run, with_connection
from .output import add_columns, console, fail, not_found, print_json, text, when

__all__ = ["STATES", "batch_line", "progress", "register"]

STATES: tuple[BatchState, ...] = ("open", "waiting", "done", "stuck")
"""The states ``--state`` takes (those of ``service.batches(state=...)``)."""
_STATE_OF: dict[str, BatchState] = {s: s for s in STATES}

BatchId = Annotated[
    str,
    typer.Argument(
        metavar="BATCH_ID",
        help="The batch's id (batch.id in the producer; `delayq batches list` shows them).",
        show_default=False,
    ),
]
State = Annotated[
    str | None,
    typer.Option(
        "--state",
        help="Only batches in this state: open (its block is adding members), waiting "
        "(closed, members pending), done (kept a day after done) or stuck (see "
        "--stuck-after). Default: every state.",
        show_default=False,
    ),
]
StuckAfter = Annotated[
    str,
    typer.Option(
        "--stuck-after",
        help="A waiting batch with no member finished for this long counts as stuck "
        "(250ms, 30s, 5m, 3h, 2d or seconds).",
    ),
]
Members = Annotated[
    int,
    typer.Option(
        "--members",
        min=0,
        max=1000,
        help="List up to this many of the members it waits for, and of its failed "
        "members (--json: waiting_on up to this many, failed_ids up to 1000).",
    ),
]


def progress(info: BatchInfo) -> str:
    """``"7 ok, 1 failed, 2 pending of 10"``: a batch's counts on one line."""
    return (
        f"{info.succeeded:,} ok, {info.failed:,} failed, {info.pending:,} pending of {info.total:,}"
    )


def _member(kind: str, member_id: str) -> str:
    """A member as a person reads it: ``type id``, or ``batch id`` for a nested batch."""
    return f"{'batch' if kind == BATCH_TYPE else kind} {member_id}"


def batch_line(info: BatchInfo) -> Text:
    """The id over the name (dim), for a table cell: shown literally, never as markup."""
    cell = text(info.id)
    if info.name:
        cell.append("\n" + info.name, style="dim")
    return cell


def _state(info: BatchInfo) -> Text:
    style = {"stuck": "bold red", "done": "green", "open": "cyan"}.get(info.state, "yellow")
    return Text(info.state, style="red" if info.state == "done" and info.failed else style)


@with_connection
def list_(
    state: State = None,
    limit: Limit = 100,
    stuck_after: StuckAfter = "1h",
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """The batches under the prefix, newest first.

    One row each: id and name, state, members ok / failed / pending of the total, when it
    was opened and when it was done (or closed)."""
    chosen = None if state is None else _STATE_OF.get(state)
    if state is not None and chosen is None:
        fail(f"--state must be one of {', '.join(STATES)}, not {state!r}")
    idle = parse_delay(stuck_after)
    if idle <= 0:
        fail("--stuck-after must be more than 0")

    async def main() -> list[BatchInfo]:
        async with conn.connect() as service:
            return await service.batches(chosen, limit=limit, stuck_after=idle)

    infos = run(main)
    if as_json:
        print_json({"prefix": conn.prefix, "state": state, "batches": [i.to_dict() for i in infos]})
        return
    if not infos:
        what = "batches" if state is None else f"{state} batches"
        console.print(text(conn.nothing(what)))
        return
    now = datetime.now(timezone.utc)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    add_columns(table, ("id\nname", "state", "members", "opened\ndone (or closed)"))
    # an id stays whole on one line (to be pasted into `batches show`); the rest wraps
    table.columns[0].min_width = min(max(len(i.id) for i in infos), 40)
    for i in infos:
        times = when(i.created_at, now, short=True)
        times.append("\n")
        times.append_text(when(i.done_at or i.closed_at, now, short=True))
        table.add_row(batch_line(i), _state(i), text(progress(i)), times)
    if (
        console.measure(table, options=console.options.update(max_width=10_000)).maximum
        > console.width
    ):
        # on a narrow terminal (80 columns) the counts wrap after "failed," and a time
        # after its date and time ("2026-11-28 16:02:17Z" is the longest line of a time)
        table.columns[2].width = len("0 ok, 0 failed,")
        table.columns[3].width = len("2026-11-28 16:02:17Z")
    console.print(table)
    if len(infos) == limit:
        console.print(text(f"the newest {limit}: --limit (up to 1000) or --state show others"))


@with_connection
def show(
    batch_id: BatchId,
    members: Members = 20,
    as_json: Json = False,
    conn: Connection = Connection(),
) -> None:
    """One batch in full; exit code 1 when there is none by that id.

    Its state (and why it is stuck), counts, times, its callbacks, its parent batch, its
    failed members and some of those it waits on. A batch is kept a day after it is
    done."""

    async def main() -> BatchInfo | None:
        async with conn.connect() as service:
            try:
                return await service.batch_info(batch_id, members=members)
            except LookupError:
                return None
            except (TypeError, ValueError) as exc:
                fail(str(exc))

    info = run(main)
    if info is None:
        not_found(f"no batch {batch_id!r} under prefix {conn.prefix!r}", as_json)
    if as_json:
        print_json(info.to_dict())
        return
    console.print(_details(info, members))


def _details(info: BatchInfo, members: int) -> Table:
    """One batch as label / value rows (every value from Redis shown literally)."""
    now = datetime.now(timezone.utc)
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    state = _state(info)
    if info.stuck_reason:
        state.append(f": {info.stuck_reason}")
    elif info.state == "done" and info.on_success is not None:
        state.append(
            ": on_success enqueued" if info.ok else ": a member failed, on_success skipped"
        )
    rows: list[tuple[str, Text]] = [
        ("id", text(info.id)),
        ("name", text(info.name)),
        ("state", state),
        ("members", text(progress(info))),
    ]
    if info.unconfirmed:
        rows.append(("unconfirmed adds", text(f"{info.unconfirmed:,} (settled by the sweep)")))
    rows += [
        ("opened", when(info.created_at, now)),
        ("closed", when(info.closed_at, now)),
        ("last member done", when(info.last_done_at, now)),
        ("done", when(info.done_at, now)),
    ]
    if info.lease_until is not None:
        rows.append(("lease until", when(info.lease_until, now)))
    if info.expires_at is not None:
        rows.append(("removed", when(info.expires_at, now)))
    for label, ref in (("on_complete", info.on_complete), ("on_success", info.on_success)):
        rows.append((label, text(None if ref is None else _member(*ref))))
    rows.append(("parent batch", text(info.parent)))
    rows += _members("failed", info.failed_ids, info.failed, members)
    waiting = "waiting on" if info.state != "done" else "waited on"
    if info.pending:
        rows += _members(waiting, info.waiting_on, info.pending, members)
    for label, value in rows:
        table.add_row(label, value)
    return table


def _members(
    label: str, refs: tuple[tuple[str, str], ...], count: int, most: int
) -> list[tuple[str, Text]]:
    """One row per member shown (at most ``most``), then how many more there are."""
    shown = refs[:most]
    rows = [(label if n == 0 else "", text(_member(*ref))) for n, ref in enumerate(shown)]
    if count > len(shown):
        more = Text(f"{count - len(shown):,} more", style="dim")
        if most == 0:
            more = Text(f"{count:,} (--members N lists them)", style="dim")
        rows.append(("" if shown else label, more))
    return rows


batches = typer.Typer(
    help="Batches (service.batch()): list them, show one with its members' progress.",
    no_args_is_help=True,
)
batches.command("list")(list_)
batches.command("show")(show)


def register(app: typer.Typer) -> None:
    """Add the ``batches`` command group to ``app``."""
    app.add_typer(batches, name="batches", rich_help_panel="Operate")
