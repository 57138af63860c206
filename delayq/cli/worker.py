"""``delayq worker``: run an application's EventService until a signal drains it.

One process runs the service in one event loop; ``--processes N`` and
``--reload`` hand over to :mod:`delayq.cli.supervisor`, which runs this same
command in child processes.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from ..service import EventService
from .health import HealthServer
from .logs import LEVELS, setup_logging
from .output import fail
from .target import load_service

__all__ = ["ServiceAddon", "WorkerConfig", "register", "run_async", "run_worker", "worker"]

log = logging.getLogger("delayq.cli.worker")

ServiceAddon = Callable[[EventService], AbstractAsyncContextManager[Any]]
"""Something that runs beside a worker's service for its whole life (say, a metrics
endpoint): entered once the service has started, exited after it has drained."""


@dataclass
class WorkerConfig:
    """Everything ``delayq worker`` was asked to do."""

    target: str
    factory: bool = False
    processes: int = 1
    use_uvloop: bool | None = None
    log_level: str = "info"
    log_format: str = "text"
    health_port: int | None = None
    health_host: str = "0.0.0.0"
    burst: bool = False
    reload: bool = False
    reload_dirs: list[Path] = field(default_factory=list)
    child_health_file: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    addons: list[ServiceAddon] = field(default_factory=list)
    """Run beside the service (in each worker process); other modules append here."""

    def child_args(self) -> list[str]:
        """The options that make a child process run the same worker, alone."""
        args = [self.target, "--processes", "1", "--log-level", self.log_level]
        args += ["--log-format", self.log_format]
        if self.factory:
            args.append("--factory")
        if self.use_uvloop is not None:
            args.append("--uvloop" if self.use_uvloop else "--no-uvloop")
        if self.burst:
            args.append("--burst")
        args += ["--metrics-host", self.metrics_host]
        return args


def uvloop_available() -> bool:
    """True when the ``uvloop`` package can be imported."""
    return sys.platform != "win32" and importlib.util.find_spec("uvloop") is not None


def run_async(main: Coroutine[Any, Any, int], use_uvloop: bool) -> int:
    """Run ``main`` in a new event loop (uvloop's when asked)."""
    if not use_uvloop:
        return asyncio.run(main)
    import uvloop

    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # pragma: no cover (3.10)
    return asyncio.run(main)  # pragma: no cover


_early_signals: list[int] = []


def _note_early_signal(sig: int, frame: object) -> None:
    _early_signals.append(sig)


def run_worker(cfg: WorkerConfig) -> int:
    """Run one worker process (or the supervisor, for ``--processes N`` / ``--reload``)."""
    # A signal that arrives while the application is still being imported must
    # not kill the process half-way: it is noted, and the worker stops cleanly.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _note_early_signal)
    setup_logging(cfg.log_level, cfg.log_format)
    if cfg.use_uvloop and not uvloop_available():
        fail("--uvloop: the uvloop package is not installed (pip install 'delayq[uvloop]')")
    use_uvloop = uvloop_available() if cfg.use_uvloop is None else cfg.use_uvloop
    if cfg.processes > 1 or cfg.reload:
        from .supervisor import supervise

        return run_async(supervise(cfg, _early_signals), use_uvloop=False)  # the parent only waits
    log.debug("event loop: %s", "uvloop" if use_uvloop else "asyncio")
    return run_async(_serve(cfg), use_uvloop)


async def _serve(cfg: WorkerConfig) -> int:
    service = await load_service(cfg.target, cfg.factory)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    seen: list[int] = []

    def on_signal(sig: int) -> None:
        seen.append(sig)
        if len(seen) == 1:
            log.info(
                "%s: draining (handlers get up to shutdown_grace=%ss); SIGINT again stops at once",
                signal.Signals(sig).name,
                service.options.shutdown_grace,
            )
            stop.set()
        elif sig == signal.SIGINT:
            log.warning(
                "second signal: stopping at once; unfinished events come back when their "
                "leases expire"
            )
            logging.shutdown()
            os._exit(130)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    for number in _early_signals:
        on_signal(number)
    if not service.handled_types:
        log.warning("%s has no handlers: this worker only runs the scheduler", cfg.target)
    servers: list[HealthServer] = []
    addons: list[AbstractAsyncContextManager[Any]] = []
    await service.start()
    log.info(
        "worker %d started: handling %s", os.getpid(), ", ".join(service.handled_types) or "nothing"
    )
    try:
        if cfg.health_port is not None:
            servers.append(_health_server(service, cfg.health_host, cfg.health_port))
        if cfg.child_health_file:  # for the supervisor's /readyz
            servers.append(_health_server(service, "127.0.0.1", 0))
        for server in servers:
            await server.start()
        if cfg.child_health_file:
            await asyncio.to_thread(Path(cfg.child_health_file).write_text, str(servers[-1].port))
        for addon in cfg.addons:
            manager = addon(service)
            await manager.__aenter__()
            addons.append(manager)
        if cfg.burst:
            await _first(stop.wait(), _burst_done(service))
        else:
            await stop.wait()
    finally:
        await service.aclose()
        for manager in reversed(addons):
            await manager.__aexit__(None, None, None)
        for server in servers:
            await server.aclose()
    log.info("worker %d drained; exiting", os.getpid())
    return 0


def _health_server(service: EventService, host: str, port: int) -> HealthServer:
    async def live() -> tuple[bool, dict[str, Any]]:
        h = await service.health(timeout=1.0)
        # while draining the loops stop by design: still alive
        ok = h.alive and (not h.accepting or all(h.loops.values()))
        return ok, h.to_dict()

    async def ready() -> tuple[bool, dict[str, Any]]:
        h = await service.health(timeout=1.0)
        return h.ready, h.to_dict()

    return HealthServer(host, port, live, ready)


async def _first(*aws: Awaitable[Any]) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _burst_done(service: EventService) -> None:
    """Return once no handled type has a due or in-flight event (twice in a row)."""
    quiet = 0
    while quiet < 2:
        try:
            counts = await service.stats()
        except Exception as exc:  # Redis away: keep waiting, the loops retry too
            log.warning("--burst: reading the counts failed: %s", exc)
            quiet = 0
        else:
            busy = [
                t
                for t in service.handled_types
                if t in counts and (counts[t].due or counts[t].in_flight)
            ]
            quiet = 0 if busy else quiet + 1
        await asyncio.sleep(0.2)
    log.info("--burst: nothing due is left; draining")


# -- the command ---------------------------------------------------------------------------------

Target = Annotated[
    str,
    typer.Argument(
        metavar="MODULE:ATTR",
        help="Where your EventService is, like uvicorn's app: 'myapp.tasks:service' "
        "(handlers registered at import). With --factory, a zero-argument function "
        "(sync or async) that returns one.",
        show_default=False,
    ),
]
Factory = Annotated[bool, typer.Option("--factory", help="Call MODULE:ATTR to get the service.")]


def _port(flag: str, help: str) -> Any:
    """An optional TCP port option (off unless given) serving ``help``'s endpoint."""
    return typer.Option(flag, min=0, max=65535, help=help, show_default=False)


def worker(
    target: Target,
    factory: Factory = False,
    processes: Annotated[
        int,
        typer.Option(
            "--processes",
            "-p",
            min=1,
            max=256,
            help="Run N worker processes under a small supervisor (asyncio uses one "
            "core per process): it forwards SIGTERM/SIGINT, restarts a child that "
            "crashed (with backoff) and exits once all children have drained.",
        ),
    ] = 1,
    use_uvloop: Annotated[
        bool | None,
        typer.Option(
            "--uvloop/--no-uvloop",
            help="Use the uvloop event loop. Default: on when uvloop is installed "
            "(pip install 'delayq\\[uvloop]').",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[
        str,
        typer.Option(
            "--log-level",
            help=f"One of {', '.join(LEVELS)}. 'debug' also shows tracebacks of "
            "import errors and handler failures.",
        ),
    ] = "info",
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format",
            help="'text', or 'json' (one object per line; handler failures carry "
            "event_type, event_id and attempt fields).",
        ),
    ] = "text",
    health_port: Annotated[
        int | None,
        _port(
            "--health-port",
            "Serve GET /healthz (the process and its loops are alive) and GET "
            "/readyz (Redis reachable and every consumer running) on this port, "
            "for Kubernetes probes. Off by default.",
        ),
    ] = None,
    health_host: Annotated[
        str, typer.Option("--health-host", help="Address the health endpoints bind to.")
    ] = "0.0.0.0",
    burst: Annotated[
        bool,
        typer.Option(
            "--burst",
            help="Handle everything that is due now, then drain and exit 0 (cron jobs, tests).",
        ),
    ] = False,
    reload: Annotated[
        bool,
        typer.Option(
            "--reload",
            help="Development: restart the worker when a .py file changes (watchfiles).",
        ),
    ] = False,
    reload_dir: Annotated[
        list[Path] | None,
        typer.Option(
            "--reload-dir",
            exists=True,
            file_okay=False,
            help="Directory to watch with --reload (repeatable; default: .).",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        _port(
            "--metrics-port",
            "Serve Prometheus metrics at GET /metrics on this port (needs "
            "delayq\\[prometheus]): queue depth and backlog age read from Redis, plus this "
            "process's counters and histograms when the service was built with "
            "metrics=PrometheusMetrics(). With --processes N, worker i uses PORT+i.",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="Address the metrics endpoint binds to.")
    ] = "0.0.0.0",
    child_health_file: Annotated[
        str | None, typer.Option("--child-health-file", hidden=True)
    ] = None,
) -> None:
    """Run the handlers of an EventService until SIGTERM or SIGINT.

    A signal starts a graceful drain: fetching stops, running handlers get the
    service's shutdown_grace to finish, finished ones are acknowledged, and the
    command exits 0. A second SIGINT stops at once (unfinished events come back
    when their leases expire). Exit code 2: the service could not be loaded.
    """
    if log_level.lower() not in LEVELS:
        fail(f"--log-level must be one of {', '.join(LEVELS)}, not {log_level!r}")
    if log_format not in ("text", "json"):
        fail(f"--log-format must be 'text' or 'json', not {log_format!r}")
    cfg = WorkerConfig(
        target=target,
        factory=factory,
        processes=processes,
        use_uvloop=use_uvloop,
        log_level=log_level.lower(),
        log_format=log_format,
        health_port=health_port,
        health_host=health_host,
        burst=burst,
        reload=reload,
        reload_dirs=list(reload_dir or []),
        child_health_file=child_health_file,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        addons=list(WORKER_ADDONS),
    )
    if metrics_port is not None and processes == 1 and not reload:
        cfg.addons.append(_metrics_addon(metrics_host, metrics_port))
    raise typer.Exit(run_worker(cfg))


def register(app: typer.Typer) -> None:
    """Add ``worker`` to the app."""
    app.command(rich_help_panel="Run")(worker)


def _metrics_addon(host: str, port: int) -> ServiceAddon:
    """``--metrics-port``: delayq.prometheus's /metrics endpoint beside the service."""
    try:
        from ..prometheus import serve
    except ImportError as exc:
        fail(f"--metrics-port needs the prometheus extra (pip install 'delayq[prometheus]'): {exc}")

    def addon(service: EventService) -> AbstractAsyncContextManager[Any]:
        return serve(port, host=host, service=service)

    return addon


WORKER_ADDONS: list[ServiceAddon] = []
"""Addons every worker process runs (see :data:`ServiceAddon`)."""
