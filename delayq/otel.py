"""OpenTelemetry tracing for delayq (``pip install 'delayq[otel]'``): needs only opentelemetry-api.

Turn it on with ``EventService(..., tracing=True)`` (or pass an
:class:`OTelTracing` to choose the tracer provider or the parent mode). Spans
follow the OpenTelemetry messaging semantic conventions:

* ``send {event type}``, kind PRODUCER, around each enqueue call
  (``messaging.operation.type`` = ``send``). Its context is the message's
  *creation context*: the propagator (W3C ``traceparent``/``tracestate`` by
  default) writes it into the event context, which Redis keeps with the event.
  ``enqueue_many`` makes one span for the call (``messaging.batch.message_count``)
  and gives every event of the call its context. A context that already holds
  propagation keys (the caller's own creation context) is stored unchanged, and
  the send span links to it.
* ``process {event type}``, kind CONSUMER, around each handler run, one per
  attempt (``messaging.operation.type`` = ``process``,
  ``messaging.delayq.message.delivery_attempt``). It is the current span while
  the handler runs, so the handler's own spans nest under it. A failed run
  records the exception, ``error.type`` and status ERROR.

Producer → consumer: by default the process span starts a trace of its own and
*links* to the creation context, as the conventions advise: a delayed event is
handled minutes or days after the request that scheduled it, perhaps several
times, and a parent-child trace would stretch over all of that. With
``OTelTracing(parent=True)`` the process span is a *child* of the creation
context instead (and keeps the link), so producer and handler share one trace.
Baggage from the producer is visible to the handler in both modes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from . import __version__
from .context import PROPAGATION_KEYS, Delivery, hide_context_keys

__all__ = ["OTelTracing"]

_SYSTEM = "delayq"
_W3C_FIELDS = frozenset({"traceparent", "tracestate", "baggage"})
# W3C Trace Context: version-trace_id-parent_id-flags; later versions may append fields
_TRACEPARENT = r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?"
_EMPTY = otel_context.Context()


class OTelTracing:
    """The OpenTelemetry implementation of :class:`delayq.observer.Tracing`.

    ``tracer_provider``: the provider to take the tracer from (default: the
    global one, looked up when spans start). ``parent``: make each process span
    a child of its event's creation context rather than the root of a new trace
    (it links to the creation context either way).
    """

    def __init__(
        self, tracer_provider: trace.TracerProvider | None = None, *, parent: bool = False
    ):
        self._tracer = trace.get_tracer("delayq", __version__, tracer_provider=tracer_provider)
        self.parent = parent
        # the keys the configured propagator writes: they stay out of event_context()
        self._fields = PROPAGATION_KEYS | frozenset(propagate.get_global_textmap().fields)
        hide_context_keys(self._fields)
        self._textmap: Any = None
        self._plain_w3c = False

    def _w3c(self) -> bool:
        """True while the global propagator is W3C Trace Context (and Baggage) only.

        Then delayq writes and reads ``traceparent``/``tracestate`` itself, which
        costs a fraction of the generic propagator API on every event.
        """
        textmap = propagate.get_global_textmap()
        if textmap is not self._textmap:
            fields = set(textmap.fields)
            self._plain_w3c = "traceparent" in fields and fields <= _W3C_FIELDS
            self._textmap = textmap
        return self._plain_w3c

    def _inject(self, span: trace.Span, carrier: dict[str, str]) -> None:
        if self._w3c() and not baggage.get_all():
            sc = span.get_span_context()
            carrier["traceparent"] = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"
            if sc.trace_state:
                carrier["tracestate"] = sc.trace_state.to_header()
        else:
            propagate.inject(carrier, context=trace.set_span_in_context(span))

    def _extract(self, ctx: Mapping[str, str]) -> otel_context.Context:
        """The creation context stored in ``ctx``, in an otherwise empty context."""
        if self._w3c() and "baggage" not in ctx:
            match = re.fullmatch(_TRACEPARENT, ctx.get("traceparent", ""))
            if match is None or match[1] == "ff" or (match[1] == "00" and match[5]):
                return _EMPTY
            trace_id, span_id = int(match[2], 16), int(match[3], 16)
            if not trace_id or not span_id:
                return _EMPTY
            state = ctx.get("tracestate")
            span_context = SpanContext(
                trace_id,
                span_id,
                is_remote=True,
                trace_flags=TraceFlags(int(match[4], 16)),
                trace_state=TraceState.from_header([state]) if state else None,
            )
            return trace.set_span_in_context(NonRecordingSpan(span_context), _EMPTY)
        # extract into an empty context: the consumer's ambient context is not the parent
        return propagate.extract(ctx, context=otel_context.Context())

    # -- producer ----------------------------------------------------------------------

    @contextmanager
    def sending(
        self,
        type_names: Sequence[str],
        event_id: str | None,
        count: int,
        context: Mapping[str, str] | None,
    ) -> Iterator[Mapping[str, str] | None]:
        """The PRODUCER span of one enqueue call; yields the context to store with the events."""
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
        custom = context is not None and not self._fields.isdisjoint(context)
        if custom:
            assert context is not None
            given = trace.get_current_span(self._extract(context)).get_span_context()
            links = [Link(given)] if given.is_valid else None
        span = self._tracer.start_span(
            f"send {destination}" if destination else "send",
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            links=links,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            if custom or not span.get_span_context().is_valid:
                yield context
            else:
                carrier = dict(context) if context else {}
                self._inject(span, carrier)
                yield carrier
        except BaseException as exc:
            _failed(span, type(exc).__qualname__, str(exc), exc)
            raise
        finally:
            otel_context.detach(token)
            span.end()

    # -- consumer ----------------------------------------------------------------------

    def handling(self, delivery: Delivery) -> Any:
        """Start the CONSUMER span of one handler run and make it current."""
        ctx = delivery.context
        extracted = self._extract(ctx) if ctx and not self._fields.isdisjoint(ctx) else _EMPTY
        creation = trace.get_current_span(extracted).get_span_context()
        attributes: dict[str, Any] = {
            "messaging.system": _SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": delivery.event_type,
            "messaging.message.id": delivery.id,
            "messaging.delayq.message.delivery_attempt": delivery.attempt,
        }
        lateness = delivery.lateness_ms
        if lateness is not None:
            attributes["messaging.delayq.message.lateness_ms"] = lateness
        if creation.is_valid:
            parent = (
                extracted
                if self.parent
                else trace.set_span_in_context(trace.INVALID_SPAN, extracted)
            )
            links = [Link(creation)]
        else:
            parent, links = extracted, None
        span = self._tracer.start_span(
            f"process {delivery.event_type}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
        )
        # current while the handler runs; the extracted baggage comes along
        token = otel_context.attach(trace.set_span_in_context(span, extracted))
        return span, token

    def handled(
        self, state: Any, outcome: str, failure: str | None, error: BaseException | None
    ) -> None:
        """End the span started by :meth:`handling`: status ERROR unless the handler succeeded."""
        span, token = state
        try:
            if outcome != "success":
                if error is not None:
                    kind = type(error).__qualname__
                else:
                    kind = (failure or outcome).split(":", 1)[0]
                _failed(span, kind, failure or outcome, error)
        finally:
            otel_context.detach(token)
            span.end()


def _failed(span: trace.Span, kind: str, description: str, error: BaseException | None) -> None:
    if error is not None:
        span.record_exception(error)
    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, description[:1000]))
