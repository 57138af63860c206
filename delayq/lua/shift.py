"""Scripts whose clock runs ahead of Redis's: the testing kit's time travel (``delayq.testing``).

Every script reads Redis's clock as ``redis.call('TIME')`` (``_clock.lua``, ``claim.lua``'s
``read_clock`` and the stand-alone scripts; ``tests/test_testing_clock.py`` checks that no
other form appears). :func:`shifted` replaces each such read with one that adds a fixed
offset, so that everything compared with the clock (due times, leases, backoffs, debounce
and ``unique_for`` marks, rate-limit buckets, schedule slots) sees a later time. The
offset is a constant of the source: production scripts, which never pass through here,
stay byte for byte what they were, and nothing is read per call.
"""

from __future__ import annotations

__all__ = ["TIME_CALL", "shifted"]

TIME_CALL = "redis.call('TIME')"
"""How every script reads Redis's clock."""

_READER = "delayq_shifted_time"


def shifted(source: str, offset_ms: int) -> str:
    """``source`` with every clock read moved ``offset_ms`` (>= 0) ahead; unchanged when
    the offset is 0 or the script reads no clock (then its SHA stays the same too)."""
    if offset_ms < 0:
        raise ValueError(f"a clock offset cannot be negative: {offset_ms}")
    if not offset_ms or TIME_CALL not in source:
        return source
    seconds, ms = divmod(offset_ms, 1000)
    # TIME's reply as numbers (every script passes it through tonumber), carried over
    # whole seconds; doubles hold these integers exactly
    reader = (
        f"local function {_READER}()\n"
        f"  local t = {TIME_CALL}\n"
        f"  local s, us = tonumber(t[1]) + {seconds}, tonumber(t[2]) + {ms * 1000}\n"
        "  if us >= 1000000 then s, us = s + 1, us - 1000000 end\n"
        "  return {s, us}\n"
        "end\n"
    )
    return reader + source.replace(TIME_CALL, f"{_READER}()")
