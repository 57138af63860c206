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
* a **schedule fire** (:mod:`delayq.schedules`) gets the same ``send {event type}``
  PRODUCER span, with ``messaging.delayq.schedule.name``,
  ``messaging.delayq.schedule.slot`` (the nominal slot, ISO 8601 UTC; the
  trigger time for ``trigger_schedule``, which also sets
  ``messaging.delayq.schedule.trigger``) and, once written,
  ``messaging.delayq.schedule.outcome`` (``fired``, ``kept``, ``skipped``,
  ``buffered``, ``done``...: a racing process or the overlap policy may write
  nothing). One span per fire, started before the fire script and ended after
  it; the fire's event carries its context like an enqueued one. Fires made by
  the firing loop start traces of their own; a trigger's span is a child of
  the caller's current span.
* ``process {event type}``, kind CONSUMER, around each handler run, one per
  attempt (``messaging.operation.type`` = ``process``,
  ``messaging.delayq.message.delivery_attempt``, and for a handler of a named
  delivery group ``messaging.consumer.group.name``). It is the current span while
  the handler runs, so the handler's own spans nest under it. A failed run
  records the exception, ``error.type`` and status ERROR.

Producer → consumer: by default the process span starts a trace of its own and
*links* to the creation context, as the conventions advise: a delayed event is
handled minutes or days after the request that scheduled it, perhaps several
times, and a parent-child trace would stretch over all of that. With
``OTelTracing(parent=True)`` the process span is a *child* of the creation
context instead (and keeps the link), so producer and handler share one trace.
Baggage from the producer is visible to the handler in both modes.

Sampling (``follow_sampling=True``, the default): what was dropped where the
event was created stays dropped. A handler run whose creation context was not
sampled gets no span (the creation context is made current instead, so the
handler's own spans are dropped by ``ParentBased`` samplers too), and an
enqueue inside an unsampled trace gets no send span but stores that trace's
context; what is dropped costs about a microsecond instead of a span. A
*sampled* creation context does not force the handler's span, though: in the
default link mode the process span is the root of a new trace, so the
sampler's root rule decides it afresh (``ParentBased(TraceIdRatioBased(r))``
keeps about ``r`` of them), and a trace is not kept or dropped whole. With
``parent=True`` the process span is a child of the creation context, and a
``ParentBased`` sampler keeps or drops the whole trace, from the request
through the delay to the handler. Events without a creation context (enqueued
with tracing off, or by a tool) leave each run to the configured sampler, as
``follow_sampling=False`` does for every run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timezone
from types import TracebackType
from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from ._version import __version__
from .context import PROPAGATION_KEYS, Delivery, hide_context_keys
from .keys import DEFAULT_GROUP

__all__ = ["OTelTracing"]

_SYSTEM = "delayq"
_W3C_FIELDS = frozenset({"traceparent", "tracestate", "baggage"})
# W3C Trace Context: version-trace_id-parent_id-flags; later versions may append fields
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
# the last hex digit of the flags of a version-00 traceparent when "sampled" (bit 0) is off
_UNSAMPLED_DIGITS = frozenset("02468ace")
_EMPTY = otel_context.Context()


def _only_key(context: otel_context.Context) -> str:
    (key,) = context.keys()
    return key


# The context keys under which the API keeps the current span and the baggage, found
# through the public API: the unsampled paths read them straight from the context
# (one dict lookup instead of three calls each; they run for most traced events).
_SPAN_KEY = _only_key(trace.set_span_in_context(trace.INVALID_SPAN, _EMPTY))
_BAGGAGE_KEY = _only_key(baggage.set_baggage("k", "v", _EMPTY))
_INVALID_CURRENT = trace.set_span_in_context(trace.INVALID_SPAN, _EMPTY)


def _tuple_layout() -> bool:
    """True when a ``SpanContext`` is the tuple ``(trace_id, span_id, is_remote,
    trace_flags, trace_state, is_valid)``, as it has been since opentelemetry-api 1.0:
    its fields are then read by index, not through five properties."""
    probe = SpanContext(3, 5, False, TraceFlags(1))
    try:
        return (
            isinstance(probe, tuple)
            and (probe[0], probe[1], probe[3], probe[5]) == (3, 5, 1, True)
            and probe[4] is probe.trace_state
        )
    except Exception:  # pragma: no cover - another layout: use the properties
        return False


_TUPLE = _tuple_layout()
_DEFAULT_TRACE_STATE = trace.span.DEFAULT_TRACE_STATE


