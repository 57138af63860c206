"""The cancel channel's listener: ``cancel`` of a running event stops its handler here.

``EventService.cancel`` removes the event (one script) and then publishes one message
per lease it found on ``{prefix}:cancel``: the shard, group, id and claim token. Every
process with handlers holds one subscription to that channel; the one running that
delivery cancels its task (:meth:`~delayq.runtime.consumer.Consumer.cancel_run`), the
others find no such token and ignore it. Idle, the channel costs one connection per
process and no traffic. A message missed while the subscription was down is made up
for by the lease renewal, which finds the lease gone within a third of the visibility
timeout and cancels the run the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from .._pacing import Stoppable, listen
from ..partitions.shards import parse_shard
from ..storage.running import parse_cancel_message
from ..storage.store import Store

__all__ = ["CancelSignals"]

log = logging.getLogger("delayq.consumer")


class CancelSignals(Stoppable):
    """Hears the cancel channel and hands each message to the consumer it names."""

    def __init__(
        self, store: Store, cancel_run: Callable[[str, str, str | None, bytes, bytes], bool]
    ):
        super().__init__()
        self._store = store
        # (shard, type name, group, id, token) -> True when a handler task here was told
        self._cancel_run = cancel_run
        self.started = False

    def on_message(self, data: str) -> bool:
        """Act on one message; True when a handler here was told to stop."""
        parsed = parse_cancel_message(data.encode("utf-8", "surrogateescape"))
        if parsed is None:
            return False
        shard, group, raw_id, token = parsed
        try:
            type_name = parse_shard(shard)[0]
        except ValueError:
            return False
        return self._cancel_run(shard, type_name, group, raw_id, token)

    async def run(self) -> None:
        """Listen until :meth:`stop`; subscribe again after a dropped connection."""
        with anyio.CancelScope() as self._scope:
            await listen(
                self._store.cancel_signals,
                self.on_message,
                log=log,
                what="cancel subscription",
                timeout=30.0,
                stopping=lambda: self._stopping,
            )
