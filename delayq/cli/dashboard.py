"""``delayq dashboard``: serve the web dashboard (the ``dashboard`` extra) with uvicorn."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from .ops import Connection, with_connection
from .output import console, fail

__all__ = ["dashboard", "register"]


def register(app: typer.Typer) -> None:
    """Add the ``dashboard`` command."""
    app.command(rich_help_panel="Operate")(dashboard)


@with_connection
def dashboard(
    conn: Connection = Connection(),
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8080,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Hide and refuse every action.")
    ] = False,
    refresh: Annotated[
        float,
        typer.Option(
            help="Seconds between live refreshes of the overview and type pages (0: off)."
        ),
    ] = 5.0,
    page_size: Annotated[int, typer.Option(help="Rows per list page (1..1000).")] = 25,
    root_path: Annotated[
        str, typer.Option(help="URL prefix the dashboard is served under behind a proxy.")
    ] = "",
    public_origin: Annotated[
        str,
        typer.Option(
            help="The origin browsers use behind a reverse proxy, e.g. https://ops.example.com "
            "(actions must come from exactly this origin; docs/DASHBOARD.md)."
        ),
    ] = "",
    trust_forwarded: Annotated[
        bool,
        typer.Option(
            "--trust-forwarded",
            help="Take the origin from the proxy's X-Forwarded-Proto/-Host headers (only when "
            "the proxy sets both itself).",
        ),
    ] = False,
) -> None:
    """Serve the web dashboard: queues, events, dead letters, workers (the dashboard extra)."""
    from ..dashboard.__main__ import app_for, missing_modules

    missing = missing_modules()
    if missing:
        fail(
            f"the dashboard needs the dashboard extra: pip install 'delayq[dashboard]' (missing: {', '.join(missing)})"
        )
    import uvicorn

    options: dict[str, Any] = {
        "read_only": read_only,
        "refresh_seconds": refresh,
        "page_size": page_size,
        "public_origin": public_origin or None,
        "trust_forwarded": trust_forwarded,
    }
    try:
        web = app_for(conn.redis_url, conn.prefix, conn.cluster, options)
    except (TypeError, ValueError) as exc:
        fail(f"bad dashboard settings: {exc}")
    where = f"http://{host}:{port}{root_path}/"
    console.print(f"delayq dashboard for prefix [bold]{escape(conn.prefix)}[/] on {escape(where)}")
    uvicorn.run(web, host=host, port=port, root_path=root_path, log_level="info")
