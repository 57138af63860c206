"""The PRODUCER spans of :mod:`delayq.otel`: one per enqueue call, one per schedule fire."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind

from ._conventions import _SYSTEM, _failed, _iso_ms


class _Tracing(Protocol):
    """What the spans use of :class:`delayq.otel.OTelTracing` (which imports this module)."""

    _tracer: trace.Tracer
    _noop: bool
    follow_sampling: bool

    def _inject(self, span: trace.Span, carrier: dict[str, str]) -> None: ...

    def _extract(self, ctx: Mapping[str, str]) -> otel_context.Context: ...


class _Sending:
    """The send span of one enqueue call, as a context manager (cheaper than a generator)."""

    __slots__ = ("_context", "_custom", "_span", "_token", "_tracing", "_what")

    def __init__(
        self,
        tracing: _Tracing,
        type_names: Sequence[str],
        event_id: str | None,
        count: int,
        context: Mapping[str, str] | None,
        custom: bool,
    ):
        self._tracing = tracing
        self._what = (type_names, event_id, count)
        self._context = context
        self._custom = custom

    def __enter__(self) -> Mapping[str, str] | None:
        tracing, context = self._tracing, self._context
        if tracing._noop and not self._custom:  # no attributes: the no-op tracer drops them
            span = self._span = tracing._tracer.start_span("send")
            return self._attached(span)
        type_names, event_id, count = self._what
        destination = type_names[0] if len(type_names) == 1 else None
        attributes: dict[str, Any] = {
            "messaging.system": _SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if destination:
            attributes["messaging.destination.name"] = destination
        if event_id is not None:
            attributes["messaging.message.id"] = event_id
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        links = None
        if self._custom:
            assert context is not None
            given = trace.get_current_span(tracing._extract(context)).get_span_context()
            links = [Link(given)] if given.is_valid else None
        span = self._span = tracing._tracer.start_span(
            f"send {destination}" if destination else "send",
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            links=links,
        )
        if self._custom:
            self._token = otel_context.attach(trace.set_span_in_context(span))
            return context
        return self._attached(span)

    def _attached(self, span: trace.Span) -> Mapping[str, str] | None:
        """Make ``span`` current; the context to store: the given one with its carrier."""
        self._token = otel_context.attach(trace.set_span_in_context(span))
        context = self._context
        if not span.get_span_context().is_valid:
            return context
        carrier = dict(context) if context else {}
        self._tracing._inject(span, carrier)
        return carrier

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self._span
        try:
            if exc is not None:
                _failed(span, type(exc).__qualname__, str(exc), exc)
        finally:
            otel_context.detach(self._token)
            span.end()


class _Firing:
    """The send spans of a batch of schedule fires (not made current: none nests in another)."""

    __slots__ = ("_spans", "carriers")

    def __init__(
        self,
        tracing: _Tracing,
        type_name: str,
        fires: Sequence[tuple[str, str, int]],
        trigger: bool,
    ):
        self._spans: list[trace.Span] = []
        current = trace.get_current_span()
        sc = current.get_span_context()
        if (
            tracing.follow_sampling
            and sc.is_valid
            and not sc.trace_flags.sampled
            and not current.is_recording()
        ):
            # a trigger inside an unsampled trace: no spans; the fires carry that context
            carrier: dict[str, str] = {}
            tracing._inject(current, carrier)
            self.carriers: Sequence[Mapping[str, str] | None] = [carrier] * len(fires)
            return
        tracer = tracing._tracer
        name = f"send {type_name}"
        carriers: list[Mapping[str, str] | None] = []
        for event_id, schedule, slot_ms in fires:
            attributes: dict[str, Any] = {
                "messaging.system": _SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.destination.name": type_name,
                "messaging.message.id": event_id,
                "messaging.delayq.schedule.name": schedule,
                "messaging.delayq.schedule.slot": _iso_ms(slot_ms),
            }
            if trigger:
                attributes["messaging.delayq.schedule.trigger"] = True
            span = tracer.start_span(name, kind=SpanKind.PRODUCER, attributes=attributes)
            self._spans.append(span)
            if span.get_span_context().is_valid:
                carrier = {}
                tracing._inject(span, carrier)
                carriers.append(carrier)
            else:
                carriers.append(None)
        self.carriers = carriers

    def end(self, outcomes: Sequence[str] | None, error: BaseException | None) -> None:
        """End every span, with its fire's outcome or the batch's error."""
        for i, span in enumerate(self._spans):
            try:
                if error is not None:
                    _failed(span, type(error).__qualname__, str(error), error)
                elif outcomes is not None:
                    span.set_attribute("messaging.delayq.schedule.outcome", outcomes[i])
            finally:
                span.end()
