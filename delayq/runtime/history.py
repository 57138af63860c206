"""Handled, failed and lateness history per event type, from small per-process aggregates.

Each started service tees its metrics into a :class:`HistoryRecorder` (see
:class:`delayq.metrics.ServiceMetrics`; a named group's figures arrive under
``type:group``), which
only adds to a few integers per type in memory (no Redis work per event). A
:class:`HistoryWriter` merges them into Redis at most every ``history_interval``
(10 s by default), one script call for all types, and only when something
happened. Redis keeps two rings per type, HASHes of fixed size:

* ``minute``: 60 one-minute slots (the last hour);
* ``coarse``: 72 twenty-minute slots (the last day).

A slot is MessagePack ``[period, handled, failed, b1..b19, cancelled]`` where
``bN`` counts deliveries whose lateness (start time minus due time) fell in bucket N
of :data:`LATENESS_BOUNDS_MS` and ``cancelled`` the runs stopped by ``cancel()``
(left out while 0, so a slot without cancels reads as before it was added): about 30 bytes, so a type's history is capped
near 132 slots x ~45 bytes = ~6 KB (both rings stay compact listpacks), and
expires two days after its last write. Percentiles are interpolated within a
bucket, so p50/p99 are approximate (within the bucket's width).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from typing import Literal

import anyio
import msgspec

from .._pacing import Periodic
from ..storage.store import Store

__all__ = [
    "CANCELLED_COLUMN",
    "LATENESS_BOUNDS_MS",
    "LATENESS_ROW_START",
    "HistoryPoint",
    "HistoryRecorder",
    "HistoryWriter",
    "Window",
    "read_history",
]

log = logging.getLogger("delayq.history")

LATENESS_BOUNDS_MS: tuple[int, ...] = (
    1,
    2,
    5,
    10,
    20,
    50,
    100,
    200,
    500,
    1_000,
    2_000,
    5_000,
    10_000,
    30_000,
    60_000,
    300_000,
    900_000,
    3_600_000,
)
"""Upper bounds (ms) of the lateness buckets; one more bucket holds everything later."""

MINUTE_SLOTS = 60
COARSE_SECONDS = 20 * 60
COARSE_SLOTS = 72
RING_TTL_MS = 2 * 24 * 3600 * 1000

Window = Literal["hour", "day"]
LATENESS_ROW_START = 2
"""Index of the first lateness bucket in a recorder's row (after handled and failed)."""
_BUCKETS = len(LATENESS_BOUNDS_MS) + 1
CANCELLED_COLUMN = LATENESS_ROW_START + _BUCKETS
"""Index of the count of runs stopped by ``cancel()`` in a recorder's row (after the buckets)."""
_N = CANCELLED_COLUMN + 1  # handled, failed, buckets, cancelled

_pack = msgspec.msgpack.Encoder().encode
_unpack = msgspec.msgpack.Decoder(list[int]).decode