def _w3c_carrier(sc: SpanContext) -> dict[str, str]:
    """The W3C carrier (``traceparent``, ``tracestate`` when there is one) of ``sc``."""
    if _TUPLE:
        trace_id, span_id, _, flags, state, _ = sc
    else:  # pragma: no cover
        trace_id, span_id, flags, state = sc.trace_id, sc.span_id, sc.trace_flags, sc.trace_state
    # %-formatting: the quickest way to write two long hex ids, on every traced enqueue
    carrier = {"traceparent": "00-%032x-%016x-%02x" % (trace_id, span_id, flags)}  # noqa: UP031
    if state is not _DEFAULT_TRACE_STATE and state:
        carrier["tracestate"] = state.to_header()
    return carrier


def _span_context(traceparent: str, tracestate: str | None) -> SpanContext:
    """The remote span context of a W3C ``traceparent``; invalid if it does not parse."""
    match = _TRACEPARENT.fullmatch(traceparent)
    if match is None or match[1] == "ff" or (match[1] == "00" and match[5]):
        return INVALID_SPAN_CONTEXT
    trace_id, span_id = int(match[2], 16), int(match[3], 16)
    if not trace_id or not span_id:
        return INVALID_SPAN_CONTEXT
    return SpanContext(
        trace_id,
        span_id,
        is_remote=True,
        trace_flags=TraceFlags(int(match[4], 16)),
        trace_state=TraceState.from_header([tracestate]) if tracestate else None,
    )


class _Unsampled(NonRecordingSpan):
    """An unsampled creation context, current while its handler runs.

    It is parsed only if something asks for it (a span the handler starts, an
    enqueue it makes): most handlers of unsampled events never do.
    """

    def __init__(self, traceparent: str, tracestate: str | None):
        self._carrier = (traceparent, tracestate)
        self._parsed: SpanContext | None = None

    def get_span_context(self) -> SpanContext:
        """The creation context (parsed on first use)."""
        if self._parsed is None:
            self._parsed = _span_context(*self._carrier)
        return self._parsed

    def __repr__(self) -> str:
        return f"_Unsampled({self.get_span_context()!r})"


