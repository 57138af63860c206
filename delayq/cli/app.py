"""The ``delayq`` Typer app.

Subcommands live in their own modules, each with a ``register(app)`` function;
:data:`COMMAND_MODULES` lists them. Adding a command group from another module
(say ``delayq.dashboard.cli``) is one line there.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer

from .. import __version__

__all__ = ["COMMAND_MODULES", "app", "main"]

COMMAND_MODULES: list[str] = [
    "delayq.cli.worker",
    "delayq.cli.check",
    "delayq.cli.queues",
    "delayq.cli.dead",
    "delayq.cli.flow",
    "delayq.cli.events",
    "delayq.cli.dashboard",
    "delayq.cli.outbox",
]
"""Modules whose ``register(app: typer.Typer)`` adds commands, in help order."""

app = typer.Typer(
    name="delayq",
    help="Delayed events on Redis: run workers, and look at or repair queues from the shell.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"delayq {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = None,
) -> None:
    """Delayed events on Redis: run workers, and look at or repair queues from the shell."""


@app.command(
    rich_help_panel="Run",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def demo(ctx: typer.Context) -> None:
    """The demo (a private Redis unless given --redis-url); `delayq demo --help` for options."""
    from ..demo import main as demo_main

    raise typer.Exit(demo_main(["demo", *ctx.args]))


for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; one-line errors exit with code 2."""
    from .output import CliError, report_error

    try:
        # without standalone mode click returns the code of a typer.Exit
        code = app(args=argv, prog_name="delayq", standalone_mode=False)
    except CliError as exc:
        report_error(exc)
        return exc.code
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # click's usage errors
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            return exc.exit_code
        raise
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
