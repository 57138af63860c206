"""Durations on the command line: ``250ms``, ``30s``, ``5m``, ``3h``, ``2d`` or plain seconds."""

from __future__ import annotations

import math
import re

__all__ = ["parse_duration"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$"


def parse_duration(text: str) -> float:
    """Seconds in ``text``; raise ``ValueError`` with a one-line reason when it is not a duration.

    A number alone means seconds. Negative, infinite and NaN values are refused.
    """
    match = re.match(_PATTERN, text)
    if match is None:
        raise ValueError(
            f"not a duration: {text!r} (use e.g. 250ms, 30s, 5m, 3h, 2d or plain seconds)"
        )
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not math.isfinite(seconds):
        raise ValueError(f"duration out of range: {text!r}")
    return seconds
