"""``RedisServer``: one private ``redis-server`` process, to start, kill, restart and reconfigure.

(Over 400 lines: one class doing one job, the test server's lifecycle.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .binary import _HOST, find_redis_server_binary, free_port
from .lifecycle import Lifecycle, LiveSet
from .resp import _command, _RespError

logger = logging.getLogger("delayq.testing")

_LOG_NAME = "redis-server.log"
# redis-server options RedisServer sets itself
_RESERVED = frozenset({"port", "bind", "dir", "daemonize", "logfile", "pidfile"})
# options whose value is two words ("127.0.0.1 6380"), passed as two arguments
_TWO_ARGS = frozenset({"replicaof", "slaveof"})

# --------------------------------------------------------------------------- RedisServer

_live = LiveSet()


class RedisServer(Lifecycle):
    """One private ``redis-server`` process, listening on ``127.0.0.1``.

    The server starts with ``--save "" --appendonly no`` (nothing persisted) and a temporary
    data directory unless ``dir`` is given; ``config`` items are passed as extra
    ``--name value`` arguments and override those defaults (e.g. ``{"appendonly": "yes"}``).
    ``port``, ``bind``, ``dir``, ``daemonize``, ``logfile`` and ``pidfile`` are managed by this
    class and cannot be set through ``config``. The server's output goes to
    ``<dir>/redis-server.log`` (see :meth:`read_log`).

    The port is chosen once (a free one unless given) and kept across :meth:`restart`, so URLs
    handed out stay valid. Use it as a context manager, or call :meth:`start` and
    :meth:`close`. Processes still running at interpreter exit are stopped automatically.

    Args:
        port: TCP port; ``None`` picks a free loopback port.
        config: extra ``redis-server`` configuration items, e.g. ``{"maxmemory": "10mb"}``.
        binary: ``redis-server`` executable; see :func:`find_redis_server_binary`.
        dir: data directory (created if missing, never deleted); default: a temporary
            directory removed by :meth:`close`.
        startup_timeout: seconds :meth:`start` waits for the server to answer ``PING``.
        port_picker: with ``port=None``, what picks the port, and another one when the
            picked port turns out to be taken; default: any free loopback port.

    Raises:
        RuntimeError: if no ``redis-server`` executable can be found.
        ValueError: if ``config`` contains a reserved option.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        config: Mapping[str, str] | None = None,
        binary: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 10.0,
        port_picker: Callable[[], int] | None = None,
    ) -> None:
        self._binary = find_redis_server_binary(binary)
        items: dict[str, str] = {}
        for key, value in (config or {}).items():
            name = key.removeprefix("--").strip()
            if name.lower() in _RESERVED:
                raise ValueError(f"config item {name!r} is managed by RedisServer itself")
            items[name] = str(value)
        self._config: dict[str, str] = {"save": "", "appendonly": "no", **items}
        self._auto_port = port is None
        self._pick_port = port_picker or free_port
        self._port = self._pick_port() if port is None else int(port)
        self._owns_dir = dir is None
        self._dir = tempfile.mkdtemp(prefix="delayq-redis-") if dir is None else os.fspath(dir)
        self._startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._frozen = False
        self._version: tuple[int, ...] | None = None
        self._server_name: str | None = None
        self._closed = False
        self._started = False  # once started, the port is kept (see start)

    # ----------------------------------------------------------------- properties

    @property
    def host(self) -> str:
        """The address the server listens on (always ``127.0.0.1``)."""
        return _HOST

    @property
    def port(self) -> int:
        """The TCP port (stable across :meth:`restart`)."""
        return self._port

    @property
    def password(self) -> str | None:
        """The ``requirepass`` config item, if one was given."""
        return self._config.get("requirepass") or None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` (with the password when ``requirepass`` is set)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{_HOST}:{self._port}/0"

    @property
    def pid(self) -> int | None:
        """PID of the running server process, or ``None`` when not running."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def dir(self) -> str:
        """The server's working/data directory (AOF and RDB files, the log)."""
        return self._dir

    @property
    def binary(self) -> str:
        """Path of the ``redis-server`` executable in use."""
        return self._binary

    @property
    def config(self) -> dict[str, str]:
        """The configuration items passed on the command line (a copy)."""
        return dict(self._config)

    @property
    def log_path(self) -> str:
        """Path of the file receiving the server's log output."""
        return os.path.join(self._dir, _LOG_NAME)

    @property
    def running(self) -> bool:
        """Whether the server process exists and has not exited (it may be frozen)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def frozen(self) -> bool:
        """Whether the process is currently stopped by :meth:`freeze`."""
        return self._frozen and self.running

    def _server_info(self) -> dict[str, str]:
        info = self._call("INFO", "server")
        text = info.decode() if isinstance(info, bytes) else str(info)
        return dict(line.strip().split(":", 1) for line in text.splitlines() if ":" in line)

    @property
    def version(self) -> tuple[int, ...]:
        """The server version from ``INFO server``, e.g. ``(7, 0, 15)`` or ``(9, 1, 2)``.

        Valkey reports ``redis_version:7.2.4`` for compatibility; its own ``valkey_version``
        is used instead (see :attr:`server_name`). The server must be running the first
        time this is read; the value is cached.
        """
        if self._version is None:
            fields = self._server_info()
            raw = fields.get("valkey_version") or fields.get("redis_version")
            if not raw:
                raise RuntimeError("INFO server did not report redis_version")
            self._version = tuple(int(p) for p in raw.split(".") if p.isdigit())
            self._server_name = fields.get("server_name") or "redis"
        return self._version

    @property
    def server_name(self) -> str:
        """``"redis"`` or ``"valkey"`` (``INFO server``'s ``server_name``; Redis has none)."""
        if self._server_name is None:
            _ = self.version
        assert self._server_name is not None
        return self._server_name

    @property
    def label(self) -> str:
        """The server and its version, e.g. ``"valkey 9.1.2"``."""
        return f"{self.server_name} {'.'.join(map(str, self.version))}"

    # ----------------------------------------------------------------- lifecycle

    def _argv(self) -> list[str]:
        argv = [self._binary, "--port", str(self._port), "--bind", _HOST, "--dir", self._dir]
        argv += ["--daemonize", "no"]
        for name, value in self._config.items():
            if name.lower() in _TWO_ARGS and len(value.split()) == 2:
                argv += [f"--{name}", *value.split()]  # Redis 6.2 wants two arguments
            else:
                argv += [f"--{name}", value]
        return argv

    def read_log(self) -> str:
        """Return everything the server has logged so far (empty if nothing yet)."""
        try:
            return Path(self.log_path).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self) -> RedisServer:
        """Spawn the server and wait until it answers ``PING``; return ``self``.

        Does nothing if it is already running. If an automatically chosen port turns out to be
        taken at the first start, a new free port is picked (at most a few times); a restart
        keeps the port (URLs handed out stay valid) or fails.

        Raises:
            RuntimeError: if the server exits or does not answer within ``startup_timeout``
                seconds; the message includes the command line and the server's log.
        """
        if self._closed:
            raise RuntimeError("this RedisServer has been closed")
        if self.running:
            return self
        attempts = 5 if self._auto_port else 1
        for attempt in range(1, attempts + 1):
            try:
                self._spawn_and_wait()
                self._started = True
                return self
            except _PortInUse:
                if attempt == attempts:
                    raise RuntimeError(
                        f"could not start redis-server: ports kept being taken ({self._port})"
                    ) from None
                old, self._port = self._port, self._pick_port()
                logger.info("port %d was taken, retrying redis-server on %d", old, self._port)
        raise AssertionError("unreachable")  # pragma: no cover

    def _spawn_and_wait(self) -> None:
        os.makedirs(self._dir, exist_ok=True)
        argv = self._argv()
        log_offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        logger.debug("starting %s", shlex.join(argv))
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                close_fds=True,
            )
        self._frozen = False
        _live.add(self)
        deadline = time.monotonic() + self._startup_timeout
        delay = 0.005
        last_error: BaseException | None = None
        while True:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                new_log = self.read_log()[log_offset:]
                if "Address already in use" in new_log and self._auto_port and not self._started:
                    raise _PortInUse  # (a restart keeps its port: it fails with the log)
                raise RuntimeError(
                    f"redis-server exited with status {code} during startup.\n"
                    f"command: {shlex.join(argv)}\nlog ({self.log_path}):\n{new_log.rstrip()}"
                )
            try:
                self._call("PING", timeout=0.5)
                if self._answered_by_ours():
                    break
            except _RespError as exc:
                # NOAUTH etc. still proves the server is up; LOADING (the error code,
                # the reply's first word) means not yet.
                if str(exc).split(" ", 1)[0] != "LOADING" and self._answered_by_ours():
                    break
                last_error = exc
            except OSError as exc:
                last_error = exc
            if time.monotonic() > deadline:
                log_text = self.read_log()[log_offset:]
                self._terminate_quietly()
                raise RuntimeError(
                    f"redis-server on port {self._port} did not answer PING within "
                    f"{self._startup_timeout:g}s (last error: {last_error!r}).\n"
                    f"command: {shlex.join(argv)}\nlog ({self.log_path}):\n{log_text.rstrip()}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        logger.info("redis-server pid %d listening on %s", self._proc.pid, self.url)

    def _answered_by_ours(self) -> bool:
        # another process's server may have taken the port before ours bound it (parallel
        # lanes): ours then exits, and that other server must not count as ours
        try:
            pid = self._server_info().get("process_id")
        except (OSError, _RespError):
            return True  # (not answering INFO, as a server with renamed commands)
        return pid is None or self._proc is None or int(pid) == self._proc.pid

    def _call(self, *args: str, timeout: float = 2.0) -> Any:
        return _command(self._port, *args, password=self.password, timeout=timeout)

    def ping(self, timeout: float = 1.0) -> bool:
        """Return whether the server answers ``PING`` within ``timeout`` seconds."""
        try:
            return bool(self._call("PING", timeout=timeout) == "PONG")
        except (OSError, _RespError):
            return False

    def _wait(self, timeout: float) -> bool:
        proc = self._proc
        if proc is None:
            return True
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _forget(self) -> None:
        self._proc = None
        self._frozen = False

    def _terminate_quietly(self) -> None:
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        self._forget()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server gracefully and wait for it to exit.

        Thaws a frozen server, sends ``SHUTDOWN NOSAVE`` (an enabled AOF is still flushed), then
        falls back to SIGTERM and finally SIGKILL if it has not exited within ``timeout``.
        The data directory is kept, so :meth:`restart` can reload an AOF. No-op if not running.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            if self._frozen:
                self.thaw()
            with contextlib.suppress(OSError, _RespError):
                self._call("SHUTDOWN", "NOSAVE", timeout=min(timeout, 2.0))
            if not self._wait(timeout / 2):
                logger.warning("redis-server pid %d ignored SHUTDOWN; sending SIGTERM", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                if not self._wait(timeout / 2):
                    logger.warning("redis-server pid %d ignored SIGTERM; killing it", proc.pid)
                    self._terminate_quietly()
        logger.info("redis-server on port %d stopped", self._port)
        self._forget()

    def kill(self) -> None:
        """Kill the server with SIGKILL (a simulated crash) and wait for it. No-op if not running."""
        proc = self._proc
        if proc is None:
            return
        logger.info("killing redis-server pid %d (port %d)", proc.pid, self._port)
        self._terminate_quietly()

    def restart(self) -> RedisServer:
        """Stop the server if running, then start it again on the same port and directory.

        With ``appendonly yes`` the data written before a :meth:`stop` or :meth:`kill` is
        reloaded from the AOF. Returns ``self``.
        """
        self.stop()
        return self.start()

    def freeze(self) -> None:
        """Suspend the process with SIGSTOP: connections stay open but nothing is answered."""
        proc = self._require_running()
        proc.send_signal(signal.SIGSTOP)
        self._frozen = True
        logger.info("froze redis-server pid %d", proc.pid)

    def thaw(self) -> None:
        """Resume a process suspended by :meth:`freeze` (SIGCONT)."""
        proc = self._require_running()
        proc.send_signal(signal.SIGCONT)
        self._frozen = False
        logger.info("thawed redis-server pid %d", proc.pid)

    def _require_running(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("redis-server is not running")
        return self._proc

    def close(self, timeout: float = 10.0) -> None:
        """Stop the server and delete its data directory if it was a temporary one.

        The object cannot be started again afterwards. Safe to call more than once.
        """
        try:
            self.stop(timeout)
        finally:
            _live.discard(self)
            if self._owns_dir and not self._closed:
                shutil.rmtree(self._dir, ignore_errors=True)
            self._closed = True

    def __repr__(self) -> str:
        state = "frozen" if self.frozen else "running" if self.running else "stopped"
        return f"<RedisServer {self.url} pid={self.pid} {state}>"


class _PortInUse(Exception):
    """redis-server could not bind its (automatically chosen) port."""
