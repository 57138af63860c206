"""``wait_for``: poll a condition until it holds, with a timeout (no fixed sleeps in tests)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import anyio

T = TypeVar("T")

# --------------------------------------------------------------------------- waiting


class WaitTimeout(AssertionError, TimeoutError):
    """Raised by :func:`wait_for` when the condition did not become true in time.

    It is both an :class:`AssertionError` (reported as a test failure by pytest) and a
    :class:`TimeoutError`.
    """


@overload
async def wait_for(
    predicate: Callable[[], Awaitable[T]],
    timeout: float = ...,
    interval: float = ...,
    message: str | None = ...,
) -> T: ...


@overload
async def wait_for(
    predicate: Callable[[], T],
    timeout: float = ...,
    interval: float = ...,
    message: str | None = ...,
) -> T: ...


async def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.01,
    message: str | None = None,
) -> Any:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    ``predicate`` may be a plain or an async callable. It is evaluated immediately, then every
    ``interval`` seconds (using :func:`anyio.sleep`, so it works under asyncio and trio) until
    ``timeout`` seconds have passed; one last evaluation happens at the deadline.

    Raises:
        WaitTimeout: if the value never became truthy; its message includes ``message`` (or the
            predicate's name) and the last value seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__qualname__", repr(predicate))
            raise WaitTimeout(
                f"condition not met within {timeout:g}s: {what} (last value: {value!r})"
            )
        await anyio.sleep(min(interval, max(0.0, deadline - time.monotonic())))