class OTelTracing:
    """The OpenTelemetry implementation of :class:`delayq.observer.Tracing`.

    ``tracer_provider``: the provider to take the tracer from (default: the
    global one, looked up when spans start). ``parent``: make each process span
    a child of its event's creation context rather than the root of a new trace
    (it links to the creation context either way). ``follow_sampling``: trace a
    handler run only when its creation context was sampled, and give no send
    span to an enqueue inside an unsampled trace (see the module's docs).
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        parent: bool = False,
        follow_sampling: bool = True,
    ):
        self._tracer = trace.get_tracer("delayq", __version__, tracer_provider=tracer_provider)
        # the API's no-op tracer never records: its spans need no name, attributes or links
        self._noop = type(self._tracer) is trace.NoOpTracer
        self.parent = parent
        self.follow_sampling = follow_sampling
        # the keys the configured propagator writes: they stay out of event_context()
        self._fields = PROPAGATION_KEYS | frozenset(propagate.get_global_textmap().fields)
        hide_context_keys(self._fields)
        self._textmap: Any = None
        self._plain_w3c = False
        # the unsampled span enqueues were last made under (a request's) and its carrier
        self._unsampled: tuple[trace.Span | None, dict[str, str]] = (None, {})

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
            carrier.update(_w3c_carrier(span.get_span_context()))
        else:
            propagate.inject(carrier, context=trace.set_span_in_context(span))

    def _extract(self, ctx: Mapping[str, str]) -> otel_context.Context:
        """The creation context stored in ``ctx``, in an otherwise empty context."""
        if self._w3c() and "baggage" not in ctx:
            span_context = _span_context(ctx.get("traceparent", ""), ctx.get("tracestate"))
            if not span_context.is_valid:
                return _EMPTY
            return trace.set_span_in_context(NonRecordingSpan(span_context), _EMPTY)
        # extract into an empty context: the consumer's ambient context is not the parent
        return propagate.extract(ctx, context=otel_context.Context())

    # -- producer ----------------------------------------------------------------------

    def sending(
        self,
        type_names: Sequence[str],
        event_id: str | None,
        count: int,
        context: Mapping[str, str] | None,
    ) -> AbstractContextManager[Mapping[str, str] | None]:
        """The PRODUCER span of one enqueue call; yields the context to store with the events."""
        custom = context is not None and not self._fields.isdisjoint(context)
        if not custom:
            stored = self.context_without_span(context)
            if stored is not None:  # a copy: the caller may change what it is given
                return nullcontext(dict(stored))
        return _Sending(self, type_names, event_id, count, context, custom)

    def context_without_span(self, context: Mapping[str, str] | None) -> dict[str, str] | None:
        """The context to store with an enqueue that needs no send span; ``None`` when
        :meth:`sending` is to open one.

        An enqueue inside an unsampled trace (with ``follow_sampling``) gets no
        span: a ParentBased sampler would drop it, and the events carry the
        trace's context so that their handler runs are dropped too. Over the
        API's no-op tracer no enqueue inside a trace does: its send span would be
        a non-recording copy of the current span's context, which is what is
        stored. This is the enqueue path of nine traced requests in ten at 10 %
        sampling: the current context is read once, and the returned dict is new
        or the one kept for the current span, which the caller must not change
        (the codec copies it).
        """
        noop = self._noop
        if (not self.follow_sampling and not noop) or (
            context is not None and not self._fields.isdisjoint(context)
        ):
            return None
        now = otel_context.get_current()
        current: Any = now.get(_SPAN_KEY)
        if current is None:  # no trace: the send span is a root
            return None
        unsampled, stored = self._unsampled
        plain_w3c = propagate.get_global_textmap() is self._textmap and self._plain_w3c
        if current is not unsampled or not plain_w3c:
            sc = current.get_span_context()
            if _TUPLE:
                valid, flags = sc[5], sc[3]
            else:  # pragma: no cover
                valid, flags = sc.is_valid, sc.trace_flags
            if not valid or (
                not noop and (flags & TraceFlags.SAMPLED or current.is_recording())
            ):
                return None
            # a span's context never changes: the many enqueues of one unsampled
            # request (or handler run) write the same carrier
            if (plain_w3c or self._w3c()) and not now.get(_BAGGAGE_KEY):
                stored = _w3c_carrier(sc)
                self._unsampled = (current, stored)
            else:
                stored = {}
                propagate.inject(stored, context=now)
                if "baggage" not in stored:
                    self._unsampled = (current, stored)
        elif now.get(_BAGGAGE_KEY):  # baggage set since: the generic propagator writes it
            stored = {}
            propagate.inject(stored, context=now)
        return {**context, **stored} if context else stored

    def firing(
        self, type_name: str, fires: Sequence[tuple[str, str, int]], trigger: bool = False
    ) -> _Firing:
        """The PRODUCER spans of schedule fires ``(event id, schedule, slot ms)`` written in
        one call; their carriers go into the fires' event contexts."""
        return _Firing(self, type_name, fires, trigger)

    # -- consumer ----------------------------------------------------------------------

    def handling(self, delivery: Delivery) -> Any:
        """Start the CONSUMER span of one handler run and make it current."""
        ctx = delivery.context
        if ctx and not self._fields.isdisjoint(ctx):
            traceparent = ctx.get("traceparent")
            if (
                self.follow_sampling
                and traceparent is not None
                and len(traceparent) == 55
                and traceparent[54] in _UNSAMPLED_DIGITS
                and traceparent.startswith("00-")
                and "baggage" not in ctx
                and (
                    (propagate.get_global_textmap() is self._textmap and self._plain_w3c)
                    or self._w3c()
                )
            ):
                # not sampled where it was created: no span; the creation context is
                # current so that the handler's own spans and enqueues follow it (the
                # context set_span_in_context(creation span, empty) would make)
                creation_span = _Unsampled(traceparent, ctx.get("tracestate"))
                return None, otel_context.attach(otel_context.Context({_SPAN_KEY: creation_span}))
            if self._noop and not self.parent and "baggage" not in ctx and self._w3c():
                # link mode over the no-op tracer, nothing but the creation span to
                # extract: the process span is INVALID_SPAN, current alone, whatever the
                # creation context was (no need to parse it)
                return trace.INVALID_SPAN, otel_context.attach(_INVALID_CURRENT)
            extracted = self._extract(ctx)
        elif self._noop and not self.parent:
            return trace.INVALID_SPAN, otel_context.attach(_INVALID_CURRENT)
        else:
            extracted = _EMPTY
        creation = trace.get_current_span(extracted).get_span_context()
        if self._noop:  # what the no-op tracer gives, without building what it ignores
            parent = (
                extracted
                if self.parent or not creation.is_valid
                else trace.set_span_in_context(trace.INVALID_SPAN, extracted)
            )
            span = self._tracer.start_span("process", context=parent)
            return span, otel_context.attach(trace.set_span_in_context(span, extracted))
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
        if delivery.group != DEFAULT_GROUP:
            attributes["messaging.consumer.group.name"] = delivery.group
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
        if span is None:  # an unsampled run: nothing to end
            otel_context.detach(token)
            return
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


class _Sending:
    """The send span of one enqueue call, as a context manager (cheaper than a generator)."""

    __slots__ = ("_context", "_custom", "_span", "_token", "_tracing", "_what")

    def __init__(
        self,
        tracing: OTelTracing,
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
        tracing: OTelTracing,
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


def _iso_ms(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _failed(span: trace.Span, kind: str, description: str, error: BaseException | None) -> None:
    if error is not None:
        span.record_exception(error)
    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, description[:1000]))
