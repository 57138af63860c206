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
    "delayq.cli.workers",
    "delayq.cli.schedules",
    "delayq.cli.batches",
    "delayq.cli.dashboard",
    "delayq.cli.outbox",
]
"""Modules whose ``register(app: typer.Typer)`` adds commands, in help order."""

app = typer.Typer(
    name="delayq",
    help="Delayed events on Redis: run workers, and look at or repair queues from the shell.",
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


def _click_exception() -> type[Exception]:
    """The ``ClickException`` class of the click Typer runs on.

    Typer up to 0.2x uses the ``click`` package; newer ones bundle their own copy
    (``typer._click``), whose classes are distinct from ``click``'s. Every usage error
    (missing argument, unknown option or command, bad value) derives from it, and so
    does ``typer.BadParameter``, whichever copy Typer uses.
    """
    for cls in typer.BadParameter.__mro__:
        if cls.__name__ == "ClickException" and issubclass(cls, Exception):
            return cls
    raise RuntimeError(
        "Typer's BadParameter does not derive from a ClickException"
    )  # pragma: no cover


_ClickException = _click_exception()


def _usage_line(exc: Exception) -> str:
    """A click exception as one line, with where to look for help when it is a usage error."""
    message = " ".join(str(getattr(exc, "format_message", exc.__str__)()).split())
    ctx = getattr(exc, "ctx", None)
    path = (getattr(ctx, "command_path", "") if ctx is not None else "") or "delayq"
    if getattr(exc, "exit_code", 1) == 2:
        message += f" (see '{path} --help')"
    return message


def main(argv: list[str] | None = None) -> int:
    """Run the command line; bad input is a one-line ``error: ...`` with exit code 2."""
    from .output import CliError, fail_line, report_error

    args = sys.argv[1:] if argv is None else list(argv)
    if not args:  # a bare `delayq`: the overview of commands
        args = ["--help"]
    try:
        # without standalone mode click returns the code of a typer.Exit
        code = app(args=args, prog_name="delayq", standalone_mode=False)
    except CliError as exc:
        report_error(exc)
        return exc.code
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        return 1
    except KeyboardInterrupt:
        return 130
    except _ClickException as exc:  # usage errors: missing argument, unknown option, ...
        fail_line(_usage_line(exc))
        return int(getattr(exc, "exit_code", 2))
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
