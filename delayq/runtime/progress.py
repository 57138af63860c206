"""Progress that running handlers report (``current_delivery().progress(...)``), written at
most once a second per run: later values replace a waiting one, and the last is written."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec

from ..storage.store import Store

__all__ = ["ProgressWriter", "encode_progress"]

log = logging.getLogger("delayq.consumer")

INTERVAL = 1.0  # seconds between two writes of one run's progress, at least
MAX_BYTES = 1024  # an encoded value and note, at most
_encode = msgspec.json.Encoder().encode


def encode_progress(value: Any, note: str | None) -> bytes:
    """The stored form of one report, ``{"value", "note", "at"}`` in JSON; ``TypeError`` or
    ``ValueError`` for a value that is not small encodable data."""
    if isinstance(value, bool) or value is None:
        raise TypeError(f"progress must be a number or small JSON-able data, not {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"progress must be finite, not {value!r}")
    if note is not None and not isinstance(note, str):
        raise TypeError(f"a progress note is a str or None, not {note!r}")
    try:
        data = _encode({"value": value, "note": note, "at": time.time_ns() // 1_000_000})
    except (TypeError, msgspec.EncodeError) as exc:
        raise TypeError(f"progress must be JSON-able data: {exc}") from exc
    if len(data) > MAX_BYTES:
        raise ValueError(f"progress and note encode to {len(data)} bytes, over {MAX_BYTES}")
    return data


@dataclass(slots=True)
class _Run:
    shard: str
    raw_id: bytes
    written_at: float = -math.inf  # monotonic time of its last write
    waiting: bytes | None = None  # the value not written yet
    written: bool = False


class ProgressWriter:
    """One consumer's progress reports; its :meth:`run` task writes them."""

    def __init__(self, store: Store, group: str | None, label: str):
        self._store = store
        self._group = group
        self._label = label
        self.runs: dict[bytes, _Run] = {}  # claim token -> the run's reports
        self._wanted = asyncio.Event()
        self._clears: list[tuple[bytes, _Run]] = []  # finished runs whose progress was written
        self.started = False  # the consumer starts run() at the first report

    def report(self, shard: str, raw_id: bytes, token: bytes, data: bytes) -> bool:
        """Keep ``data`` as the run's latest progress, written within a second; True for the
        run's first report (the consumer then calls :meth:`finished` when the run ends)."""
        run = self.runs.get(token)
        first = run is None
        if run is None:
            run = self.runs[token] = _Run(shard, raw_id)
        run.waiting = data
        self._wanted.set()
        return first

    def finished(self, token: bytes) -> None:
        """A run that reported ended: forget it, and have its stored progress removed."""
        run = self.runs.pop(token, None)
        if run is not None and run.written:
            self._clears.append((token, run))
            self._wanted.set()

    async def _clear(self) -> None:
        """Remove finished runs' stored progress (a newer delivery's stays)."""
        while self._clears:
            token, run = self._clears.pop()
            try:
                await self._store.running.clear_progress(run.shard, self._group, run.raw_id, token)
            except Exception as exc:  # it expires with the hash
                log.debug("%s: clearing progress failed: %s", self._label, exc)

    async def run(self) -> None:
        """Write waiting reports, each run's at most once per :data:`INTERVAL`."""
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            await self._clear()
            while True:
                now = time.monotonic()
                due: dict[str, list[tuple[bytes, bytes, bytes]]] = {}
                later = math.inf
                for token, run in self.runs.items():
                    if run.waiting is None:
                        continue
                    if run.written_at + INTERVAL <= now:
                        due.setdefault(run.shard, []).append((run.raw_id, token, run.waiting))
                        run.waiting, run.written_at, run.written = None, now, True
                    else:
                        later = min(later, run.written_at + INTERVAL)
                for shard, items in due.items():
                    try:
                        await self._store.running.write_progress(shard, self._group, items)
                    except Exception as exc:  # progress is for people looking: never fatal
                        log.warning("%s: writing progress failed: %s", self._label, exc)
                await self._clear()
                if later == math.inf:
                    break
                await anyio.sleep(max(0.0, later - time.monotonic()))
