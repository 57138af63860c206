"""Flow limits of an event type (or one delivery group): their values, parsing and checks.

The limits live in Redis (``{p:T}:limits``, a HASH; a named group's in
``{p:T}:g:G:limits``) and are enforced by ``lua/claim.lua`` where events are
claimed, so every process obeys them at its next claim. This module only
turns what a user writes (``rate="100/s"``) into the fields stored there and
back. See docs/FLOW.md.

Stored fields (all optional; the key exists only while one of them is set):

=========== ================================================================
concurrency handlers in flight across the fleet (live leases), an int >= 1
rate_n      starts per period (the ``100`` of ``"100/s"``)
rate_ms     the period in ms
burst       starts allowed at once after an idle spell (the bucket size)
paused      ``1`` while the type (group) is paused
tat         GCRA state: the theoretical arrival time, ms on Redis's clock
t_*         on a partitioned type only: the limit the user set for the whole
            type (``t_concurrency``, ``t_rate_n``, ``t_rate_ms``, ``t_burst``);
            the plain fields then hold this partition's share
key_concurrency  per flow key: handlers in flight (live leases) of each key
key_rate_n, key_rate_ms, key_burst  per flow key: a rate like ``rate_n``...
channel, shard   where claim.lua publishes a scheduler wake-up for a key whose
            next per-key token is due (stored with a per-key rate)
aging       priority levels' aging period in ms: an entry ready for t ms is claimed
            as level max(0, level - t // aging) (docs/guides/priorities.md)
=========== ================================================================

**Partitioned types** (``partitions=N``): each partition is claimed on its own
cluster slot, so each partition's limits HASH holds a *share* of the type's
limit, and the shares add up to it (:func:`split_concurrency`,
:func:`split_rate`): the type-wide limit holds because each share holds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

__all__ = [
    "FlowLimits",
    "Rate",
    "aging_ms",
    "parse_rate",
    "shares",
    "split_concurrency",
    "split_rate",
]

_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "sec": 1000,
    "second": 1000,
    "m": 60_000,
    "min": 60_000,
    "minute": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
}
_RATE = re.compile(
    r"^\s*(\d+)\s*/\s*(\d*)\s*([a-z]+)\s*(?:,?\s*burst\s*=?\s*(\d+))?\s*$", re.IGNORECASE
)
# a limit beyond these is a typo, not a plan
_MAX_COUNT = 10_000_000
_MAX_PERIOD_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` handler starts per ``period_ms``, with a bucket of ``burst`` starts.

    A GCRA (a token bucket without a timer): starts are spaced
    ``period_ms / count`` apart on average, and after an idle spell up to
    ``burst`` may start at once. In any window of ``w`` ms at most
    ``burst + w * count / period_ms`` handlers start.
    """

    count: int
    period_ms: int
    burst: int

    def __post_init__(self) -> None:
        for name, value, top in (
            ("count", self.count, _MAX_COUNT),
            ("period_ms", self.period_ms, _MAX_PERIOD_MS),
            ("burst", self.burst, _MAX_COUNT),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
                raise ValueError(f"rate {name} must be an int from 1 to {top}, not {value!r}")

    @property
    def interval_ms(self) -> float:
        """The spacing of starts at the steady rate, in ms."""
        return self.period_ms / self.count

    def __str__(self) -> str:
        unit = {1000: "s", 60_000: "min", 3_600_000: "h"}.get(self.period_ms)
        period = unit if unit else f"{self.period_ms}ms"
        return f"{self.count}/{period} burst {self.burst}"


def default_burst(count: int, period_ms: int) -> int:
    """The bucket when none is given: the starts of 100 ms at the rate, at least 1."""
    return max(1, math.ceil(count * 100 / period_ms))


def parse_rate(value: str | Rate) -> Rate:
    """Read ``"100/s"``, ``"6000/min"``, ``"5/10s"``, ``"100/s burst 20"`` (or a :class:`Rate`).

    Units: ``ms``, ``s``, ``min``, ``h`` (and ``sec``, ``second``, ``m``,
    ``minute``, ``hour``); a number before the unit multiplies it. Without a
    burst the bucket holds 100 ms worth of starts, at least 1.
    """
    if isinstance(value, Rate):
        return value
    if not isinstance(value, str):
        raise TypeError(f"rate must be a string like '100/s' or a Rate, not {value!r}")
    m = _RATE.match(value)
    unit = m and _UNITS_MS.get(m.group(3).lower())
    if m is None or unit is None:
        raise ValueError(
            f"rate {value!r} is not like '100/s', '6000/min', '5/10s' or '100/s burst 20' "
            "(units: ms, s, min, h)"
        )
    count = int(m.group(1))
    period_ms = int(m.group(2) or 1) * unit
    burst = int(m.group(4)) if m.group(4) else default_burst(count, period_ms)
    return Rate(count, period_ms, burst)


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= _MAX_COUNT:
        raise ValueError(f"{name} must be an int from 1 to {_MAX_COUNT} (or None), not {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """The limits of one event type (or delivery group), as stored in Redis.

    ``concurrency``: handlers in flight across every process (None: no limit).
    ``rate``: handler starts per period across every process (None: no limit).
    ``paused``: no handler starts while True (see ``EventService.pause``).
    ``per_key_concurrency``, ``per_key_rate``: the same, for each flow key
    separately (docs/FLOW.md, "Flow keys"); ``per_key_concurrency=1`` runs
    each key's events one at a time, in order.
    ``priority_aging``: priority levels' anti-starvation period (None: strict
    priority); see docs/guides/priorities.md.
    """

    concurrency: int | None = None
    rate: Rate | None = None
    paused: bool = False
    per_key_concurrency: int | None = None
    per_key_rate: Rate | None = None
    priority_aging: timedelta | None = None

    @property
    def active(self) -> bool:
        """True when any limit is set (the limits key exists in Redis)."""
        return (
            self.concurrency is not None
            or self.rate is not None
            or self.paused
            or self.per_key_concurrency is not None
            or self.per_key_rate is not None
            or self.priority_aging is not None
        )

    def to_dict(self) -> dict[str, object]:
        """The limits as JSON-ready values (``rate`` as ``{count, period_ms, burst, text}``)."""

        def shown(rate: Rate | None) -> dict[str, object] | None:
            if rate is None:
                return None
            return {
                "count": rate.count,
                "period_ms": rate.period_ms,
                "burst": rate.burst,
                "text": str(rate),
            }

        return {
            "concurrency": self.concurrency,
            "rate": shown(self.rate),
            "paused": self.paused,
            "per_key_concurrency": self.per_key_concurrency,
            "per_key_rate": shown(self.per_key_rate),
            "priority_aging_ms": None
            if self.priority_aging is None
            else aging_ms(self.priority_aging),
        }

    def fields(self) -> dict[str, str]:
        """The HASH fields that store these limits (``tat`` is the script's)."""
        out: dict[str, str] = {}
        if self.concurrency is not None:
            out["concurrency"] = str(_positive("concurrency", self.concurrency))
        if self.rate is not None:
            out.update(_rate_fields(self.rate))
        if self.paused:
            out["paused"] = "1"
        if self.per_key_concurrency is not None:
            out["key_concurrency"] = str(_positive("per_key_concurrency", self.per_key_concurrency))
        if self.per_key_rate is not None:
            out.update(_rate_fields(self.per_key_rate, "key_"))
        if self.priority_aging is not None:
            out["aging"] = str(aging_ms(self.priority_aging))
        return out

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes] | dict[str, str]) -> FlowLimits:
        """The limits stored in a limits HASH (unreadable fields are ignored)."""
        f = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in fields.items()
        }

        def count(name: str) -> int | None:
            return int(f[name]) if f.get(name, "").isdigit() else None

        def rate(n: str, ms: str, burst: str) -> Rate | None:
            if all(f.get(k, "").isdigit() for k in (n, ms, burst)):
                try:
                    return Rate(int(f[n]), int(f[ms]), int(f[burst]))
                except ValueError:
                    return None
            return None

        # a partition's HASH holds its share and the type's figure (t_*): show the latter
        t = "t_" if "t_rate_n" in f else ""
        return cls(
            count("t_concurrency" if "t_concurrency" in f else "concurrency"),
            rate(t + "rate_n", t + "rate_ms", t + "burst"),
            f.get("paused") == "1",
            count("key_concurrency"),
            rate("key_rate_n", "key_rate_ms", "key_burst"),
            None if count("aging") is None else timedelta(milliseconds=count("aging") or 0),
        )


