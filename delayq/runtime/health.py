"""What a process supervisor or an orchestrator's probes need to know about a service."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ServiceHealth"]


@dataclass(frozen=True, slots=True)
class ServiceHealth:
    """The state of one :class:`~delayq.EventService`, from :meth:`EventService.health`."""

    started: bool
    """``start()`` has run and the service's tasks are still running (they keep running
    while ``aclose()`` drains)."""
    accepting: bool
    """Started and not closing: its consumers still fetch new events."""
    redis_ok: bool
    """Redis answered a command within the timeout."""
    redis_error: str | None
    """Why Redis did not answer, if it did not."""
    loops: Mapping[str, bool]
    """Each background loop (``"scheduler"``, ``"consumer:<type>"``) -> running right now
    (False while a crashed loop waits to be restarted)."""

    @property
    def alive(self) -> bool:
        """For a liveness probe: the service's tasks run (draining counts as alive)."""
        return self.started

    @property
    def ready(self) -> bool:
        """For a readiness probe: accepting work, Redis reachable, every loop running."""
        return self.accepting and self.redis_ok and all(self.loops.values())

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON-able fields."""
        return {
            "alive": self.alive,
            "ready": self.ready,
            "started": self.started,
            "accepting": self.accepting,
            "redis_ok": self.redis_ok,
            "redis_error": self.redis_error,
            "loops": dict(self.loops),
        }
