"""Waiting for and reading the kept results of types with ``results=`` (``EventService.result``).

``result()`` subscribes to the prefix's results channel *before* its first read, so an
outcome written between the read and the wait still wakes it; the channel only makes the
wake-up fast: the outcome is read again every :data:`RECHECK` seconds whatever arrives
(a lost subscription, a failover, a missed message cost at most that much latency).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable

import anyio

from ..errors import EventFailed
from ..partitions.routing import Router
from ..results import Outcome, decode_outcome
from ..storage.store import Store, WakeupListener

__all__ = ["RECHECK", "ResultReader"]

log = logging.getLogger("delayq.results")

RECHECK = 5.0
"""Seconds between two reads of a pending outcome while no wake-up came (the safety net)."""

_STATES = {"p": "pending", "m": "missing"}


class ResultReader:
    """Reads outcomes by ``(type, id)`` over every layout of a (partitioned) type."""

    def __init__(self, store: Store, router: Router):
        self._store = store
        self._router = router

    async def outcomes(self, name: str, ids: Iterable[str]) -> dict[str, Outcome]:
        """The outcome of each id, read at once (one script call per shard)."""
        wanted = list(dict.fromkeys(_check_id(i) for i in ids))
        found: dict[str, Outcome] = {}
        per_shard: dict[str, list[str]] = {}
        for event_id in wanted:
            for shard in self._router.shards_of_id(name, event_id):
                per_shard.setdefault(shard, []).append(event_id)
        for shard, shard_ids in per_shard.items():
            for event_id, (state, data) in zip(
                shard_ids, await self._store.results.outcomes(shard, shard_ids), strict=True
            ):
                outcome = _outcome(state, data)
                # a type being repartitioned: the layout that knows the id wins
                if event_id not in found or found[event_id].status == "missing":
                    found[event_id] = outcome
        return {i: found[i] for i in wanted}

    async def result(self, name: str, event_id: str, timeout: float | None) -> object:
        """The kept result of ``(name, event_id)``, waiting until it exists (see the module)."""
        _check_id(event_id)
        deadline = math.inf if timeout is None else time.monotonic() + max(0.0, timeout)
        shards = {s.encode() for s in self._router.shards_of_id(name, event_id)}
        wanted = event_id.encode()
        listener: WakeupListener | None = None
        try:
            while True:
                if listener is None:
                    listener = await self._subscribe()
                outcome = (await self.outcomes(name, [event_id]))[event_id]
                if outcome.status == "ok":
                    return outcome.value
                if outcome.status == "failed":
                    raise EventFailed(name, event_id, outcome.error or "")
                if outcome.status == "missing":
                    raise LookupError(f"{name} {event_id!r}: no such event and no kept result")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{name} {event_id!r}: no result within {timeout}s")
                if listener is None:  # no subscription: the timed re-check alone
                    await anyio.sleep(min(left, RECHECK))
                    continue
                try:
                    await _wait_for(listener, shards, wanted, min(left, RECHECK))
                except Exception as exc:  # a lost subscription: re-made at the next turn
                    log.warning("%s %r: results subscription lost (%s)", name, event_id, exc)
                    await listener.aclose()
                    listener = None
        finally:
            if listener is not None:
                await listener.aclose()

    async def _subscribe(self) -> WakeupListener | None:
        listener = self._store.result_wakeups()
        try:
            await listener.subscribe()
        except Exception as exc:
            log.warning("subscribing to the results channel failed (%s)", exc)
            await listener.aclose()
            return None
        return listener


async def _wait_for(
    listener: WakeupListener, shards: set[bytes], wanted: bytes, most: float
) -> None:
    """Return when ``"<shard> <id>"`` of the id arrives, or after ``most`` seconds."""
    end = time.monotonic() + most
    while (left := end - time.monotonic()) > 0:
        message = await listener.next(left)
        if message is None:
            continue
        shard, _, event_id = message.encode().partition(b" ")
        if event_id == wanted and shard in shards:
            return


def _check_id(event_id: object) -> str:
    if not isinstance(event_id, str) or not event_id:
        raise ValueError(f"event id must be a non-empty str, not {event_id!r}")
    return event_id


def _outcome(state: str, data: bytes) -> Outcome:
    if state in _STATES:
        return Outcome(_STATES[state])  # type: ignore[arg-type]
    if state == "d":  # a dead letter: data is its error
        return Outcome("failed", error=data.decode("utf-8", "replace"))
    return decode_outcome(data)
