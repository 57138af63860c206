"""The base of the loops that act every ``interval`` seconds until stopped.

The heartbeat and the history writer are such loops: the service's runtime
runs them (``run``), and ends them with ``stop()``, after which ``stopping``
is True (a loop that raises while stopping is not restarted).
"""

from __future__ import annotations

import anyio

__all__ = ["Periodic"]


class Periodic:
    """A loop's stop flag, and its wait between two rounds that ``stop()`` cuts short."""

    def __init__(self, interval: float):
        self.interval = interval
        self._stopping = False
        self._stop_event: anyio.Event | None = None

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` has been called."""
        return self._stopping

    def stop(self) -> None:
        """End the loop (it does its last round on the way out)."""
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()

    async def pause(self) -> None:
        """Wait ``interval`` seconds, or until :meth:`stop` is called."""
        if self._stop_event is None:
            self._stop_event = anyio.Event()  # needs the running event loop
        if self._stopping:
            return
        with anyio.move_on_after(self.interval):
            await self._stop_event.wait()
