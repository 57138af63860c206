"""Priority levels' values: the level of an event (0, the default, is the most urgent; 9 the
least) and the aging period that keeps low levels from starving. ``lua/claim.lua`` serves
the levels; see docs/guides/priorities.md."""

from __future__ import annotations

from ..keyspace.scripts import LEVELS

__all__ = ["LEVELS", "check_priority"]


def check_priority(priority: object) -> int:
    """``priority`` if it is a priority level (an int 0..9; 0 the most urgent), else
    ``ValueError``."""
    if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority < LEVELS:
        raise ValueError(f"priority must be an int from 0 (most urgent) to 9, not {priority!r}")
    return priority
