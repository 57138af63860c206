"""``--health-port``: ``GET /healthz`` and ``GET /readyz`` for Kubernetes-style probes.

A few lines of HTTP/1.0 on asyncio streams, in the worker's own event loop:
a blocked loop does not answer, which is what a liveness probe should see.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["HealthServer", "Probe", "http_get"]

log = logging.getLogger("delayq.cli.health")

Probe = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
"""An async check: ``(ok, details)``."""


class HealthServer:
    """Serves ``/healthz`` (``live``) and ``/readyz`` (``ready``): 200 or 503 with a JSON body."""

    def __init__(self, host: str, port: int, live: Probe, ready: Probe):
        self._host, self._port = host, port
        self._routes = {"/healthz": live, "/readyz": ready}
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The port it listens on (useful with port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Listen."""
        self._server = await asyncio.start_server(self._serve, self._host, self._port)
        log.info("health endpoints on http://%s:%d/healthz and /readyz", self._host, self.port)

    async def aclose(self) -> None:
        """Stop listening and wait for the server to close."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(self._respond(reader, writer), 5)
        except Exception as exc:  # a bad or slow client must not disturb the worker
            log.debug("health request failed: %s", exc)
        finally:
            writer.close()

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass  # headers: not needed
        parts = request.decode("latin-1").split()
        path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
        probe = self._routes.get(path)
        if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
            status, body = "405 Method Not Allowed", {"error": "use GET"}
        elif probe is None:
            status, body = "404 Not Found", {"error": "try /healthz or /readyz"}
        else:
            ok, body = await probe()
            status = "200 OK" if ok else "503 Service Unavailable"
        payload = json.dumps(body).encode()
        writer.write(
            f"HTTP/1.0 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + (payload if parts[:1] != ["HEAD"] else b"")
        )
        await writer.drain()


async def http_get(host: str, port: int, path: str, timeout: float = 2.0) -> tuple[int, Any]:
    """``GET path`` on ``host:port``: ``(status, decoded JSON body)``; status 0 when unreachable."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return 0, None
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), timeout)
    except (OSError, asyncio.TimeoutError):
        return 0, None
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        status = int(head.split()[1])
        return status, json.loads(body) if body else None
    except (IndexError, ValueError):
        return 0, None
