"""Serving ``/metrics``: an ASGI app to mount in a web service, and a small server of its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from .depth import QueueDepthCollector

if TYPE_CHECKING:
    from ..service import EventService

__all__ = ["MetricsApp", "MetricsServer", "make_asgi_app", "serve"]

log = logging.getLogger("delayq.prometheus")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_REQUEST_TIMEOUT = 10.0
_MAX_HEAD = 16 * 1024


class MetricsApp:
    """An ASGI app answering GET (and HEAD) with the registry in the Prometheus text format.

    Mount it in FastAPI/Starlette (``app.mount("/metrics", metrics_app)``) or
    run it alone under any ASGI server. With a service it also exports the
    queue depth (see :class:`QueueDepthCollector`), refreshed before each
    rendering. OpenMetrics is served to scrapers that ask for it.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        collector: QueueDepthCollector | None = None,
    ):
        self.registry = REGISTRY if registry is None else registry
        self.collector = collector
        if collector is not None:
            self.registry.register(collector)

    async def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition body and its content type, for an ``Accept`` header."""
        if self.collector is not None:
            await self.collector.refresh()
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def close(self) -> None:
        """Take the queue-depth collector out of the registry (a new app may then add one)."""
        if self.collector is not None:
            with contextlib.suppress(KeyError):
                self.registry.unregister(self.collector)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        method = scope.get("method", "GET")
        if method not in ("GET", "HEAD"):
            await _respond(send, 405, b"method not allowed\n", "text/plain", allow=True)
            return
        accept = ""
        for key, value in scope.get("headers", []):
            if key.lower() == b"accept":
                accept = value.decode("latin-1")
        body, content_type = await self.render(accept)
        await _respond(send, 200, body, content_type, head=method == "HEAD")


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: str,
    *,
    head: bool = False,
    allow: bool = False,
) -> None:
    headers = [
        (b"content-type", content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode()),
    ]
    if allow:
        headers.append((b"allow", b"GET, HEAD"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})


def make_asgi_app(
    service: EventService | None = None,
    *,
    registry: CollectorRegistry | None = None,
    namespace: str = "delayq",
    cache_seconds: float = 5.0,
) -> MetricsApp:
    """An ASGI ``/metrics`` app for ``registry`` (default: prometheus-client's ``REGISTRY``).

    With ``service``, the queue depth under its prefix is read from Redis at
    scrape time, at most once per ``cache_seconds``. Registering the depth
    collector twice in one registry is refused: call :meth:`MetricsApp.close`
    before making another app for the same registry.
    """
    collector = None
    if service is not None:
        collector = QueueDepthCollector(service, namespace=namespace, cache_seconds=cache_seconds)
    return MetricsApp(registry, collector)


class MetricsServer:
    """The running server of :func:`serve`: its ``port`` (the bound one) and ``app``."""

    def __init__(self, server: asyncio.Server, app: MetricsApp):
        self.server = server
        self.app = app
        self.port: int = server.sockets[0].getsockname()[1]


@contextlib.asynccontextmanager
async def serve(
    port: int,
    *,
    host: str = "0.0.0.0",
    service: EventService | None = None,
    registry: CollectorRegistry | None = None,
    namespace: str = "delayq",
    cache_seconds: float = 5.0,
) -> AsyncIterator[MetricsServer]:
    """Serve ``GET /metrics`` on ``host:port`` while the block runs (``port=0``: any free port).

    A small HTTP/1.1 server on asyncio (no web framework needed), for worker
    processes that have no web app of their own::

        metrics = PrometheusMetrics()
        async with EventService.from_url(url, metrics=metrics) as service:
            async with serve(9100, service=service):
                await stop_requested.wait()

    Its connections are owned: leaving the block closes the listening socket
    and cancels and awaits whatever request is still under way.
    """
    app = make_asgi_app(
        service, registry=registry, namespace=namespace, cache_seconds=cache_seconds
    )
    tasks: set[asyncio.Task[Any]] = set()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await _answer(app, reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # the scraper went away or sent garbage: nothing to answer
        except Exception:
            log.exception("serving /metrics failed")
        finally:
            tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    server = await asyncio.start_server(connection, host, port, limit=_MAX_HEAD)
    try:
        log.info("serving Prometheus metrics on %s:%d", host, server.sockets[0].getsockname()[1])
        yield MetricsServer(server, app)
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.wait(list(tasks), timeout=5.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5.0)
        app.close()


async def _answer(
    app: MetricsApp, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _REQUEST_TIMEOUT)
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    method, target = (parts[0], parts[1]) if len(parts) == 3 else ("", "")
    accept = ""
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "accept":
            accept = value.strip()
    path = target.split("?", 1)[0]
    if not method:
        status, body, content_type = 400, b"bad request\n", "text/plain"
    elif method not in ("GET", "HEAD"):
        status, body, content_type = 405, b"method not allowed\n", "text/plain"
    elif path not in ("/", "/metrics"):
        status, body, content_type = 404, b"not found: try /metrics\n", "text/plain"
    else:
        status, content_type = 200, ""
        body, content_type = await app.render(accept)
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}[status]
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
    )
    if method != "HEAD":
        writer.write(body)
    await writer.drain()
