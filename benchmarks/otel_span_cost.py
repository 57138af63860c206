"""What one span costs the OpenTelemetry Python SDK, next to what delayq adds around it.

CPU time per operation (``time.process_time``, so the span processor's thread
counts too), best of ``--repeat`` loops of ``--n`` operations:

* ``sdk: ...``: ``tracer.start_span(name, ...).end()`` straight on the SDK, with no
  span processor, with a ``BatchSpanProcessor`` (exporter dropping batches), with
  the messaging attributes delayq sets on a process span, a send span inside a
  sampled request, and (``dropped by the sampler``, ``TraceIdRatioBased(0)``) a root
  span the sampler drops: the SDK's cost, not delayq's;
* ``delayq: ...``: delayq's own hooks as the service calls them (an enqueue's
  ``Observer.context_without_span`` or ``sending``; a handler run's bound
  ``RunHooks.started``/``finished``): without tracing, over the API's no-op tracer,
  with Prometheus, and on the paths ``follow_sampling`` makes cheap: an enqueue
  inside an unsampled trace, a handler run of an event whose creation context was
  not sampled.

Prints a table and writes ``benchmarks/results/otel-span-cost-<time>.json``::

    python benchmarks/otel_span_cost.py
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import (
    NonRecordingSpan,
    NoOpTracerProvider,
    SpanContext,
    SpanKind,
    TraceFlags,
    use_span,
)
from prometheus_client import CollectorRegistry

from delayq.context import Delivery
from delayq.metrics import NoopMetrics, ServiceMetrics
from delayq.observer import Observer
from delayq.otel import OTelTracing
from delayq.prometheus import PrometheusMetrics

HERE = Path(__file__).resolve().parent
ATTRIBUTES = {
    "messaging.system": "delayq",
    "messaging.operation.type": "process",
    "messaging.operation.name": "process",
    "messaging.destination.name": "payment-check",
    "messaging.message.id": "order-42",
    "messaging.delayq.message.delivery_attempt": 1,
    "messaging.delayq.message.lateness_ms": 1.5,
}
SEND_ATTRIBUTES = {
    "messaging.system": "delayq",
    "messaging.operation.type": "send",
    "messaging.operation.name": "send",
    "messaging.destination.name": "payment-check",
    "messaging.message.id": "order-42",
}


class Drop(SpanExporter):
    """Takes batches of spans and drops them."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class Bench:
    """Stands in for an event: what Observer.sending reads."""

    event_name = "payment-check"
    id = "order-42"


def per_op(fn: Callable[[], Any], n: int, repeat: int) -> float:
    """Best CPU µs per call of ``fn``."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - start) / n * 1e6)
    return best


def measure(n: int, repeat: int) -> dict[str, float]:
    results: dict[str, float] = {}
    for label, processor, ratio in (
        ("no processor", False, 1.0),
        ("BatchSpanProcessor", True, 1.0),
        ("dropped by the sampler", True, 0.0),
    ):
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
        if processor:
            provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=1 << 20))
        tracer = provider.get_tracer("bench")
        results[f"sdk: bare span, {label}"] = per_op(
            lambda t=tracer: t.start_span("x").end(), n, repeat
        )
        results[f"sdk: process span with attributes, {label}"] = per_op(
            lambda t=tracer: t.start_span("x", kind=SpanKind.CONSUMER, attributes=ATTRIBUTES).end(),
            n,
            repeat,
        )
        parent = trace.set_span_in_context(
            NonRecordingSpan(SpanContext(0x1234, 0x5678, True, TraceFlags(1)))
        )
        results[f"sdk: send span (child of a sampled request), {label}"] = per_op(
            lambda t=tracer, p=parent: t.start_span(
                "send", context=p, kind=SpanKind.PRODUCER, attributes=SEND_ATTRIBUTES
            ).end(),
            n,
            repeat,
        )
        provider.shutdown()
    results.update(delayq_hooks(n, repeat))
    return results


def delayq_hooks(n: int, repeat: int) -> dict[str, float]:
    """delayq's own hooks per enqueue and per handler run, as the service calls them."""
    results: dict[str, float] = {}
    event = Bench()
    noop_tracing = OTelTracing(NoOpTracerProvider())
    sdk = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)))
    sdk_tracing = OTelTracing(sdk)

    def send_with(observer: Observer) -> Callable[[], None]:
        quick = observer.context_without_span

        def send() -> None:  # as Enqueuer.one: the quick path, else the span
            if observer.tracing is not None and quick is not None and quick(None) is not None:
                return
            with observer.sending(event, None):
                pass

        return send

    untraced, over_noop = Observer(), Observer(noop_tracing)
    results["delayq: send hooks, no tracing"] = per_op(send_with(untraced), n, repeat)
    unsampled_request = NonRecordingSpan(SpanContext(0x1234, 0x5678, False, TraceFlags(0)))
    sampled_request = NonRecordingSpan(SpanContext(0x1234, 0x5678, False, TraceFlags(1)))
    with use_span(unsampled_request):
        results["delayq: send hooks, inside an unsampled trace (its carrier reused)"] = per_op(
            send_with(Observer(sdk_tracing)), n, repeat
        )
    ids = itertools.count(1)

    def in_new_request(hook: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:  # each enqueue in a request of its own, as in the benchmark
            span = NonRecordingSpan(SpanContext(next(ids), 0x5678, False, TraceFlags(0)))
            token = otel_context.attach(trace.set_span_in_context(span))
            try:
                hook()
            finally:
                otel_context.detach(token)

        return run

    request_only = per_op(in_new_request(lambda: None), n, repeat)
    results["delayq: send hooks, each inside a new unsampled request"] = (
        per_op(in_new_request(send_with(Observer(sdk_tracing))), n, repeat) - request_only
    )
    with use_span(sampled_request):
        results["delayq: send hooks, no-op tracer, inside a sampled trace"] = per_op(
            send_with(over_noop), n, repeat
        )

    def handle(observer: Observer, metrics: Any, context: dict[str, str]) -> Callable[[], None]:
        hooks = observer.bind("payment-check", ServiceMetrics(metrics))

        delivery = Delivery(
            "payment-check", "order-42", 1, 1000, 1_001_500, context, "default", 900
        )

        def run() -> None:
            hooks.finished(delivery, hooks.started(delivery), None)

        return run

    unsampled = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-00"}
    sampled = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}
    prometheus = PrometheusMetrics(CollectorRegistry())
    results["delayq: handler hooks, Prometheus only"] = per_op(
        handle(untraced, prometheus, {}), n, repeat
    )
    results["delayq: handler hooks, no-op tracer, unsampled creation context"] = per_op(
        handle(over_noop, NoopMetrics(), unsampled), n, repeat
    )
    results["delayq: handler hooks, no-op tracer, sampled creation context"] = per_op(
        handle(over_noop, NoopMetrics(), sampled), n, repeat
    )
    results["delayq: handler hooks, Prometheus + no-op tracer, unsampled creation context"] = (
        per_op(handle(over_noop, prometheus, unsampled), n, repeat)
    )
    sdk.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="operations per loop")
    parser.add_argument("--repeat", type=int, default=5, help="loops; the best counts")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = measure(args.n, args.repeat)
    print("| operation | CPU µs per call |\n|---|---:|")
    for label, us in results.items():
        print(f"| {label} | {us:.2f} |")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d-%H%M%S")
    out = args.out or HERE / "results" / f"otel-span-cost-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "us_per_call": results,
                "load1": os.getloadavg()[0],
                "python": platform.python_version(),
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
