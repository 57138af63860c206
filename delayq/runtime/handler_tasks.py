"""A consumer's handler tasks: started cheaply, owned, and cancelled and awaited on close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

__all__ = ["HandlerTasks", "cancel_unless_shielded"]

# the consumer's logger: these records are about its handlers
log = logging.getLogger("delayq.consumer")


# while a task is inside anyio.CancelScope(shield=True), a cancel waits this long between looks
_SHIELD_RECHECK = 0.02


def cancel_unless_shielded(
    task: asyncio.Task[Any], settled: Callable[[asyncio.Task[Any]], bool] = lambda _: False
) -> None:
    """Cancel ``task`` now, or as soon as it leaves an ``anyio.CancelScope(shield=True)``;
    not at all once ``settled(task)`` (its handler returned: the outcome it is recording
    must not be cut off, as :meth:`HandlerTasks.cancel_and_wait` spares it too).

    A native ``Task.cancel()`` is not held back by anyio's shield, so a handler's shielded
    critical section would be cut in half: this looks at the task's anyio cancel scopes
    first (anyio's asyncio backend keeps the innermost one per task) and, while one of
    them shields, looks again shortly after. No extra work per event: only a cancel pays.
    """
    if task.done() or settled(task):
        return
    if _shielded(task):
        asyncio.get_running_loop().call_later(
            _SHIELD_RECHECK, cancel_unless_shielded, task, settled
        )
        return
    task.cancel()


def _shielded(task: asyncio.Task[Any]) -> bool:
    try:
        from anyio._backends._asyncio import _task_states
    except ImportError:  # another anyio layout: cancel at once
        return False
    scope = getattr(_task_states.get(task), "cancel_scope", None)
    while scope is not None:
        if getattr(scope, "_shield", False):
            return True
        scope = getattr(scope, "_parent_scope", None)
    return False


class HandlerTasks:
    """A consumer's handler tasks: one plain asyncio task per delivery.

    Starting an asyncio task costs a fraction of starting an anyio task-group
    child (no cancel scope and task record per task), which shows at tens of
    thousands of events per second. The consumer still owns every one:
    whatever runs when it ends is cancelled and awaited.
    """

    def __init__(self, type_name: str):
        self._type_name = type_name
        self._tasks: set[asyncio.Task[None]] = set()
        # tasks whose handler has returned and which are recording the outcome
        self._settling: set[asyncio.Task[None]] = set()
        # the loop of the first task (one loop lookup per consumer run, not per event)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._plain = False
        self._on_done = self._done  # bound once

    def start_soon(
        self, func: Callable[..., Coroutine[Any, Any, None]], *args: Any
    ) -> asyncio.Task[None]:
        """Start ``func(*args)`` in a new task (it copies the current context, as anyio does);
        return the task (the consumer cancels it when its run is cancelled)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            # without a task factory loop.create_task makes exactly this Task; build it
            # directly, one Python call fewer per event
            self._plain = loop.get_task_factory() is None and type(loop).create_task is (
                asyncio.BaseEventLoop.create_task
            )
        if self._plain:
            task: asyncio.Task[None] = asyncio.Task(func(*args), loop=loop)
        else:
            task = loop.create_task(func(*args))
        self._tasks.add(task)
        task.add_done_callback(self._on_done)
        return task

    def settling(self) -> None:
        """Mark the calling task as past its handler: a drain lets it finish recording.

        Only needed before an ``await`` that records the outcome (a failure): a
        task that acks after its handler returns does so without awaiting, so a
        cancel cannot land between its handler and its ack.
        """
        task = asyncio.current_task()
        if task in self._tasks:
            self._settling.add(task)

    def settled(self, task: asyncio.Task[Any]) -> bool:
        """True when ``task``'s handler has returned and it is recording the outcome."""
        return task in self._settling

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._settling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: a handler task failed", self._type_name, exc_info=task.exception())

    async def cancel_and_wait(self, timeout: float = 10.0) -> None:
        """Cancel the handlers still running and wait (up to ``timeout``) until all tasks end.

        A task whose handler already returned is not cancelled: the outcome it
        is recording (a failure and its retry time) must reach Redis. After
        ``timeout`` every task left is cancelled.
        """
        if not self._tasks:
            return
        for task in self._tasks - self._settling:
            task.cancel()
        with anyio.move_on_after(timeout, shield=True):
            await asyncio.wait(set(self._tasks))
        if self._tasks:
            for task in self._tasks:
                task.cancel()
            with anyio.move_on_after(1.0, shield=True):
                await asyncio.wait(set(self._tasks))
