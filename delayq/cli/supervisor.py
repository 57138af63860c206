"""``delayq worker --processes N`` / ``--reload``: a small supervisor of worker processes.

Each child runs ``python -m delayq worker MODULE:ATTR --processes 1 ...`` in its
own session, so a Ctrl-C on the terminal reaches only the supervisor, which
forwards it: the first SIGTERM/SIGINT becomes a SIGTERM to every child (a
graceful drain), a second SIGINT becomes a SIGINT (children stop at once). A
child that exits on its own with a non-zero code (or is killed) is restarted
after a backoff that doubles up to 30 s and starts over once a child has run
for a minute. Exit code 2 from a child (the service cannot be loaded) stops
everything: restarting would not help.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._pacing import MAX_RESTART, Retrying
from .health import HealthServer, http_get

__all__ = ["supervise"]

log = logging.getLogger("delayq.cli.supervisor")

_STABLE_AFTER = 60.0


@dataclass
class _Child:
    slot: int
    proc: asyncio.subprocess.Process
    started: float
    health_file: str | None


async def supervise(cfg: Any, early: list[int] | None = None) -> int:
    """Run ``cfg.processes`` workers (``cfg`` is a WorkerConfig) until they have all drained.

    ``early``: signals that arrived before the event loop ran.
    """
    early = early or []
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals: list[int] = []
    children: dict[int, _Child] = {}
    # each slot's restart backoff, started over once its child has run _STABLE_AFTER
    backoffs = {slot: Retrying(first=0.5, most=MAX_RESTART) for slot in range(cfg.processes)}
    restart_at: dict[int, float] = {}
    finished: set[int] = set()  # slots whose child exited 0 by itself (--burst)
    codes: list[int] = []
    tmp = tempfile.mkdtemp(prefix="delayq-supervisor-")

    def send(sig: int) -> None:
        for child in children.values():
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(sig)

    def on_signal(sig: int) -> None:
        signals.append(sig)
        if len(signals) == 1:
            log.info("%s: draining %d workers", signal.Signals(sig).name, len(children))
            stop.set()
            send(signal.SIGTERM)
        elif sig == signal.SIGINT:
            log.warning("second SIGINT: workers stop at once")
            send(signal.SIGINT)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    for number in early:
        on_signal(number)

    async def spawn(slot: int) -> None:
        health_file = None
        args = [sys.executable, "-m", "delayq", "worker", *cfg.child_args()]
        if cfg.metrics_port is not None:
            args += ["--metrics-port", str(cfg.metrics_port + slot if cfg.metrics_port else 0)]
        if cfg.health_port is not None:
            health_file = os.path.join(tmp, f"child-{slot}.port")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(health_file)
            args += ["--child-health-file", health_file]
        proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL, start_new_session=True
        )
        children[slot] = _Child(slot, proc, time.monotonic(), health_file)
        log.info("worker %d started (slot %d)", proc.pid, slot)

    server = None
    if cfg.health_port is not None:
        server = HealthServer(cfg.health_host, cfg.health_port, *_probes(children, cfg, stop))
        await server.start()
    reloads: asyncio.Queue[None] = asyncio.Queue()
    watcher = asyncio.create_task(_watch(cfg, reloads, stop)) if cfg.reload else None
    reloading: set[int] = set()
    try:
        for slot in range(cfg.processes):
            if stop.is_set():  # a signal came first (even before the loop ran): start no more
                break
            await spawn(slot)
        while True:
            if not stop.is_set():
                now = time.monotonic()
                for slot in [s for s, t in restart_at.items() if t <= now]:
                    del restart_at[slot]
                    await spawn(slot)
            if not children and (stop.is_set() or not restart_at):
                break
            waits = {asyncio.ensure_future(c.proc.wait()): c for c in children.values()}
            reload = asyncio.ensure_future(reloads.get())
            extra: list[asyncio.Future[Any]] = [reload]
            if not stop.is_set():  # once set, its wait would end every turn at once: a spin
                extra.append(asyncio.ensure_future(stop.wait()))
            timeout = max(0.0, min(restart_at.values()) - time.monotonic()) if restart_at else None
            done, _ = await asyncio.wait(
                [*waits, *extra], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for task in [*waits, *extra]:
                if task not in done:
                    task.cancel()
            if reload in done and not stop.is_set():
                log.info("files changed: restarting %d workers", len(children))
                reloading.update(children)
                send(signal.SIGTERM)
            for task, child in waits.items():
                if task not in done:
                    continue
                code = task.result()
                del children[child.slot]
                ran = time.monotonic() - child.started
                if stop.is_set():
                    # a child that our SIGTERM ended before Python could install its
                    # handlers had not started anything: a clean stop too
                    codes.append(0 if code == -signal.SIGTERM else code)
                    log.info("worker %d exited with code %d", child.proc.pid, code)
                elif child.slot in reloading:
                    reloading.discard(child.slot)
                    restart_at[child.slot] = time.monotonic()
                elif code == 0:
                    finished.add(child.slot)
                    codes.append(0)
                    log.info("worker %d finished", child.proc.pid)
                elif code == 2:
                    log.error("worker %d could not start (exit code 2): stopping", child.proc.pid)
                    stop.set()
                    send(signal.SIGTERM)
                    codes.append(2)
                else:
                    if ran > _STABLE_AFTER:
                        backoffs[child.slot].reset()
                    delay = backoffs[child.slot].next()
                    what = f"signal {-code}" if code < 0 else f"code {code}"
                    log.error(
                        "worker %d (slot %d) died with %s after %.1fs; restarting in %.1fs",
                        child.proc.pid,
                        child.slot,
                        what,
                        ran,
                        delay,
                    )
                    restart_at[child.slot] = time.monotonic() + delay
            if stop.is_set():
                restart_at.clear()
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if server is not None:
            await server.aclose()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        for child in children.values():  # only on an unexpected error: leave no orphans
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()
            await child.proc.wait()
    if 2 in codes:
        return 2
    return 0 if all(c == 0 for c in codes) else 1


def _probes(children: dict[int, _Child], cfg: Any, stop: asyncio.Event) -> tuple[Any, Any]:
    async def live() -> tuple[bool, dict[str, Any]]:
        running = {c.proc.pid: c.proc.returncode is None for c in children.values()}
        ok = len(running) == cfg.processes and all(running.values())
        return ok or stop.is_set(), {"workers": running}

    async def ready() -> tuple[bool, dict[str, Any]]:
        states: dict[int, Any] = {}
        for c in list(children.values()):
            port = _read_port(c.health_file)
            status, body = (
                (0, None) if port is None else await http_get("127.0.0.1", port, "/readyz")
            )
            states[c.proc.pid] = {"ready": status == 200, "health": body}
        ok = (
            not stop.is_set()
            and len(states) == cfg.processes
            and all(s["ready"] for s in states.values())
        )
        return ok, {"workers": states}

    return live, ready


def _read_port(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        return int(Path(path).read_text())
    except (OSError, ValueError):
        return None


async def _watch(cfg: Any, reloads: asyncio.Queue[None], stop: asyncio.Event) -> None:
    from watchfiles import PythonFilter, awatch

    dirs = [str(d) for d in cfg.reload_dirs] or [os.getcwd()]
    log.info("watching %s for changes", ", ".join(dirs))
    async for changes in awatch(*dirs, watch_filter=PythonFilter(), stop_event=stop):
        log.info("changed: %s", ", ".join(sorted({p for _, p in changes})[:5]))
        reloads.put_nowait(None)
