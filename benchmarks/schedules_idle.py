"""``python benchmarks/schedules_idle.py SECONDS``: idle client commands/s and CPU of a started
service with one handler and no schedules (issue 21: what schedules cost users without any).

Run it with ``PYTHONPATH`` pointing at a checkout of another version (``git archive main
delayq | tar -x -C /tmp/main``) to compare: commands are counted with MONITOR, calls made
inside scripts excluded. Prints one line.
"""

import asyncio
import select
import socket
import sys
import time
from urllib.parse import urlsplit

import delayq
from delayq import Event, EventService
from delayq.testing import RedisServer


class Job(Event, event_name="idle-job"):
    """The one handled type."""

    n: int = 0


def count(url: str, seconds: float) -> int:
    """Commands clients sent during ``seconds`` (MONITOR lines not from ``lua``)."""
    p = urlsplit(url)
    s = socket.create_connection((p.hostname or "127.0.0.1", p.port or 6379))
    s.sendall(b"MONITOR\r\n")
    buf, n, end = b"", 0, time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        r, _, _ = select.select([s], [], [], left)
        if not r:
            break
        buf += s.recv(65536)
        *lines, buf = buf.split(b"\r\n")
        n += sum(1 for line in lines if line.startswith(b"+1") and b" lua]" not in line)
    return n


async def main(seconds: float) -> None:
    """Start a service with one handler, wait, count for ``seconds``, print."""
    with RedisServer() as srv:

        async def h(e: Job) -> None:
            pass

        svc = EventService.from_url(srv.url, prefix="idle")
        svc.add_handler(Job, h)
        async with svc:
            await asyncio.sleep(2)
            cpu = time.process_time()
            n = await asyncio.to_thread(count, srv.url, seconds)
            cpu = time.process_time() - cpu
        print(
            f"{delayq.__file__}: {n / seconds:.2f} commands/s, CPU {cpu * 1000 / seconds:.2f} ms/s"
        )


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]) if len(sys.argv) > 1 else 30.0))
