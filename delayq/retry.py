"""Backoff policies: how long a failed event waits before its next delivery.

A policy is any callable ``attempt -> seconds | timedelta`` where ``attempt``
is the number of failed deliveries so far (1 after the first failure). The conversions
of durations to ms (``delay_ms`` ...) live in :mod:`delayq.durations`; they stay
importable here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import timedelta

from .durations import delay_ms, delay_seconds, due_unix_ms

__all__ = ["Backoff", "delay_ms", "delay_seconds", "due_unix_ms", "exponential", "fixed"]

Backoff = Callable[[int], "float | timedelta"]
"""A retry policy: failed deliveries so far (1 after the first) -> seconds or timedelta to wait."""


def fixed(delay: float | timedelta) -> Backoff:
    """Wait the same ``delay`` before every retry."""
    seconds = delay_seconds(delay, "fixed backoff delay")

    def backoff(attempt: int) -> float:
        return seconds

    return backoff


def exponential(
    base: float | timedelta = 1.0,
    factor: float = 2.0,
    max_delay: float | timedelta = 300.0,
    jitter: float = 0.2,
) -> Backoff:
    """Wait ``base * factor ** (attempt - 1)``, capped at ``max_delay``.

    ``jitter`` spreads each delay uniformly over ``±jitter`` of itself (0.2 means
    80%..120%), so events that failed together do not all come back together.
    """
    first = delay_seconds(base, "exponential backoff base")
    cap = delay_seconds(max_delay, "exponential backoff max_delay")
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor >= 1):
        raise ValueError(f"factor must be a finite number >= 1, not {factor!r}")
    if not (isinstance(jitter, (int, float)) and 0 <= jitter <= 1):
        raise ValueError(f"jitter must be between 0 and 1, not {jitter!r}")

    def backoff(attempt: int) -> float:
        exponent = max(0, attempt - 1)
        # factor ** exponent overflows for large attempts; the cap wins anyway
        raw = cap if exponent > 1000 else min(cap, first * factor**exponent)
        if jitter:
            raw *= 1 + random.uniform(-jitter, jitter)
        return min(cap, max(0.0, raw))

    return backoff
