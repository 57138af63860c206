"""The messaging conventions' constants and the W3C carrier helpers of :mod:`delayq.otel`."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    NonRecordingSpan,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

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


def _runtime_context_ops() -> tuple[
    Callable[[], otel_context.Context], Callable[..., Any], Callable[[Any], None]
]:
    """``get_current``, ``attach`` and ``detach`` of the API's runtime context.

    With the API's default runtime context (one ``ContextVar``), the variable's own
    ``get``, ``set`` and ``reset``: the API's functions add two Python frames each, on
    every traced enqueue and handler run. Any other runtime context (``OTEL_PYTHON_CONTEXT``)
    or layout: the API's functions. ``detach`` raises where the API's logs (callers catch).
    """
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    if type(runtime) is ContextVarsRuntimeContext and isinstance(var, ContextVar):
        probe = otel_context.Context()
        token = var.set(probe)
        try:
            same = otel_context.get_current() is probe
        finally:
            var.reset(token)
        if same:
            return var.get, var.set, var.reset
    return otel_context.get_current, otel_context.attach, _api_detach  # pragma: no cover


def _api_detach(token: Any) -> None:  # pragma: no cover - another runtime context
    otel_context._RUNTIME_CONTEXT.detach(token)


_get_current, _attach, _detach_raising = _runtime_context_ops()


# The API keeps the global propagator in a module global: reading it is an attribute
# load, where get_global_textmap() is a call (twice per traced event). Checked here; the
# function is used if the layout ever changes.
_TEXTMAP_GLOBAL = getattr(
    propagate, "_HTTP_TEXT_FORMAT", None
) is propagate.get_global_textmap() and propagate.get_global_textmap.__code__.co_names == (
    "_HTTP_TEXT_FORMAT",
)


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


def _context_attribute() -> bool:
    """True when a ``NonRecordingSpan`` keeps its context in ``_context`` and
    ``get_span_context`` only returns it (the SDK's unsampled spans are such spans: the
    enqueue path of most traced requests reads it without the method's frame)."""
    probe = NonRecordingSpan(INVALID_SPAN_CONTEXT)
    return getattr(
        probe, "_context", None
    ) is INVALID_SPAN_CONTEXT and NonRecordingSpan.get_span_context.__code__.co_names == (
        "_context",
    )


_NON_RECORDING = NonRecordingSpan if _context_attribute() else None
_DEFAULT_TRACE_STATE = trace.span.DEFAULT_TRACE_STATE
_FLAGS_HEX = tuple(f"-{flags:02x}" for flags in range(256))


def _w3c_carrier(sc: SpanContext) -> dict[str, str]:
    """The W3C carrier (``traceparent``, ``tracestate`` when there is one) of ``sc``."""
    if _TUPLE:
        trace_id, span_id, _, flags, state, _ = sc
    else:  # pragma: no cover
        trace_id, span_id, flags, state = sc.trace_id, sc.span_id, sc.trace_flags, sc.trace_state
    # bytes.hex() of the ids: about a fifth quicker than %032x (every traced enqueue)
    try:
        traceparent = (
            "00-"
            + trace_id.to_bytes(16, "big").hex()
            + "-"
            + span_id.to_bytes(8, "big").hex()
            + _FLAGS_HEX[flags]
        )
    except (OverflowError, IndexError):  # pragma: no cover - ids or flags out of W3C's range
        traceparent = "00-%032x-%016x-%02x" % (trace_id, span_id, flags)  # noqa: UP031
    carrier = {"traceparent": traceparent}
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
    enqueue it makes): most handlers of unsampled events never do. The consumer's
    hot path makes one per delivery with ``_new_span(_Unsampled)`` and sets
    ``_carrier``: no ``__init__`` frame.
    """

    _carrier: tuple[str, str | None]
    _parsed: SpanContext | None = None

    def __init__(self, traceparent: str, tracestate: str | None):
        self._carrier = (traceparent, tracestate)

    def get_span_context(self) -> SpanContext:
        """The creation context (parsed on first use)."""
        if self._parsed is None:
            self._parsed = _span_context(*self._carrier)
        return self._parsed

    def __repr__(self) -> str:
        return f"_Unsampled({self.get_span_context()!r})"


_new_span = object.__new__


def _iso_ms(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _failed(span: trace.Span, kind: str, description: str, error: BaseException | None) -> None:
    if error is not None:
        span.record_exception(error)
    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, description[:1000]))