def _rate_fields(rate: Rate, prefix: str = "") -> dict[str, str]:
    """The limits HASH fields of ``rate``: ``rate_n``, ``rate_ms``, ``burst``, named with
    ``prefix`` (``key_``: the per-key rate; ``t_``: a partitioned type's whole rate)."""
    return {
        f"{prefix}rate_n": str(rate.count),
        f"{prefix}rate_ms": str(rate.period_ms),
        f"{prefix}burst": str(rate.burst),
    }


def aging_ms(value: Any) -> int:
    """``value`` (a positive timedelta of at most a day) as the aging period in whole ms;
    raises ValueError."""
    if not isinstance(value, timedelta):
        raise ValueError(f"priority_aging must be a timedelta, not {value!r}")
    ms = math.ceil(value.total_seconds() * 1000)
    if not 1 <= ms <= _MAX_PERIOD_MS:
        raise ValueError(f"priority_aging must be from 1 ms to a day, not {value!r}")
    return ms


def check_concurrency(value: Any) -> int | None:
    """``value`` as a fleet-wide concurrency limit (None removes it); raises ValueError."""
    return None if value is None else _positive("concurrency", value)


def shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` whole shares as equal as possible (the first ones take
    the remainder), adding up to ``total``."""
    q, r = divmod(total, parts)
    return [q + (1 if k < r else 0) for k in range(parts)]


_T_CONCURRENCY = {"t_concurrency": ""}
_T_RATE = {"t_rate_n": "", "t_rate_ms": "", "t_burst": ""}


def split_concurrency(value: int | None, parts: int) -> list[dict[str, str]]:
    """The limits HASH changes, one dict per shard (partition), for a type-wide concurrency.

    Each shard gets a share (:func:`shares`), at least 1, so the live leases of
    all shards never add up to more than ``value``. ``ValueError`` when
    ``value`` is below the shard count: a shard with share 0 would never run an
    event (ids are routed to partitions by hash, not by free slots).
    """
    if value is None:
        return [{"concurrency": "", **_T_CONCURRENCY} for _ in range(parts)]
    if parts == 1:
        return [{"concurrency": str(value), **_T_CONCURRENCY}]
    if value < parts:
        raise ValueError(
            f"concurrency {value} is below the type's {parts} partitions: a partitioned "
            "type's limit is split between its partitions (each claims on its own cluster "
            f"slot) and each needs at least 1; set at least {parts} (see docs/FLOW.md)"
        )
    return [{"concurrency": str(s), "t_concurrency": str(value)} for s in shares(value, parts)]


def split_rate(rate: Rate | None, parts: int) -> list[dict[str, str]]:
    """The limits HASH changes, one dict per shard (partition), for a type-wide rate.

    Each shard gets ``1/parts`` of the rate (the same count over a period
    ``parts`` times as long: no rounding, and no shard without tokens) and a share of
    the bucket; a shard's bucket must hold at least 1 start, so the bucket in
    force is ``max(burst, parts)`` (``limits()`` shows the burst as set).
    Summed over shards: in any window of ``w`` ms at most
    ``max(burst, parts) + w * count / period_ms`` starts.
    """
    if rate is None:
        return [
            {"rate_n": "", "rate_ms": "", "burst": "", "tat": "", **_T_RATE} for _ in range(parts)
        ]
    if parts == 1:
        return [{**_rate_fields(rate), **_T_RATE}]
    burst = max(rate.burst, parts)
    total = _rate_fields(rate, "t_")
    return [
        {
            "rate_n": str(rate.count),
            "rate_ms": str(rate.period_ms * parts),
            "burst": str(b),
            **total,
        }
        for b in shares(burst, parts)
    ]
