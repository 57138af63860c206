"""What one span costs the OpenTelemetry Python SDK, next to what delayq adds around it.

CPU time per operation (``time.process_time``, so the span processor's thread
counts too), best of ``--repeat`` loops of ``--n`` operations:

* ``sdk: ...``: ``tracer.start_span(name, ...).end()`` straight on the SDK, with no
  span processor, with a ``BatchSpanProcessor`` (exporter dropping batches), with
  the messaging attributes delayq sets on a process span, and a root span the
  sampler drops (``TraceIdRatioBased(0)``);
* ``delayq: ...``: delayq's own hooks (``Observer.sending`` and
  ``started``/``finished``) without tracing, over the API's no-op tracer, and on the
  paths ``follow_sampling`` makes cheap: an enqueue inside an unsampled trace, a
  handler run of an event whose creation context was not sampled.

Prints a table and writes ``benchmarks/results/otel-span-cost-<time>.json``::

    python benchmarks/otel_span_cost.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

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

from delayq.context import Delivery
from delayq.metrics import NoopMetrics
from delayq.observer import Observer
from delayq.otel import OTelTracing

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
        provider.shutdown()
    observer = Observer(NoopMetrics(), OTelTracing(NoOpTracerProvider()))
    event = Bench()

    def send() -> None:
        with observer.sending(event, None):
            pass

    def handle(context: dict[str, str]) -> Callable[[], None]:
        def run() -> None:
            delivery = Delivery("payment-check", "order-42", 1, 1000, 1_001_500, context)
            observer.finished(observer.started(delivery), None)

        return run

    results["delayq: send hooks, no-op tracer"] = per_op(send, n, repeat)
    # an enqueue inside a request whose trace was not sampled (follow_sampling): no span
    traced = Observer(NoopMetrics(), OTelTracing(TracerProvider()))

    def send_unsampled() -> None:
        with traced.sending(event, None):
            pass

    request = NonRecordingSpan(SpanContext(0x1234, 0x5678, False, TraceFlags(0)))
    with use_span(request):
        results["delayq: send hooks, inside an unsampled trace"] = per_op(send_unsampled, n, repeat)
    untraced = Observer(NoopMetrics())

    def send_untraced() -> None:
        with untraced.sending(event, None):
            pass

    results["delayq: send hooks, no tracing"] = per_op(send_untraced, n, repeat)
    results["delayq: handler hooks, no-op tracer"] = per_op(handle({}), n, repeat)
    unsampled = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-00"}
    results["delayq: handler hooks, unsampled creation context"] = per_op(
        handle(unsampled), n, repeat
    )
    plain = Observer(NoopMetrics())
    results["delayq: handler hooks, no tracing"] = per_op(
        lambda: plain.finished(
            plain.started(Delivery("payment-check", "order-42", 1, 1000, 1_001_500, {})), None
        ),
        n,
        repeat,
    )
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
