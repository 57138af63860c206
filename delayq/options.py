"""The service's options: defaults, validation, and the clear errors bad values get."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from .codec import Serializer
from .durations import delay_seconds, seconds_to_ms
from .metrics import Metrics, NoopMetrics, as_metrics
from .observer import Tracing
from .retry import Backoff, exponential

__all__ = ["Options"]

log = logging.getLogger("delayq.options")


def _seconds(name: str, value: Any, *, low: float, high: float) -> float:
    seconds = delay_seconds(value, name)
    if not low <= seconds <= high:
        raise ValueError(f"{name} must be between {low} and {high} seconds, not {value!r}")
    return seconds


def check_timeout(value: Any, what: str = "timeout") -> float:
    """A handler timeout (timedelta or seconds) as seconds from 0.001 to 7 days, or raise
    ``TypeError``/``ValueError``."""
    return _seconds(what, value, low=0.001, high=7 * 24 * 3600.0)


def _int(name: str, value: Any, *, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, not {value!r}")
    return value


@dataclass(frozen=True)
class Options:
    """Validated options of an :class:`~delayq.EventService` (docs/guides/configuration.md describes each)."""

    prefix: str = "delayq"
    retry_attempts: int = 3
    retry_backoff: Backoff = field(default_factory=exponential)
    visibility_timeout: float = 15.0
    handler_timeout: float | None = None
    scheduling_interval: float = 1.0
    scheduling_batch_size: int = 250
    enable_scheduling: bool = True
    polling_timeout: float = 5.0
    lock_timeout: float = 10.0
    takeover_delay: float = 0.5
    serializer: Serializer = "msgpack"
    max_payload_bytes: int = 512 * 1024
    metrics: Metrics = field(default_factory=NoopMetrics)
    tracing: Tracing | None = None
    shutdown_grace: float = 10.0
    heartbeat_interval: float = 5.0
    history_interval: float = 10.0
    outbox: Callable[[Any], AbstractAsyncContextManager[Any]] | None = None
    min_replicas: int = 0
    replica_timeout: float = 1.0

    @classmethod
    def build(cls, **kwargs: Any) -> Options:
        """Validate keyword options; raise ``TypeError``/``ValueError`` naming the bad one."""
        names = set(cls.__dataclass_fields__)
        unknown = set(kwargs) - names
        if unknown:
            raise TypeError(
                f"unknown EventService options: {sorted(unknown)}; known: {sorted(names)}"
            )
        opts: dict[str, Any] = {
            k: v for k, v in kwargs.items() if v is not None or k in ("handler_timeout", "outbox")
        }
        from .events import validate_name

        if "prefix" in opts:
            validate_name(opts["prefix"], "prefix")
        if "retry_attempts" in opts:
            _int("retry_attempts", opts["retry_attempts"], low=0, high=1000)
        if "retry_backoff" in opts and not callable(opts["retry_backoff"]):
            raise TypeError("retry_backoff must be a callable attempt -> seconds or timedelta")
        for name, low, high in (
            ("visibility_timeout", 1.0, 24 * 3600.0),
            ("scheduling_interval", 0.01, 3600.0),
            ("polling_timeout", 0.05, 300.0),
            ("lock_timeout", 0.5, 3600.0),
            ("takeover_delay", 0.05, 600.0),
            ("shutdown_grace", 0.0, 3600.0),
            ("replica_timeout", 0.001, 60.0),
        ):
            if name in opts:
                opts[name] = _seconds(name, opts[name], low=low, high=high)
        for name in ("heartbeat_interval", "history_interval"):
            # 0 turns the worker heartbeat / the history off
            if name in opts and opts[name] != 0:
                opts[name] = _seconds(name, opts[name], low=0.05, high=3600.0)
        if opts.get("handler_timeout") is not None:
            opts["handler_timeout"] = check_timeout(opts["handler_timeout"], "handler_timeout")
        if "scheduling_batch_size" in opts:
            _int("scheduling_batch_size", opts["scheduling_batch_size"], low=1, high=2000)
        if opts.get("outbox") is not None and not callable(opts["outbox"]):
            raise TypeError(
                "outbox must be made by delayq.postgres.outbox_relay(dsn, ...) (a callable "
                "taking the service and returning an async context manager)"
            )
        if "min_replicas" in opts:
            _int("min_replicas", opts["min_replicas"], low=0, high=64)
        if "max_payload_bytes" in opts:
            _int("max_payload_bytes", opts["max_payload_bytes"], low=64, high=512 * 1024 * 1024)
        if "enable_scheduling" in opts and not isinstance(opts["enable_scheduling"], bool):
            raise TypeError("enable_scheduling must be a bool")
        if opts.get("serializer", "msgpack") not in ("json", "msgpack"):
            raise ValueError(f"serializer must be 'json' or 'msgpack', not {opts['serializer']!r}")
        if opts.get("metrics") is not None:
            # a sink without observe() (written before it existed) is wrapped, not refused
            opts["metrics"] = as_metrics(opts["metrics"])
        if "tracing" in opts:
            opts["tracing"] = _tracing(opts["tracing"])
        built = cls(**opts)
        if built.lock_timeout <= built.scheduling_interval and "lock_timeout" in opts:
            raise ValueError("lock_timeout must be longer than scheduling_interval")
        return built

    @property
    def visibility_ms(self) -> int:
        """The visibility timeout in whole ms."""
        return seconds_to_ms(self.visibility_timeout)

    @property
    def replica_timeout_ms(self) -> int:
        """The replica timeout in whole ms (at least 1: ``WAIT`` with 0 would block forever)."""
        return max(1, seconds_to_ms(self.replica_timeout))

    @property
    def lock_ms(self) -> int:
        """The scheduler lock's time to live in ms, never shorter than two sweeps."""
        return seconds_to_ms(max(self.lock_timeout, 2 * self.scheduling_interval))


def _tracing(value: Any) -> Tracing | None:
    """``tracing=True`` means OpenTelemetry, when it is installed; an object is used as given."""
    if value is False:
        return None
    if value is True:
        try:
            from .otel import OTelTracing
        except ImportError:
            log.info("tracing=True but opentelemetry-api is not installed: tracing stays off")
            return None
        return OTelTracing()
    if not isinstance(value, Tracing):
        raise TypeError(
            "tracing must be True, False or an object with sending/handling/handled "
            f"methods (such as delayq.otel.OTelTracing()), not {value!r}"
        )
    return value
