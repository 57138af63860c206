"""The :class:`OTelTracing` hooks: the send side's entry points and the process spans."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.trace import Link, NonRecordingSpan, SpanKind, TraceFlags

from .._version import __version__
from ..context import PARENT_SPANS_KEY, PROPAGATION_KEYS, Delivery, hide_context_keys
from ..keyspace.groups import stored_group
from ._conventions import (
    _BAGGAGE_KEY,
    _EMPTY,
    _INVALID_CURRENT,
    _NON_RECORDING,
    _SPAN_KEY,
    _SYSTEM,
    _TEXTMAP_GLOBAL,
    _TUPLE,
    _UNSAMPLED_DIGITS,
    _W3C_FIELDS,
    _attach,
    _detach_raising,
    _failed,
    _get_current,
    _new_span,
    _span_context,
    _Unsampled,
    _w3c_carrier,
)
from ._producer import _Firing, _Sending

__all__ = ["OTelTracing"]

log = logging.getLogger("delayq.otel")


def _detach(token: Any) -> None:
    """Restore the context of before a handler run (as the API's ``detach``: logged, never
    raised, if the handler's task left the context in a state the token cannot undo)."""
    try:
        _detach_raising(token)
    except Exception:
        log.exception("Failed to detach the OpenTelemetry context")


def _parent_links(traceparents: str, delivery: Delivery) -> list[Link]:
    """Links to a child's parents' creation contexts, stored in its context when it was
    enqueued (space-separated, in the order of ``after=``; "-": a parent without one)."""
    parents = delivery.parents
    links = []
    for n, traceparent in enumerate(traceparents.split(" ")):
        span_context = _span_context(traceparent, None)
        if not span_context.is_valid:
            continue
        attributes = {"messaging.delayq.link": "parent"}
        if n < len(parents):
            attributes["messaging.delayq.parent.type"] = parents[n].event_type
            attributes["messaging.delayq.parent.id"] = parents[n].id
        links.append(Link(span_context, attributes))
    return links


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
        (the codec encodes it as it is).
        """
        noop = self._noop
        if (not self.follow_sampling and not noop) or (
            context is not None and not self._fields.isdisjoint(context)
        ):
            return None
        now = _get_current()
        current: Any = now.get(_SPAN_KEY)
        if current is None:  # no trace: the send span is a root
            return None
        unsampled, stored = self._unsampled
        plain_w3c = (
            propagate._HTTP_TEXT_FORMAT if _TEXTMAP_GLOBAL else propagate.get_global_textmap()
        ) is self._textmap and self._plain_w3c
        if current is not unsampled or not plain_w3c:
            # an unsampled request's span (the SDK's NonRecordingSpan): its field, no frame
            sc = current._context if type(current) is _NON_RECORDING else current.get_span_context()
            if _TUPLE:
                valid, flags = sc[5], sc[3]
            else:  # pragma: no cover
                valid, flags = sc.is_valid, sc.trace_flags
            if not valid or (not noop and (flags & TraceFlags.SAMPLED or current.is_recording())):
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
                    (
                        (
                            propagate._HTTP_TEXT_FORMAT
                            if _TEXTMAP_GLOBAL
                            else propagate.get_global_textmap()
                        )
                        is self._textmap
                        and self._plain_w3c
                    )
                    or self._w3c()
                )
            ):
                # not sampled where it was created: no span; the creation context is
                # current so that the handler's own spans and enqueues follow it (the
                # context set_span_in_context(creation span, empty) would make)
                creation_span = _new_span(_Unsampled)  # no __init__ frame: every unsampled run
                creation_span._carrier = (traceparent, ctx.get("tracestate"))
                return None, _attach(otel_context.Context({_SPAN_KEY: creation_span}))
            if self._noop and not self.parent and "baggage" not in ctx and self._w3c():
                # link mode over the no-op tracer, nothing but the creation span to
                # extract: the process span is INVALID_SPAN, current alone, whatever the
                # creation context was (no need to parse it)
                return trace.INVALID_SPAN, _attach(_INVALID_CURRENT)
            extracted = self._extract(ctx)
        elif self._noop and not self.parent:
            return trace.INVALID_SPAN, _attach(_INVALID_CURRENT)
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
            return span, _attach(trace.set_span_in_context(span, extracted))
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
        if stored_group(delivery.group) is not None:
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
        if ctx and PARENT_SPANS_KEY in ctx:  # a child (after=[...]): its parents' spans
            links = [*(links or ()), *_parent_links(ctx[PARENT_SPANS_KEY], delivery)]
        span = self._tracer.start_span(
            f"process {delivery.event_type}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
        )
        # current while the handler runs; the extracted baggage comes along
        token = _attach(trace.set_span_in_context(span, extracted))
        return span, token

    def handled(
        self, state: Any, outcome: str, failure: str | None, error: BaseException | None
    ) -> None:
        """End the span started by :meth:`handling`: status ERROR unless the handler succeeded."""
        span, token = state
        if span is None:  # an unsampled run: nothing to end (the detach inline: every run)
            try:
                _detach_raising(token)
            except Exception:
                log.exception("Failed to detach the OpenTelemetry context")
            return
        try:
            if outcome != "success":
                if error is not None:
                    kind = type(error).__qualname__
                else:
                    kind = (failure or outcome).split(":", 1)[0]
                _failed(span, kind, failure or outcome, error)
        finally:
            _detach(token)
            span.end()
