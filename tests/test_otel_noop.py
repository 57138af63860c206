"""The shortcuts of delayq.otel's per-event paths give what the generic code gives (issue 20).

Over the API's no-op tracer, an enqueue inside a trace needs no send span and a handler
run in link mode needs no process span, attributes or parsing; the unsampled paths read
the OpenTelemetry context once. Each is compared here with the generic code path: the
same no-op tracer behind a subclass the shortcuts do not recognise, and the propagator
API. No Redis: these are the hooks alone.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from delayq.context import Delivery
from delayq.otel import OTelTracing


class _OpaqueNoOpTracer(trace.NoOpTracer):
    """The no-op tracer, not recognised as such: delayq takes its generic path."""


class _OpaqueNoOpProvider(trace.NoOpTracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _OpaqueNoOpTracer()


def _span(sampled: bool, state: TraceState | None = None) -> NonRecordingSpan:
    sc = SpanContext(
        uuid.uuid4().int, uuid.uuid4().int >> 64, False, TraceFlags(int(sampled)), state
    )
    return NonRecordingSpan(sc)


def _current() -> tuple[Any, dict[str, object]]:
    sc = trace.get_current_span().get_span_context()
    return (sc.is_valid, sc.trace_id, sc.span_id, sc.trace_flags), dict(baggage.get_all())


def _sent(tracing: OTelTracing, context: dict[str, str] | None) -> Any:
    with tracing.sending(("t",), "a", 1, context) as stored:
        inside = _current()
    quick = tracing.context_without_span(context)
    return stored, inside, None if quick is None else dict(quick)


@pytest.mark.parametrize("parent", [False, True])
def test_the_no_op_tracer_shortcuts_match_the_generic_path(parent: bool) -> None:
    fast = OTelTracing(trace.NoOpTracerProvider(), parent=parent)
    slow = OTelTracing(_OpaqueNoOpProvider(), parent=parent)
    assert fast._noop and not slow._noop
    requests: list[Any] = [
        None,
        _span(True),
        _span(False),
        _span(True, TraceState([("a", "1")])),
        trace.INVALID_SPAN,
    ]
    for request in requests:
        for context in (None, {"k": "v"}):
            for with_baggage in (False, True):
                ctx = otel_context.get_current()
                if request is not None:
                    ctx = trace.set_span_in_context(request, ctx)
                if with_baggage:
                    ctx = baggage.set_baggage("tenant", "t-1", ctx)
                token = otel_context.attach(ctx)
                try:
                    got, want = _sent(fast, context), _sent(slow, context)
                finally:
                    otel_context.detach(token)
                # the stored context and what is current inside the enqueue agree; the
                # shortcut answers for what the span path would store
                assert got[:2] == want[:2], (request, context, with_baggage)
                if got[2] is not None:
                    assert got[2] == got[0]

    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    contexts: list[dict[str, str]] = [
        {},
        {"k": "v"},
        {"traceparent": f"00-{trace_id}-{span_id}-01"},
        {"traceparent": f"00-{trace_id}-{span_id}-00"},
        {"traceparent": f"00-{trace_id}-{span_id}-01", "tracestate": "a=1"},
        {"traceparent": f"00-{trace_id}-{span_id}-01", "baggage": "tenant=t-1"},
        {"traceparent": f"00-{trace_id}-{span_id}-00", "baggage": "tenant=t-1"},
        {"traceparent": "garbage"},
    ]
    for context in contexts:
        delivery = Delivery("t", "a", 1, 1000, 1_001_000, context)
        seen = []
        for tracing in (fast, slow):
            state = tracing.handling(delivery)
            try:
                seen.append(_current())
            finally:
                tracing.handled(state, "success", None, None)
        assert seen[0] == seen[1], context
    assert _current() == ((False, 0, 0, 0), {})


def test_unsampled_enqueues_read_the_context_once_and_match_the_propagator() -> None:
    tracing = OTelTracing(TracerProvider(sampler=ParentBased(ALWAYS_OFF)))
    for state in (None, TraceState([("a", "1"), ("b", "2")])):
        request = _span(False, state)
        with trace.use_span(request):
            stored = tracing.context_without_span({"k": "v"})
            again = tracing.context_without_span(None)
            expected: dict[str, str] = {}
            propagate.inject(expected)
        assert stored == {"k": "v", **expected}
        assert again == expected
    # a sampled or a recording current span gets a send span: no shortcut
    with trace.use_span(_span(True)):
        assert tracing.context_without_span(None) is None
    recording = TracerProvider(sampler=ALWAYS_ON).get_tracer("t").start_span("r")
    with trace.use_span(recording, end_on_exit=True):
        assert tracing.context_without_span(None) is None
    assert tracing.context_without_span(None) is None  # no trace at all: a root span
    # follow_sampling=False: every enqueue asks the sampler
    asking = OTelTracing(TracerProvider(), follow_sampling=False)
    with trace.use_span(_span(False)):
        assert asking.context_without_span(None) is None


def test_runtime_context_shortcuts_are_the_apis_context() -> None:
    """The context variable's get/set/reset, used per event instead of the API's
    get_current/attach/detach, read and write the context the API sees."""
    from delayq.otel import _conventions as conv

    # the API's default runtime context: the shortcuts are taken
    assert conv._get_current is not otel_context.get_current
    before = otel_context.get_current()
    assert conv._get_current() is before
    ctx = trace.set_span_in_context(_span(False))
    token = conv._attach(ctx)
    assert otel_context.get_current() is ctx
    conv._detach_raising(token)
    assert otel_context.get_current() is before
    token = otel_context.attach(ctx)
    assert conv._get_current() is ctx
    otel_context.detach(token)


def test_a_failed_detach_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    """As the API's detach: a token that cannot be reset is logged."""
    from delayq.otel import tracing

    token = otel_context.attach(otel_context.Context())
    otel_context.detach(token)
    with caplog.at_level("ERROR", logger="delayq.otel"):
        tracing._detach(token)  # used twice: ContextVar.reset raises RuntimeError
    assert "Failed to detach" in caplog.text


def test_the_global_propagator_read_directly_follows_set_global_textmap() -> None:
    """The module global read instead of get_global_textmap() sees a propagator set at
    run time."""
    from opentelemetry.propagators.composite import CompositePropagator

    from delayq.otel import _conventions as conv

    assert conv._TEXTMAP_GLOBAL
    before = propagate.get_global_textmap()
    replacement = CompositePropagator([])
    propagate.set_global_textmap(replacement)
    try:
        assert propagate._HTTP_TEXT_FORMAT is replacement
    finally:
        propagate.set_global_textmap(before)
