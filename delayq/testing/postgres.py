"""``PostgresServer``: a private PostgreSQL for tests, started like the private Redis.

``initdb`` creates a throw-away cluster in a temporary directory, and a ``postgres`` process
serves it on a free loopback port (TCP only, no Unix socket, ``trust`` authentication for the
``postgres`` role). Nothing here ever talks to a PostgreSQL you did not ask for::

    from delayq.testing import PostgresServer, private_postgres

    with PostgresServer() as pg:
        ...                       # pg.url == "postgresql://postgres@127.0.0.1:PORT/postgres"

    with private_postgres() as url:   # DATABASE_URL if set, else a PostgresServer
        ...

The binaries are looked up from the ``DELAYQ_PG_BIN`` directory, ``initdb`` on ``PATH``, and
Debian's ``/usr/lib/postgresql/<version>/bin`` (newest first). PostgreSQL refuses to run as
root: when the current process is root, ``initdb`` and ``postgres`` run as the unprivileged
user ``DELAYQ_PG_USER`` (default ``nobody``), which is given the data directory. The server
is started directly (not through ``pg_ctl``, which would detach it) so that it is this
process's child: :meth:`PostgresServer.kill` can SIGKILL it and interpreter exit stops it.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .binary import _HOST, free_port
from .lifecycle import Lifecycle, LiveSet

__all__ = ["PG_BIN_ENV", "PG_USER_ENV", "PostgresServer", "find_postgres_bin", "private_postgres"]

logger = logging.getLogger("delayq.testing")

PG_BIN_ENV = "DELAYQ_PG_BIN"
"""Environment variable naming the directory holding ``initdb`` and ``postgres``."""
PG_USER_ENV = "DELAYQ_PG_USER"
"""Environment variable naming the unprivileged user PostgreSQL runs as when we are root."""

_LOG_NAME = "postgres.log"
# settings PostgresServer sets itself
_RESERVED = frozenset({"port", "listen_addresses", "unix_socket_directories", "data_directory"})
# A test server needs no durability across an OS crash: nothing is flushed to disk. Commits
# still reach the OS before they return (synchronous_commit stays on), so a kill() of the
# server keeps every committed transaction.
_DEFAULTS = {
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "64MB",
    "log_min_messages": "warning",
}

_live = LiveSet()


def find_postgres_bin(bin_dir: str | None = None) -> str:
    """The directory holding PostgreSQL's ``initdb`` and ``postgres`` executables.

    Looks at ``bin_dir``, then ``$DELAYQ_PG_BIN``, then ``initdb`` on ``PATH`` (following
    symlinks, so a link in ``/usr/local/bin`` leads to the real install), then
    ``/usr/lib/postgresql/*/bin`` (newest version first). Raises ``RuntimeError`` when none
    has both executables (Debian: ``apt-get install postgresql``).
    """
    candidates: list[str] = []
    for given in (bin_dir, os.environ.get(PG_BIN_ENV)):
        if given:
            candidates.append(given)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).resolve().parent))

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(p) for p in name.split(".") if p.isdigit())

    candidates.extend(sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True))
    for candidate in candidates:
        if all(os.access(os.path.join(candidate, exe), os.X_OK) for exe in ("initdb", "postgres")):
            return candidate
    raise RuntimeError(
        "no PostgreSQL found (initdb and postgres): install it (Debian: apt-get install "
        f"postgresql), set {PG_BIN_ENV} to its bin directory, or set DATABASE_URL"
    )


def _run_as() -> tuple[int, int] | None:
    """``(uid, gid)`` to run PostgreSQL as when we are root, else None (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get(PG_USER_ENV, "nobody")
    try:
        entry = pwd.getpwnam(name)
    except KeyError as exc:
        raise RuntimeError(
            f"running as root, PostgreSQL needs an unprivileged user; {name!r} does not exist "
            f"(set {PG_USER_ENV})"
        ) from exc
    if entry.pw_uid == 0:
        raise RuntimeError(f"{PG_USER_ENV}={name!r} is root; PostgreSQL refuses to run as root")
    return entry.pw_uid, entry.pw_gid


class PostgresServer(Lifecycle):
    """One private PostgreSQL server on ``127.0.0.1``, in a temporary data directory.

    The cluster is created by ``initdb`` with the superuser ``postgres`` and ``trust``
    authentication, so :attr:`url` needs no password. ``config`` items become ``-c
    name=value`` settings and override the test-friendly defaults (``fsync=off``,
    ``full_page_writes=off``, ``max_connections=200``...; committed transactions survive
    :meth:`kill`, not an OS crash). Use it as a context manager, or
    :meth:`start` and :meth:`close`. Servers still running at interpreter exit are stopped.

    Args:
        port: TCP port; ``None`` picks a free loopback port (kept across :meth:`restart`).
        config: extra server settings, e.g. ``{"track_commit_timestamp": "on"}``.
        bin_dir: directory of ``initdb`` and ``postgres``; see :func:`find_postgres_bin`.
        startup_timeout: seconds :meth:`start` waits for the server to accept connections.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        config: Mapping[str, str] | None = None,
        bin_dir: str | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        self._bin = find_postgres_bin(bin_dir)
        items = {}
        for key, value in (config or {}).items():
            if key in _RESERVED:
                raise ValueError(f"setting {key!r} is managed by PostgresServer itself")
            items[key] = str(value)
        self._config = {**_DEFAULTS, **items}
        self._port = free_port() if port is None else int(port)
        self._owner = _run_as()
        self._dir = tempfile.mkdtemp(prefix="delayq-pg-")
        self._data = os.path.join(self._dir, "data")
        self._startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._initialised = False
        self._closed = False

    # ----------------------------------------------------------------- properties

    @property
    def port(self) -> int:
        """The TCP port."""
        return self._port

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres`` (asyncpg and libpq both take it)."""
        return f"postgresql://postgres@{_HOST}:{self._port}/postgres"

    @property
    def dir(self) -> str:
        """The temporary directory (data directory and log inside)."""
        return self._dir

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self._alive()

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> str:
        """Where the server's output goes."""
        return os.path.join(self._dir, _LOG_NAME)

    def read_log(self) -> str:
        """The server's output so far."""
        try:
            return Path(self.log_path).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ----------------------------------------------------------------- lifecycle

    def _popen_kwargs(self) -> dict[str, Any]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
        kwargs: dict[str, Any] = {"env": env, "cwd": self._dir}
        if self._owner is not None:
            uid, gid = self._owner
            kwargs.update(user=uid, group=gid, extra_groups=[])
        return kwargs

    def _initdb(self) -> None:
        if self._owner is not None:
            os.chown(self._dir, *self._owner)
        cmd = [
            os.path.join(self._bin, "initdb"),
            "-D",
            self._data,
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-locale",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        ]
        done = subprocess.run(cmd, capture_output=True, timeout=120, **self._popen_kwargs())
        if done.returncode != 0:
            if b"--no-instructions" in done.stderr:  # initdb before 13
                cmd.remove("--no-instructions")
                done = subprocess.run(cmd, capture_output=True, timeout=120, **self._popen_kwargs())
            if done.returncode != 0:
                raise RuntimeError(
                    f"initdb failed ({done.returncode}): {done.stderr.decode(errors='replace')}"
                )
        self._initialised = True

    def start(self) -> PostgresServer:
        """Create the cluster (first time only) and start the server; wait until it is ready."""
        if self._closed:
            raise RuntimeError("a closed PostgresServer cannot be started again")
        if self.running:
            return self
        if not self._initialised:
            self._initdb()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._data, "postmaster.pid"))  # left by a kill()
        argv = [
            os.path.join(self._bin, "postgres"),
            "-D",
            self._data,
            "-p",
            str(self._port),
            "-c",
            f"listen_addresses={_HOST}",
            "-c",
            "unix_socket_directories=",
        ]
        for key, value in self._config.items():
            argv += ["-c", f"{key}={value}"]
        log = open(self.log_path, "ab")
        try:
            self._proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **self._popen_kwargs(),
            )
        finally:
            log.close()
        _live.add(self)
        deadline = time.monotonic() + self._startup_timeout
        while not self._ready():
            if not self._alive():
                raise RuntimeError(f"postgres exited on start: {self.read_log()[-2000:]}")
            if time.monotonic() > deadline:
                self._signal(signal.SIGKILL)
                raise RuntimeError(f"postgres not ready in time: {self.read_log()[-2000:]}")
            time.sleep(0.02)
        return self

    def _ready(self) -> bool:
        # postmaster.pid's 8th line is the server's status ("ready" once it accepts
        # connections, since PostgreSQL 10)
        try:
            lines = Path(self._data, "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, PermissionError):
            return False
        return len(lines) >= 8 and lines[7].strip() == "ready"

    def _signal(self, sig: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, disconnect, checkpoint)."""
        if self._proc is None:
            return
        self._signal(signal.SIGINT)
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self._proc.wait(5)
        self._proc = None

    def kill(self) -> None:
        """SIGKILL the server (its backends stop on their own); :meth:`start` recovers it."""
        if self._proc is None:
            return
        pid = self._proc.pid
        self._signal(signal.SIGKILL)
        self._proc.wait(5)
        self._proc = None
        # the backends notice the dead postmaster and exit; wait so the port is free
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _children_alive(pid):
            time.sleep(0.05)

    def restart(self) -> PostgresServer:
        """Stop and start again on the same port and data."""
        self.stop()
        return self.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the server and remove its directory; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop(timeout)
        finally:
            _live.discard(self)
            shutil.rmtree(self._dir, ignore_errors=True)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<PostgresServer {self.url} {state}>"


def _children_alive(pid: int) -> bool:
    """True while a process of the session ``pid`` led is still alive (Linux /proc)."""
    for entry in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(entry).read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[3] == str(pid):  # session id
            return True
    return False


@contextlib.contextmanager
def private_postgres(**config: str) -> Iterator[str]:
    """Yield a PostgreSQL URL: ``DATABASE_URL`` if set, else a fresh :class:`PostgresServer`.

    Point ``DATABASE_URL`` only at a disposable database. ``config`` items are server settings
    for the private server (ignored, with a warning, when ``DATABASE_URL`` is used).
    """
    env_url = os.environ.get("DATABASE_URL")
    if env_url:
        if config:
            logger.warning("DATABASE_URL is set; ignoring postgres settings %s", sorted(config))
        yield env_url
        return
    with PostgresServer(config=config) as server:
        yield server.url
