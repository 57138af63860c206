"""Listening to the sentinels for the events of a failover (see :mod:`~delayq.storage.sentinel`).

:class:`SentinelWatch` subscribes to every sentinel and turns a failover's events into
calls on the master pool: ``+try-failover`` and ``+selected-slave`` fence it,
``+switch-master`` and the aborts end the fence. What those calls decide (which
switch is stale, when the fence lifts) is the pool's business:
:class:`~delayq.storage.sentinel.CheckedSentinelPool`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Protocol

import anyio
from redis.asyncio.sentinel import Sentinel

from .._pacing import Retrying

__all__ = ["FencedPool", "SentinelWatch"]

log = logging.getLogger("delayq.sentinel")

Address = tuple[str, int]

# The sentinel leading a failover starts it (+try-failover names the master only) and,
# one or two timer ticks later, picks the replica it promotes; the promotion itself
# (REPLICAOF NO ONE) comes one tick after that. Fencing at the start gives writes already
# acknowledged by the old master 150-300 ms to reach the replica, instead of 50-100.
_STARTING = ("+try-failover",)
_PROMOTING = ("+selected-slave", "+failover-state-send-slaveof-noone")
# Events that end a failover without a switch (+failover-end-for-timeout is followed by
# +switch-master: not an abort).
_ABORTED = (
    "-failover-abort-not-elected",
    "-failover-abort-no-good-slave",
    "-failover-abort-slave-timeout",
)
# a sentinel is resubscribed within 2 s at most (not _pacing.MAX_BACKOFF): a switch it
# announces while we are away is heard only from the others
_SENTINEL_BACKOFF = 2.0
_CHANNELS = ("+switch-master", *_STARTING, *_PROMOTING, *_ABORTED)


class FencedPool(Protocol):
    """What the watch needs of the master pool (:class:`~delayq.storage.sentinel.CheckedSentinelPool`)."""

    def fence(self, old: Address, new: Address | None) -> bool:
        """A failover replacing ``old`` (by ``new``) started; True if newly fenced for it."""
        ...

    def aborted(self, old: Address) -> bool:
        """The failover replacing ``old`` was aborted; True if the pool was fenced for it."""
        ...

    async def switched(self, old: Address, new: Address) -> bool:
        """A sentinel announced ``new`` as the master; True if the pool follows it now."""
        ...

    async def disconnect(self, inuse_connections: bool = True) -> None:
        """Close the pool's connections (those in use too)."""
        ...


class SentinelWatch:
    """Listens to every sentinel for the events of a failover of ``service_name``.

    Owned by the service: :meth:`start` (idempotent, called with the first
    command) starts one listener task per sentinel, :meth:`aclose` cancels and
    awaits them.
    """

    def __init__(self, manager: Sentinel, service_name: str, pool: FencedPool):
        self._manager = manager
        self._service_name = service_name
        self._pool = pool
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.switches = 0

    def start(self) -> None:
        """Start listening (once; never after :meth:`aclose`)."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="delayq-sentinel-watch"
            )

    async def aclose(self) -> None:
        """Stop listening and wait until the listeners have ended."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await asyncio.wait([task])

    async def _run(self) -> None:
        async with anyio.create_task_group() as tg:
            for sentinel in self._manager.sentinels:
                tg.start_soon(self._listen, sentinel)

    async def _listen(self, sentinel: Any) -> None:
        retrying = Retrying(first=0.1, most=_SENTINEL_BACKOFF)
        while True:
            pubsub = sentinel.pubsub()
            held_since = math.inf
            try:
                await pubsub.subscribe(*_CHANNELS)
                held_since = time.monotonic()
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        await self._event(msg["channel"], msg["data"])
            except Exception as exc:  # that sentinel went away: the others still listen
                # (one dropped soon after SUBSCRIBE keeps backing off)
                retrying.held(held_since, time.monotonic())
                log.debug("sentinel watch: %s; resubscribing in %.1fs", exc, retrying.delay)
                await retrying.sleep()
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    await pubsub.aclose()

    async def _event(self, channel: bytes | str, data: bytes | str) -> None:
        name = channel.decode() if isinstance(channel, bytes) else channel
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        parts = text.split()
        try:
            if name == "+switch-master":
                # <name> <old ip> <old port> <new ip> <new port>; every sentinel sends it
                if len(parts) != 5 or parts[0] != self._service_name:
                    return
                old, new = (parts[1], int(parts[2])), (parts[3], int(parts[4]))
                if await self._pool.switched(old, new):
                    self.switches += 1
                    log.warning(
                        "sentinel: the master of %s moved from %s:%s to %s:%s; reconnecting",
                        *parts,
                    )
                return
            # "<type> <name> <ip> <port> @ <master name> <ip> <port>", or for the master
            # itself "master <name> <ip> <port>"
            if "@" in parts:
                at = parts.index("@")
                if len(parts) != at + 4 or at < 3 or parts[at + 1] != self._service_name:
                    return
                master = (parts[at + 2], int(parts[at + 3]))
                instance = (parts[at - 2], int(parts[at - 1]))
            elif len(parts) == 4 and parts[0] == "master" and parts[1] == self._service_name:
                master = instance = (parts[2], int(parts[3]))
            else:
                return
        except ValueError:  # not a port number: not an event of ours
            return
        if name in _STARTING:
            if self._pool.fence(master, None):
                log.warning(
                    "sentinel: a failover of %s (%s:%s) started; holding commands until the switch",
                    self._service_name,
                    *master,
                )
                await self._pool.disconnect(inuse_connections=True)
        elif name in _PROMOTING:
            if instance == master:  # (always "<replica> @ <master>")
                return
            if self._pool.fence(master, instance):
                log.warning(
                    "sentinel: promoting %s:%s to replace %s:%s as master of %s; "
                    "holding commands until the switch",
                    *instance,
                    *master,
                    self._service_name,
                )
            # again for the second event of a failover too: a connection made meanwhile
            # (whatever it points at) waits for the switch
            await self._pool.disconnect(inuse_connections=True)
        elif self._pool.aborted(master):
            log.warning("sentinel: failover of %s ended without a switch (%s)", text, name)
