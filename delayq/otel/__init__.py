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

from .tracing import OTelTracing

__all__ = ["OTelTracing"]
