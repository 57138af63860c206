"""The options a :class:`~delayq.runtime.consumer.Consumer` needs, with a group's overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..options import check_timeout
from ..retry import Backoff

__all__ = ["ConsumerSettings"]


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """The service options a consumer needs."""

    visibility_ms: int
    polling_timeout: float
    retry_attempts: int
    retry_backoff: Backoff
    handler_timeout: float | None
    shutdown_grace: float

    def overridden(
        self,
        retry_attempts: int | None,
        retry_backoff: Backoff | None,
        handler_timeout: float | timedelta | None = None,
    ) -> ConsumerSettings:
        """These settings with a handler's (a delivery group's) overrides, checked."""
        changes: dict[str, Any] = {}
        if handler_timeout is not None:
            changes["handler_timeout"] = check_timeout(handler_timeout)
        if retry_attempts is not None:
            if (
                not isinstance(retry_attempts, int)
                or isinstance(retry_attempts, bool)
                or not 0 <= retry_attempts <= 1000
            ):
                raise ValueError(
                    f"retry_attempts must be an int from 0 to 1000, not {retry_attempts!r}"
                )
            changes["retry_attempts"] = retry_attempts
        if retry_backoff is not None:
            if not callable(retry_backoff):
                raise TypeError("retry_backoff must be a callable attempt -> seconds or timedelta")
            changes["retry_backoff"] = retry_backoff
        return dataclasses.replace(self, **changes) if changes else self
