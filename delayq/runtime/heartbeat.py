"""Worker heartbeats: every started service keeps a small record of itself in Redis.

The record (host, pid, handled types with their concurrency, handlers in
flight and the ids and claim times of the longest-running ones, start time,
delayq version) is a short JSON string written with a TTL
of three heartbeat intervals, and indexed in a per-prefix sorted set, by one
script call per interval (default every 5 s: 0.2 commands/s per process). A
process that dies stops beating and its record expires by itself; one that
closes removes it at once. :func:`read_workers` lists the live ones with one
ZRANGE and one MGET.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

import anyio
import msgspec

from .._pacing import Periodic
from .._version import __version__
from ..storage.store import Store

__all__ = ["RUNNING_SHOWN", "Heartbeat", "Snapshot", "WorkerInfo", "read_workers"]

log = logging.getLogger("delayq.heartbeat")

# A record lives this many heartbeat intervals: one lost beat does not hide a live worker.
TTL_INTERVALS = 3

RUNNING_SHOWN = 20
"""How many running handlers (the longest-running) a record lists per handled type."""

Snapshot = Mapping[str, "tuple[int, int] | tuple[int, int, list[tuple[str, int]]]"]
"""Handler key (``type`` or ``type:group``) -> (concurrency, handlers in flight[, the
longest-running handlers' ``(event id, claim time ms)``])."""


class _Record(msgspec.Struct, forbid_unknown_fields=False):
    """The stored heartbeat record."""

    id: str
    host: str
    pid: int
    types: dict[str, int]
    in_flight: dict[str, int]
    started_at_ms: int
    seen_at_ms: int
    version: str
    ttl_ms: int = 0
    running: dict[str, list[tuple[str, int]]] = {}


_decode_record = msgspec.json.Decoder(_Record).decode
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live worker process, as its last heartbeat described it."""

    id: str
    """Unique per service instance: ``host:pid:random``."""
    host: str
    """The host name the process runs on."""
    pid: int
    """Its process id."""
    types: Mapping[str, int]
    """Event type name -> handler concurrency."""
    in_flight: Mapping[str, int]
    """Event type name -> handlers running at the last heartbeat."""
    started_at: datetime
    """When the service started (UTC)."""
    seen_at: datetime
    """When the last heartbeat was written (UTC, the worker's clock)."""
    version: str
    """The worker's delayq version."""
    ttl: float
    """Seconds the record lives without a new heartbeat."""
    running: Mapping[str, list[tuple[str, datetime]]] = field(default_factory=dict)
    """Handler key -> ``(event id, claim time)`` of its longest-running handlers at the last
    heartbeat (at most :data:`RUNNING_SHOWN`, longest first; claim time by Redis's clock)."""


def _ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


class Heartbeat(Periodic):
    """The loop that keeps one service's record alive; owned by the service's task group."""

    def __init__(
        self,
        store: Store,
        interval: float,
        snapshot: Callable[[], Snapshot],
    ):
        """``snapshot()`` returns what :data:`Snapshot` says."""
        super().__init__(interval)
        self._store = store
        self.ttl_ms = max(1, round(interval * TTL_INTERVALS * 1000))
        self._snapshot = snapshot
        host = socket.gethostname() or "unknown"
        # only characters that are safe inside a key and in a URL
        safe_host = "".join(c if c.isalnum() or c in "-._" else "_" for c in host)[:64]
        self.worker_id = f"{safe_host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._host = host
        self._started_ms = 0

    def record(self) -> bytes:
        """This worker's record as stored."""
        snap = self._snapshot()
        return _encode(
            _Record(
                id=self.worker_id,
                host=self._host,
                pid=os.getpid(),
                types={name: item[0] for name, item in snap.items()},
                in_flight={name: item[1] for name, item in snap.items()},
                running={name: item[2] for name, item in snap.items() if len(item) > 2 and item[2]},
                started_at_ms=self._started_ms,
                seen_at_ms=time.time_ns() // 1_000_000,
                version=__version__,
                ttl_ms=self.ttl_ms,
            )
        )

    async def run(self) -> None:
        """Beat every ``interval`` until :meth:`stop`; then remove the record."""
        if not self._started_ms:
            self._started_ms = time.time_ns() // 1_000_000
        try:
            while not self._stopping:
                try:
                    await self._store.workers.heartbeat(self.worker_id, self.record(), self.ttl_ms)
                except Exception as exc:  # loops never die; the next beat may get through
                    log.warning("heartbeat failed (%s: %s)", type(exc).__name__, exc)
                await self.pause()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    await self._store.workers.remove_worker(self.worker_id)
                except Exception as exc:  # it expires by itself
                    log.debug("removing the heartbeat record failed: %s", exc)


async def read_workers(store: Store, limit: int = 1000) -> list[WorkerInfo]:
    """The live workers under the store's prefix (at most ``limit``), oldest first."""
    workers = []
    for raw in await store.workers.worker_records(limit):
        try:
            r = _decode_record(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.debug("ignoring an unreadable worker record %r", raw[:100])
            continue
        workers.append(
            WorkerInfo(
                id=r.id,
                host=r.host,
                pid=r.pid,
                types=r.types,
                in_flight=r.in_flight,
                started_at=_ms_to_datetime(r.started_at_ms),
                seen_at=_ms_to_datetime(r.seen_at_ms),
                version=r.version,
                ttl=r.ttl_ms / 1000,
                running={
                    k: [(i, _ms_to_datetime(ms)) for i, ms in v] for k, v in r.running.items()
                },
            )
        )
    workers.sort(key=lambda w: (w.started_at, w.id))
    return workers
