"""How every background loop waits: between its turns, and before it tries again after
a failure.

A loop that retries at once loops without waiting for anything: it holds up the whole
process, or hammers Redis. One that sleeps its whole backoff resumes late after Redis
comes back. So: the backoff, cut short by the loop's wake-up event (set when its
subscription is back, among others), but never before :data:`MIN_RETRY`.

The parts, one way each: :class:`Retrying` (one loop's doubling backoff), :class:`Backoffs`
(one per key, the others going on), :class:`Wakeup` (what cuts a loop's wait short),
:func:`listen` (a subscription made again after it drops), :class:`Stoppable` (a loop's
stop), :func:`poll` (a loop of passes that each say how long to wait: the scheduler, the
partitions' spread, the schedule firer) and :class:`Periodic` (a loop that acts every
``interval``: the heartbeat, the history writer).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import anyio.lowlevel

from .errors import RedisResponseError, is_transient

__all__ = [
    "MAX_BACKOFF",
    "MAX_RESTART",
    "MIN_RETRY",
    "Backoffs",
    "Listener",
    "Periodic",
    "Retrying",
    "Stoppable",
    "Wakeup",
    "listen",
    "log_retry",
    "poll",
    "wait_to_retry",
]

MAX_BACKOFF = 5.0
"""Seconds a failing background loop waits at most before it tries again."""

MAX_RESTART = 30.0
"""Seconds a crashed loop (or ``--processes N``'s worker process) waits at most before it
is started again."""

MIN_RETRY = 0.1
"""Seconds a failed pass waits at least, whatever wakes its loop meanwhile."""


async def wait_to_retry(wake: anyio.Event, backoff: float) -> None:
    """Wait ``backoff`` seconds, or until ``wake`` is set once :data:`MIN_RETRY` has passed."""
    first = min(backoff, MIN_RETRY)
    await anyio.sleep(first)
    with anyio.move_on_after(backoff - first):
        await wake.wait()


class Backoffs:
    """Each key's own backoff (a shard, a type, the membership): one that keeps failing
    is tried again later and later, up to ``cap``, while the others go on.

    ``cap`` is short on purpose: a key fails most often because its cluster node is
    failing over, and it should resume soon after the promotion, not a long backoff
    later. A try costs one refused command.
    """

    def __init__(self, first: float = 0.1, cap: float = 0.5) -> None:
        self._first = first
        self._cap = cap
        self._delay: dict[str, float] = {}
        self._until: dict[str, float] = {}

    def failed(self, key: str, now: float) -> float:
        """``key`` failed at ``now``: return how long it waits before its next try."""
        delay = self._delay.get(key, self._first / 2) * 2
        self._delay[key] = delay = min(delay, self._cap)
        self._until[key] = now + delay
        return delay

    def hold(self, key: str, until: float) -> None:
        """Keep ``key`` from being tried before ``until``."""
        self._until[key] = until

    def succeeded(self, key: str) -> bool:
        """``key`` succeeded: forget its backoff; return whether it was failing."""
        self._until.pop(key, None)
        return self._delay.pop(key, None) is not None

    def waiting(self, key: str, now: float) -> bool:
        """True while ``key`` waits for its next try."""
        return self._until.get(key, -1.0) > now

    def until(self, key: str) -> float:
        """When ``key`` may be tried next (``-1`` when it is not waiting)."""
        return self._until.get(key, -1.0)

    def failing(self, key: str) -> bool:
        """True from ``key``'s failure until its next success."""
        return key in self._delay

    def move_failed(
        self, key: str, exc: Exception, now: float, *, refused_wait: float, log: logging.Logger
    ) -> None:
        """A move of ``key`` (a type or a partition) raised ``exc``: log it and back ``key``
        off, the others going on. Refused by Redis (a key of the wrong type written by
        someone else): ``refused_wait``. Its node away, failing over or busy (a lost
        connection, a timeout, a "not now" such as ``READONLY``): the backoff."""
        if isinstance(exc, RedisResponseError) and not is_transient(exc):
            log.error("%s: moving due events failed: %s; trying again later", key, exc)
            self.hold(key, now + refused_wait)
            return
        first = not self.failing(key)
        wait = self.failed(key, now)
        level = logging.WARNING if first else logging.DEBUG
        log_retry(log, f"{key}: moving due events", exc, wait, level=level)


@dataclass(slots=True)
class Retrying:
    """One failing loop's wait before its next try: ``first`` seconds, doubled after each
    failure up to ``most``; :meth:`reset` after a success."""

    first: float = 0.05
    most: float = MAX_BACKOFF
    delay: float = field(init=False)
    """The wait before the next try (what a log line says)."""

    def __post_init__(self) -> None:
        self.delay = self.first

    def reset(self) -> None:
        """A try succeeded: the next failure waits ``first`` again."""
        self.delay = self.first

    def next(self) -> float:
        """The wait for this failure (:attr:`delay`); the next one waits twice as long."""
        delay = self.delay
        self.delay = min(delay * 2, self.most)
        return delay

    async def sleep(self) -> None:
        """Sleep :meth:`next`'s wait."""
        await anyio.sleep(self.next())

    def held(self, since: float, now: float, hold: float | None = None) -> None:
        """A connection (a subscription) made at ``since`` dropped at ``now``: start the
        backoff over only if it held for ``hold`` seconds (default :attr:`most`). One
        dropped soon after it was made (a proxy, a kill loop) goes on backing off rather
        than being made again every ``first`` seconds."""
        if now - since >= (self.most if hold is None else hold):
            self.reset()


class Listener(Protocol):
    """A subscription to one channel (the store's ``WakeupListener``)."""

    async def subscribe(self) -> None:
        """Subscribe; raise if the connection fails."""

    async def next(self, timeout: float) -> str | None:
        """The next message, or None after ``timeout`` seconds without one."""

    async def aclose(self) -> None:
        """Unsubscribe and give the connection back."""


async def listen(
    subscription: Callable[[], Listener],
    on_message: Callable[[str], object],
    *,
    log: logging.Logger,
    what: str,
    timeout: float,
    hold: float = 0.0,
    on_subscribed: Callable[[], object] | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> None:
    """Hand each message of a subscription to ``on_message`` until ``stopping()``, and
    subscribe again after a dropped connection, after the backoff (0.1 s doubling up to
    :data:`MAX_BACKOFF`). The backoff starts over after a subscription that held for
    ``hold`` seconds (see :meth:`Retrying.held`); ``on_subscribed`` is called each time
    the subscription is made (messages may have been missed meanwhile)."""
    retrying = Retrying(first=0.1)
    while not stopping():
        listener = subscription()
        since = math.inf
        try:
            await listener.subscribe()
            since = time.monotonic()
            if on_subscribed is not None:
                on_subscribed()
            while True:
                message = await listener.next(timeout=timeout)
                if message:
                    on_message(message)
        except Exception as exc:
            retrying.held(since, time.monotonic(), hold)
            log.info("%s dropped (%s); resubscribing in %.2fs", what, exc, retrying.delay)
            await retrying.sleep()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                await listener.aclose()


def log_retry(
    log: logging.Logger, what: str, exc: Exception, wait: float, *, level: int = logging.WARNING
) -> None:
    """Log that ``what`` failed with ``exc`` and is tried again in ``wait`` seconds."""
    log.log(level, "%s failed (%s: %s); retrying in %.2fs", what, type(exc).__name__, exc, wait)


class Wakeup:
    """What cuts a loop's wait short: :meth:`set` ends the wait under way, or the next one
    when none is; the loop renews it (:meth:`renew`) after each turn. Before the first
    renewal (``armed=False``), :meth:`set` does nothing."""

    __slots__ = ("event",)

    def __init__(self, *, armed: bool = False) -> None:
        self.event: anyio.Event | None = anyio.Event() if armed else None
        """The event of the turn under way."""

    def set(self) -> None:
        """End the loop's wait (now, or as soon as it starts)."""
        if self.event is not None:
            self.event.set()

    def renew(self) -> anyio.Event:
        """A fresh event for the next turn (called in the loop's event loop)."""
        self.event = anyio.Event()
        return self.event

    async def wait(self, most: float) -> None:
        """Wait ``most`` seconds, or until :meth:`set`."""
        event = self.event if self.event is not None else self.renew()
        with anyio.move_on_after(most):
            await event.wait()


async def poll(
    turn: Callable[[], Awaitable[float]],
    *,
    wake: Wakeup,
    stopping: Callable[[], bool],
    log: logging.Logger,
    what: str,
    on_error: Callable[[], object] | None = None,
    retrying: Retrying | None = None,
) -> None:
    """Run ``turn`` until ``stopping()``: the one loop of the scheduler, the spread and
    the firer (saq's ``poll(func, sleep)``, with a wake-up and a backoff).

    ``turn`` returns how long to wait before the next turn: that wait is cut short by
    ``wake``; 0 (or stopping) yields to the event loop once, since a turn that sent
    nothing awaited nothing. A turn that raises is logged (``what`` failed), counted
    (``on_error``) and followed by the backoff (``retrying``: 0.1 s doubling up to
    :data:`MAX_BACKOFF`), which a wake-up cuts short only after :data:`MIN_RETRY`:
    whatever is pending, a failing loop never retries at once. ``wake`` is renewed
    after every turn.
    """
    retrying = Retrying(first=0.1) if retrying is None else retrying
    while not stopping():
        try:
            pause = await turn()
        except Exception as exc:  # loops never die: log, back off, go on
            if on_error is not None:
                on_error()
            pause = retrying.next()
            log_retry(log, what, exc, pause)
            event = wake.event if wake.event is not None else wake.renew()
            if stopping():
                await anyio.lowlevel.checkpoint()
            else:  # not skipped for pending wake-ups (they stay until a turn succeeds)
                await wait_to_retry(event, pause)
        else:
            retrying.reset()
            if pause > 0 and not stopping():
                await wake.wait(pause)
            else:
                await anyio.lowlevel.checkpoint()
        wake.renew()


class Stoppable:
    """A background loop's stop: after :meth:`stop`, :attr:`stopping` is True (the service's
    runtime does not restart a loop that raised while stopping). :meth:`stop` also cancels
    ``_scope`` (the scope ``run`` works in, if it set one) after :meth:`_stopped`."""

    def __init__(self) -> None:
        self._stopping = False
        self._scope: anyio.CancelScope | None = None

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` has been called."""
        return self._stopping

    def stop(self) -> None:
        """End ``run``."""
        self._stopping = True
        self._stopped()
        if self._scope is not None:
            self._scope.cancel()

    def _stopped(self) -> None:
        """What else a stop does before the scope is cancelled (wake the loop, stop a part)."""


class Periodic(Stoppable):
    """A loop that acts every ``interval`` seconds until stopped (the heartbeat and the
    history writer): its wait between two rounds, which :meth:`stop` cuts short (the loop
    does its last round on the way out). The service's runtime runs them (``run``)."""

    def __init__(self, interval: float):
        super().__init__()
        self.interval = interval
        self._stop = Wakeup()

    def _stopped(self) -> None:
        self._stop.set()

    async def pause(self) -> None:
        """Wait ``interval`` seconds, or until :meth:`stop` is called."""
        if self._stop.event is None:
            self._stop.renew()  # needs the running event loop
        if self._stopping:
            return
        await self._stop.wait(self.interval)
