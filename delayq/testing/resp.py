"""A tiny RESP client for the few commands a test server's own lifecycle needs
(no redis-py, so it works before and after any client library is imported)."""

from __future__ import annotations

import socket
from typing import Any

from .binary import _HOST

# --------------------------------------------------------------------------- tiny RESP client


class _RespError(Exception):
    """An error reply (``-ERR ...``) from the server."""


def _read_line(fp: Any) -> bytes:
    line: bytes = fp.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed by redis-server")
    return line[:-2]


def _read_reply(fp: Any) -> Any:
    line = _read_line(fp)
    kind, rest = line[:1], line[1:]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise _RespError(rest.decode(errors="replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data: bytes = fp.read(n + 2)
        return data[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(fp) for _ in range(n)]
    raise ConnectionError(f"unexpected reply from redis-server: {line!r}")


def _command(port: int, *args: str, password: str | None = None, timeout: float = 1.0) -> Any:
    """Send one command over a fresh connection and return the decoded reply."""

    def encode(*parts: str) -> bytes:
        out = [b"*%d\r\n" % len(parts)]
        for part in parts:
            raw = part.encode()
            out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
        return b"".join(out)

    with socket.create_connection((_HOST, port), timeout=timeout) as sock:
        fp = sock.makefile("rb")
        try:
            if password is not None:
                sock.sendall(encode("AUTH", password))
                _read_reply(fp)
            sock.sendall(encode(*args))
            return _read_reply(fp)
        finally:
            fp.close()