class HistoryRecorder:
    """A metrics sink that keeps per-type counts until the writer takes them.

    Counts ``succeeded`` as handled and ``failed``; lateness from
    ``observe("lateness", seconds)`` once the service reports it that way,
    else from the ``lateness_ms`` gauge (never both). The service's consumers
    count lateness without a call per event instead, straight into a
    :meth:`lateness_row` that :meth:`take` reads, and runs stopped by ``cancel()``
    in that row's :data:`CANCELLED_COLUMN` (neither handled nor failed).
    """

    def __init__(self) -> None:
        self._agg: dict[str, list[int]] = {}
        self._observed = False
        self._live: dict[str, list[int]] = {}

    def lateness_row(self, event_type: str) -> list[int]:
        """The live row of ``event_type`` (one per label, however often asked for).

        Its owner adds 1 at ``LATENESS_ROW_START + bisect_left(LATENESS_BOUNDS_MS, ms)``
        for each delivery of lateness ``ms`` (0 when early), as :meth:`observe` would,
        and 1 at :data:`CANCELLED_COLUMN` for each run stopped by ``cancel()``;
        :meth:`take` moves the counts out and zeroes the row in place (between two
        steps of the event loop, so no count is lost).
        """
        row = self._live.get(event_type)
        if row is None:
            row = self._live[event_type] = [0] * _N
        return row

    def _row(self, event_type: str) -> list[int]:
        row = self._agg.get(event_type)
        if row is None:
            row = self._agg[event_type] = [0] * _N
        return row

    def _late(self, ms: float, event_type: str) -> None:
        self._row(event_type)[LATENESS_ROW_START + bisect.bisect_left(LATENESS_BOUNDS_MS, ms)] += 1

    def increment(self, name: str, value: int = 1, *, event_type: str = "") -> None:
        """Count ``succeeded`` and ``failed``."""
        if name == "succeeded" and event_type:
            self._row(event_type)[0] += value
        elif name == "failed" and event_type:
            self._row(event_type)[1] += value

    def gauge(self, name: str, value: float, *, event_type: str = "") -> None:
        """Bucket ``lateness_ms`` (unless lateness comes through :meth:`observe`)."""
        if name == "lateness_ms" and event_type and not self._observed:
            self._late(value, event_type)

    def observe(
        self, name: str, seconds: float, *, event_type: str = "", outcome: str = ""
    ) -> None:
        """Bucket the ``lateness`` duration."""
        if name == "lateness" and event_type:
            self._observed = True
            self._late(seconds * 1000, event_type)

    # the bound forms ServiceMetrics asks for (delayq.metrics): None for what is not recorded

    def bind_increment(self, name: str, *, event_type: str = "") -> Callable[[int], None] | None:
        """:meth:`increment` of ``name`` for ``event_type``; None unless it is counted."""
        if name not in ("succeeded", "failed") or not event_type:
            return None
        return partial(self.increment, name, event_type=event_type)

    def bind_gauge(self, name: str, *, event_type: str = "") -> Callable[[float], None] | None:
        """:meth:`gauge` of ``name`` for ``event_type``; None unless it is recorded."""
        if name != "lateness_ms" or not event_type:
            return None
        return partial(self.gauge, name, event_type=event_type)

    def bind_observe(
        self, name: str, *, event_type: str = "", outcome: str = ""
    ) -> Callable[[float], None] | None:
        """:meth:`observe` of ``name`` for ``event_type``; None unless it is recorded."""
        if name != "lateness" or not event_type:
            return None
        return partial(self.observe, name, event_type=event_type, outcome=outcome)

    def take(self) -> dict[str, list[int]]:
        """Everything counted since the last call, and start over."""
        taken, self._agg = self._agg, {}
        for name, live in self._live.items():
            if not any(live):
                continue
            row = taken.get(name)
            if row is None:
                row = taken[name] = [0] * _N
            for i, v in enumerate(live):
                if v:
                    row[i] += v
                    live[i] = 0
        return taken

    def put_back(self, rows: dict[str, list[int]]) -> None:
        """Add rows that could not be written to what is counted now."""
        for name, row in rows.items():
            mine = self._row(name)
            for i, v in enumerate(row):
                mine[i] += v


def _stored(row: list[int]) -> list[int]:
    """A row as written: without its cancelled column while that is 0 (readers from before
    the column was added read such a slot, and a slot is as small as it was)."""
    return row if row[CANCELLED_COLUMN] else row[:CANCELLED_COLUMN]


