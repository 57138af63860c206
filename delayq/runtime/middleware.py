"""Middleware around handler runs (``service.use``): checked once, composed once per change.

A middleware is either ``async def mw(delivery, call_next)`` (``await call_next()`` runs
the rest of the chain and returns the handler's result) or a factory called with the
delivery that returns an async context manager (``contextlib.asynccontextmanager``).
The first added is the outermost. The consumer asks :meth:`Pipeline.chain` only while
one is added: with none, a run has no extra frame.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from ..context import Delivery

__all__ = ["CallNext", "Chain", "Middleware", "Pipeline"]

CallNext = Callable[[], Awaitable[Any]]
"""What a call-style middleware awaits to run the rest of the chain and the handler."""

Middleware = (
    Callable[[Delivery, CallNext], Awaitable[Any]]
    | Callable[[Delivery], AbstractAsyncContextManager[Any]]
)
"""``async def mw(delivery, call_next)`` or ``mw(delivery) -> async context manager``."""

Chain = Callable[[Delivery, Any], Awaitable[Any]]
"""A handler with the middleware around it: ``await chain(delivery, event)``."""


class Pipeline:
    """The service's middleware, shared by its consumers (added to, never removed from)."""

    def __init__(self) -> None:
        self.items: list[tuple[bool, Any]] = []  # (call style, middleware), outermost first

    def add(self, middleware: Any) -> None:
        """Check and append ``middleware`` (it becomes the innermost so far)."""
        if not callable(middleware):
            raise TypeError(f"a middleware must be callable, not {middleware!r}")
        call_style = inspect.iscoroutinefunction(middleware) or inspect.iscoroutinefunction(
            getattr(middleware, "__call__", None)  # noqa: B004
        )
        if call_style:
            params = _positional_count(middleware)
            if params is not None and params != 2:
                raise TypeError(
                    "an async middleware takes (delivery, call_next); "
                    f"{middleware!r} takes {params} arguments"
                )
        self.items.append((call_style, middleware))

    def chain(self, handler: Callable[[Any], Awaitable[Any]]) -> Chain:
        """``handler`` wrapped in every middleware added so far, the first outermost."""

        async def innermost(delivery: Delivery, event: Any) -> Any:
            return await handler(event)

        call: Chain = innermost
        for call_style, middleware in reversed(self.items):
            call = _around(middleware, call) if call_style else _within(middleware, call)
        return call


def _around(middleware: Any, inner: Chain) -> Chain:
    async def step(delivery: Delivery, event: Any) -> Any:
        return await middleware(delivery, lambda: inner(delivery, event))

    return step


def _within(factory: Any, inner: Chain) -> Chain:
    async def step(delivery: Delivery, event: Any) -> Any:
        manager = factory(delivery)
        if not hasattr(manager, "__aenter__"):
            raise TypeError(
                f"middleware {factory!r} returned {manager!r}, not an async context manager"
            )
        async with manager:
            return await inner(delivery, event)

    return step


def _positional_count(func: Any) -> int | None:
    """How many positional parameters ``func`` takes (None: any number, or unknown)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    count = 0
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            return None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            count += 1
    return count
