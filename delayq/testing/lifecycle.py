"""What the private servers of :mod:`delayq.testing` share: the ``with`` protocol over
``start``/``close``, and stopping whatever is still running at interpreter exit."""

from __future__ import annotations

import atexit
import logging
import threading
from types import TracebackType
from typing import Any, Protocol, TypeVar

__all__ = ["Lifecycle", "LiveSet"]

logger = logging.getLogger("delayq.testing")

_T = TypeVar("_T", bound="Lifecycle")


class Lifecycle:
    """``with obj:`` starts it (closing it again if starting fails) and closes it after."""

    def start(self: _T) -> _T:
        """Start; return ``self``."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop and clean up."""
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        """Start and return ``self``."""
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close (see :meth:`close`)."""
        self.close()


class _Closable(Protocol):
    def close(self, timeout: float = ...) -> None: ...


class LiveSet:
    """Processes started and not yet closed; whatever is left is closed at interpreter exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: set[Any] = set()
        atexit.register(self._close_all)

    def add(self, item: _Closable) -> None:
        """Track ``item`` until :meth:`discard`."""
        with self._lock:
            self._items.add(item)

    def discard(self, item: _Closable) -> None:
        """Stop tracking ``item``."""
        with self._lock:
            self._items.discard(item)

    def _close_all(self) -> None:
        with self._lock:
            items = list(self._items)
        for item in items:
            try:
                item.close(timeout=2.0)
            except Exception:  # pragma: no cover - best effort at interpreter exit
                logger.exception("failed to clean up %r at exit", item)