class HistoryWriter(Periodic):
    """The loop that writes the recorder's counts every ``interval``; owned by the service."""

    def __init__(self, store: Store, recorder: HistoryRecorder, interval: float):
        super().__init__(interval)
        self._store = store
        self._recorder = recorder

    async def flush(self) -> None:
        """Write what was counted since the last flush (nothing when nothing happened)."""
        rows = self._recorder.take()
        if not rows:
            return
        try:
            await self._store.workers.add_history(
                [(name, _pack(_stored(row))) for name, row in sorted(rows.items())],
                minute_slots=MINUTE_SLOTS,
                coarse_seconds=COARSE_SECONDS,
                coarse_slots=COARSE_SLOTS,
                ttl_ms=RING_TTL_MS,
            )
        except BaseException:
            self._recorder.put_back(rows)
            raise

    async def run(self) -> None:
        """Flush every ``interval`` until :meth:`stop`, then once more."""
        try:
            while not self._stopping:
                await self.pause()
                try:
                    await self.flush()
                except Exception as exc:  # kept for the next flush
                    log.warning("writing history failed (%s: %s)", type(exc).__name__, exc)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    await self.flush()
                except Exception as exc:
                    log.debug("the last history flush failed: %s", exc)


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """One period of one event type's history, summed over every worker."""

    start: datetime
    """Start of the period (UTC)."""
    seconds: int
    """Length of the period: 60 (``"hour"`` window) or 1200 (``"day"``)."""
    handled: int
    """Events handled successfully."""
    failed: int
    """Failed deliveries (retried or dead-lettered)."""
    lateness_p50: float | None
    """Median lateness in seconds (approximate), None without deliveries."""
    lateness_p99: float | None
    """99th percentile lateness in seconds (approximate), None without deliveries."""
    cancelled: int = 0
    """Runs stopped by ``cancel()`` (neither handled nor failed: the event ended there)."""

    @property
    def handled_per_minute(self) -> float:
        """Handled events per minute over the period."""
        return self.handled * 60 / self.seconds

    @property
    def failed_per_minute(self) -> float:
        """Failed deliveries per minute over the period."""
        return self.failed * 60 / self.seconds

    @property
    def cancelled_per_minute(self) -> float:
        """Runs stopped by ``cancel()`` per minute over the period."""
        return self.cancelled * 60 / self.seconds


def percentile(buckets: list[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) in ms of lateness bucket counts, interpolated; None if empty."""
    total = sum(buckets)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(buckets):
        if n and seen + n >= rank:
            low = LATENESS_BOUNDS_MS[i - 1] if i > 0 else 0
            high = LATENESS_BOUNDS_MS[i] if i < len(LATENESS_BOUNDS_MS) else low
            return low + (high - low) * max(0.0, rank - seen) / n
        seen += n
    return float(LATENESS_BOUNDS_MS[-1])


async def read_history(
    store: Store,
    type_name: str,
    window: Window = "hour",
    *,
    group: str | None = None,
    now: float | None = None,
) -> list[HistoryPoint]:
    """One point per period of ``window`` (60 minutes or 72 x 20 minutes), oldest first.

    ``group`` names a delivery group (checked; None: the default group): its own
    history is kept under ``type:group``. Periods without data are zeros. One
    HMGET of at most 72 fields.
    """
    if group is not None:
        type_name = f"{type_name}:{group}"
    if window == "hour":
        ring, period, slots = "minute", 60, MINUTE_SLOTS
    elif window == "day":
        ring, period, slots = "coarse", COARSE_SECONDS, COARSE_SLOTS
    else:
        raise ValueError(f"window must be 'hour' or 'day', not {window!r}")
    values = await store.workers.history_ring(type_name, ring, slots)
    current = int((time.time() if now is None else now) // period)
    rows: dict[int, list[int]] = {}
    for raw in values:
        if not raw:
            continue
        try:
            row = _unpack(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        # a slot without cancels has no cancelled column (as written before there was one)
        if len(row) in (_N, _N + 1) and current - slots < row[0] <= current:
            rows[row[0]] = row[1:]
    points = []
    for index in range(current - slots + 1, current + 1):
        row = rows.get(index, [0] * _N)
        buckets = row[LATENESS_ROW_START:CANCELLED_COLUMN]
        p50, p99 = percentile(buckets, 0.5), percentile(buckets, 0.99)
        points.append(
            HistoryPoint(
                start=datetime.fromtimestamp(index * period, timezone.utc),
                seconds=period,
                handled=row[0],
                failed=row[1],
                lateness_p50=None if p50 is None else p50 / 1000,
                lateness_p99=None if p99 is None else p99 / 1000,
                cancelled=row[CANCELLED_COLUMN] if len(row) > CANCELLED_COLUMN else 0,
            )
        )
    return points
