"""A TCP proxy that injects network faults between clients and one server (for tests).

:class:`FaultProxy` listens on a loopback port and forwards every connection made to it to
one upstream server (a private ``redis-server``, usually), byte for byte, in both
directions. While it runs, a test can add faults to every connection, current and new:

- **latency** per direction (:meth:`FaultProxy.set_latency`): each chunk is forwarded that
  much later, in order, as a slow link would (pipelined commands are not serialised);
- **bandwidth** caps per direction, in bytes per second (:meth:`FaultProxy.set_bandwidth`);
- a **blackhole** (:meth:`FaultProxy.blackhole`, :meth:`FaultProxy.heal`): nothing is
  forwarded and no connection is closed, as on a network path that drops every packet: a
  half-open connection, where a client notices nothing but its own timeouts. The proxy
  stops reading, so what is sent stays in the sockets' buffers; once healed it is
  delivered in order, end of stream included, as TCP would after retransmitting. New
  connections are accepted but reach the server only once healed;
- a **reset** (:meth:`FaultProxy.reset`): every connection is closed abruptly (RST) on
  both sides at once.

Usage (asyncio; a client and the proxy in the same event loop)::

    async with FaultProxy(server.url) as proxy:
        client = redis.asyncio.Redis.from_url(proxy.url)
        proxy.set_latency(to_server=0.2, to_client=0.2)
        proxy.blackhole()
        ...
        proxy.heal()
        proxy.reset()

The proxy serves any number of connections (a Redis client opens several), all to the
same upstream: put one proxy in front of each process whose network should fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

__all__ = ["FaultProxy"]

_CHUNK = 65536
# a paced chunk is written in slices of this many seconds of the cap, so a slow link
# delivers a long reply gradually rather than in one burst after a long pause
_PACE_SLICE = 0.01


class _LinkClosed(Exception):
    """A side of a link broke or closed: the whole link goes."""


class _Direction:
    """The faults of one direction (client to server, or server to client)."""

    __slots__ = ("bandwidth", "bytes", "latency")

    def __init__(self) -> None:
        self.latency = 0.0
        self.bandwidth: float | None = None
        self.bytes = 0


class FaultProxy:
    """A TCP proxy from a loopback port to one upstream server, with faults on demand.

    ``upstream`` is the server's URL (``redis://...``, ``rediss://...``: only host and
    port are used; :attr:`url` is the same URL pointing at the proxy) or a ``(host,
    port)`` pair. The proxy listens on ``host`` (loopback by default) at ``port`` (0: a
    free one, see :attr:`port`). Start it with ``async with`` (or :meth:`start`, then
    :meth:`aclose`); it runs in the event loop that started it. Faults apply to every
    connection at once, those open and those to come, until changed;
    :meth:`clear` removes them all.
    """

    def __init__(self, upstream: str | tuple[str, int], *, host: str = "127.0.0.1", port: int = 0):
        if isinstance(upstream, str):
            parts = urlsplit(upstream)
            if parts.hostname is None:
                raise ValueError(f"no host in {upstream!r}")
            self._url: str | None = upstream
            self.upstream: tuple[str, int] = (parts.hostname, parts.port or 6379)
        else:
            self._url = None
            self.upstream = (upstream[0], int(upstream[1]))
        self.host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._links: dict[asyncio.Task[None], list[asyncio.StreamWriter]] = {}
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.to_server = _Direction()
        """Faults and byte count of the client-to-server direction."""
        self.to_client = _Direction()
        """Faults and byte count of the server-to-client direction."""
        self.accepted = 0
        """Connections accepted so far."""

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> FaultProxy:
        """Listen (returns ``self``); :attr:`port` is known from then on."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, self.host, self._port)
            self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def aclose(self) -> None:
        """Stop listening and close every connection (each side sees a normal close)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._links)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if server is not None:  # (Python 3.12+ waits here for the connections too)
            await server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def port(self) -> int:
        """The port the proxy listens on (once started)."""
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def url(self) -> str:
        """The upstream URL with the proxy's host and port (``redis://host:port`` when the
        upstream was given as a pair): hand it to the client under test."""
        netloc = (
            f"{self.host}:{self.port}" if ":" not in self.host else f"[{self.host}]:{self.port}"
        )
        if self._url is None:
            return f"redis://{netloc}"
        parts = urlsplit(self._url)
        userinfo = parts.netloc.rpartition("@")[0]
        return urlunsplit(parts._replace(netloc=f"{userinfo}@{netloc}" if userinfo else netloc))

    @property
    def connections(self) -> int:
        """Connections open through the proxy right now."""
        return len(self._links)

    # -- faults -------------------------------------------------------------------------------

    def set_latency(self, to_server: float = 0.0, to_client: float = 0.0) -> None:
        """Delay what each direction carries by this many seconds (0: none), from now on."""
        if to_server < 0 or to_client < 0:
            raise ValueError("latency must be >= 0")
        self.to_server.latency = to_server
        self.to_client.latency = to_client

    def set_bandwidth(self, to_server: float | None = None, to_client: float | None = None) -> None:
        """Cap each direction at this many bytes per second (None: no cap), from now on."""
        for cap in (to_server, to_client):
            if cap is not None and cap <= 0:
                raise ValueError("a bandwidth cap must be > 0 bytes/s (None: no cap)")
        self.to_server.bandwidth = to_server
        self.to_client.bandwidth = to_client

    def blackhole(self) -> None:
        """Stop forwarding in both directions, closing nothing, until :meth:`heal`."""
        self._flowing.clear()

    def heal(self) -> None:
        """End a blackhole: what waited is delivered, in order, and forwarding goes on."""
        self._flowing.set()

    @property
    def blackholed(self) -> bool:
        """Whether a blackhole is on."""
        return not self._flowing.is_set()

    def reset(self) -> int:
        """Close every open connection abruptly (a TCP RST to the client and to the server);
        returns how many. The proxy goes on accepting new ones."""
        links = list(self._links.items())
        for task, writers in links:
            for writer in writers:
                _abort(writer)
            task.cancel()  # (a blackholed link would not notice until healed)
        return len(links)

    def clear(self) -> None:
        """Remove every fault: no latency, no caps, no blackhole."""
        self.set_latency()
        self.set_bandwidth()
        self.heal()

    # -- forwarding -----------------------------------------------------------------------

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        writers = [c_writer]
        self._links[task] = writers
        self.accepted += 1
        halves: list[asyncio.Task[None]] = []
        try:
            await self._flowing.wait()  # a blackholed path: the server sees nothing yet
            s_reader, s_writer = await asyncio.open_connection(*self.upstream)
            writers.append(s_writer)
            # each direction: a reader and a writer task, so that latency delays every
            # chunk without holding back the reads behind it
            for reader, writer, way in (
                (c_reader, s_writer, self.to_server),
                (s_reader, c_writer, self.to_client),
            ):
                queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(256)
                halves.append(asyncio.create_task(self._read(reader, queue, way)))
                halves.append(asyncio.create_task(self._write(queue, writer, way)))
            pending = set(halves)
            while pending:  # until both directions ended, or one side broke
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                for half in done:
                    if half.exception() is not None:
                        return
        except OSError:
            return
        except asyncio.CancelledError:
            # reset() or aclose() ended this link: the task ends normally, as the streams
            # machinery that started it expects (it reads the task's result)
            return
        finally:
            for half in halves:
                half.cancel()
            for half in halves:
                with contextlib.suppress(asyncio.CancelledError, _LinkClosed, OSError):
                    await half
            del self._links[task]
            for writer in writers:
                writer.close()

    async def _read(
        self,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes]],
        way: _Direction,
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._flowing.wait()  # a blackhole: what is sent stays in the socket
            try:
                data = await reader.read(_CHUNK)
            except OSError as exc:
                raise _LinkClosed from exc
            await queue.put((loop.time() + way.latency, data))
            if not data:
                return

    async def _write(
        self,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        way: _Direction,
    ) -> None:
        loop = asyncio.get_running_loop()
        next_free = loop.time()  # with a cap: when the link can take the next byte
        while True:
            due, data = await queue.get()
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._flowing.wait()
            try:
                if not data:  # the peer closed: pass the end of the stream on
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                view = memoryview(data)
                while view:
                    cap = way.bandwidth
                    piece = view if cap is None else view[: max(1, int(cap * _PACE_SLICE))]
                    if cap is not None:
                        next_free = max(next_free, loop.time())
                        wait = next_free - loop.time()
                        if wait > 0:
                            await asyncio.sleep(wait)
                        next_free += len(piece) / cap
                        await self._flowing.wait()
                    writer.write(piece)
                    await writer.drain()
                    way.bytes += len(piece)
                    view = view[len(piece) :]
            except OSError as exc:
                raise _LinkClosed from exc


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close a connection with a RST rather than a FIN (SO_LINGER 0), dropping unsent data."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
