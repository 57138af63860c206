"""The metrics interface: counters and gauges the service reports.

Pass any object with ``increment`` and ``gauge`` methods as ``metrics=`` to
feed Prometheus, StatsD or OpenTelemetry. Names reported:

counters: ``enqueued``, ``kept``, ``replaced``, ``cancelled``, ``moved``,
``delivered``, ``succeeded``, ``failed``, ``retried``, ``dead_lettered``,
``decode_errors``, ``leases_lost``, ``redis_errors``
gauges: ``in_flight``, ``lateness_ms`` (of the latest delivery)

Every call carries ``event_type`` (the wire name, or ``""`` for the scheduler).
Calls made for a named delivery group (``add_handler(..., group="audit")``)
also carry ``group="audit"`` when the sink's methods accept a ``group``
keyword; a sink without it gets ``event_type="<type>:<group>"`` instead (see
``delayq.groups.GroupMetrics``). The default group's calls never carry it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol, runtime_checkable

__all__ = ["InMemoryMetrics", "Metrics", "NoopMetrics"]


@runtime_checkable
class Metrics(Protocol):
    """What a metrics sink must provide."""

    def increment(self, name: str, value: int = 1, *, event_type: str = "") -> None:
        """Add ``value`` to the counter ``name``."""

    def gauge(self, name: str, value: float, *, event_type: str = "") -> None:
        """Set the gauge ``name`` to ``value``."""


class NoopMetrics:
    """The default sink: records nothing."""

    def increment(self, name: str, value: int = 1, *, event_type: str = "") -> None:
        """Do nothing."""

    def gauge(self, name: str, value: float, *, event_type: str = "") -> None:
        """Do nothing."""


class InMemoryMetrics:
    """Keeps counters and gauges in dicts; handy in tests and the demo.

    ``counters`` sums every group of a type; ``group_counters`` keeps the
    calls made for named groups by ``(name, event_type, group)``.
    """

    def __init__(self) -> None:
        self.counters: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.gauges: dict[tuple[str, str], float] = {}
        self.group_counters: defaultdict[tuple[str, str, str], int] = defaultdict(int)

    def increment(
        self, name: str, value: int = 1, *, event_type: str = "", group: str = ""
    ) -> None:
        """Add ``value`` to the counter ``(name, event_type)`` (and its group's)."""
        self.counters[name, event_type] += value
        if group:
            self.group_counters[name, event_type, group] += value

    def gauge(self, name: str, value: float, *, event_type: str = "", group: str = "") -> None:
        """Set the gauge ``(name, event_type)``, or ``(name, "<type>:<group>")`` for a group."""
        self.gauges[name, f"{event_type}:{group}" if group else event_type] = value

    def total(self, name: str) -> int:
        """The counter ``name`` summed over event types."""
        return sum(v for (n, _), v in self.counters.items() if n == name)
