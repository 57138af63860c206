"""Overhead of observability: delayq throughput with Prometheus + OpenTelemetry vs without.

Modes (``--modes``, the first is the baseline), alternated round by round in one run
against one private redis-server:

* ``plain``: the defaults (no metrics sink, no tracing);
* ``prometheus``: ``metrics=PrometheusMetrics(...)``;
* ``otel``: ``tracing=OTelTracing(provider)`` with the OpenTelemetry SDK recording
  spans (sampler ``ParentBased(TraceIdRatioBased(--sample-ratio))``, default 1.0 =
  every span) into a ``BatchSpanProcessor`` whose exporter drops the batches (what is
  measured is delayq's instrumentation and the SDK, not a network);
* ``observed``: both;
* ``otel-api``: ``tracing=OTelTracing(NoOpTracerProvider())``: delayq's own
  instrumentation (attributes, context propagation) with no SDK behind it;
* ``observed-api``: Prometheus and ``otel-api``: delayq's own cost of both, without
  the SDK's (with ``--in-request`` the application's requests are still traced by
  the SDK in every mode, and delayq propagates their context).

``--handler noop`` (default) is the worst case for the ratios: the handler does
nothing, so delayq's own work is all there is. ``--handler redis`` makes each
handler do one Redis round trip (a ``GET`` on its own connection pool), the
least a real handler does (look up an order, check a status).

Each round, on a fresh prefix:

1. enqueue: ``--events`` single ``enqueue_with_delay`` calls (due now) from
   ``--tasks`` concurrent tasks, in a producer-only service; each is a PRODUCER span
   when traced;
2. handle: a service with a no-op handler (``--concurrency``) is started and the
   time until every event has run is taken; each run is a CONSUMER span when traced,
   and three histogram observations and the counters with Prometheus.

``--in-request`` runs each enqueue inside a span of the application's own (a
request's, as opentelemetry-instrumentation-fastapi makes), in every mode, sampled
by the same ``ParentBased(TraceIdRatioBased)`` sampler: the cost of a traced
application is then in every mode, and what differs is what delayq adds (its send
and process spans follow the request's sampling decision). Without it every send
span is the root of a trace (the worst case: the sampler runs for each).

CPU per event (``time.process_time()`` of the whole process over each phase, the
SDK's export thread included) is steadier than wall-clock rates on a shared machine:
the table shows its median over rounds per mode, and the CPU a mode adds over the
baseline (median over rounds of the difference with the baseline's round next to it).
Targets (issue 20): ``observed-api`` with ``--in-request --sample-ratio 0.1`` adds at
most 5 µs per event; ``observed`` with ``--handler redis`` keeps at least 85 % of the
baseline's events per CPU second.

``end to end`` is ``events / (enqueue time + handle time)``: the pipeline's throughput
when one process both enqueues and handles. Redis commands per event
(``total_commands_processed`` over both phases, calls inside scripts included, the
handler's own ``GET`` too) show whether a mode adds round trips. The best round of each mode
counts (other work on a shared machine only ever slows a round down); the *paired*
ratio is the median over rounds of a mode's rate over the baseline's in the same round,
which holds better when the machine's speed drifts during a run. Prints a table
and writes ``benchmarks/results/observability-<time>.json``::

    .venv/bin/python benchmarks/observability.py --events 20000 --rounds 5 \
        --modes plain,prometheus,otel,observed
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis.asyncio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from delayq import Event, EventService
from delayq.otel import OTelTracing
from delayq.prometheus import PrometheusMetrics
from delayq.testing import RedisServer

HERE = Path(__file__).resolve().parent


class ObsBench(Event, event_name="obs-bench"):
    """The benchmark's event."""

    n: int = 0


class DropExporter(SpanExporter):
    """Takes batches of spans and drops them, counting them."""

    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


MODES = ("plain", "prometheus", "otel", "observed", "otel-api", "observed-api")
RATES = ("enqueue_per_s", "handle_per_s", "end_to_end_per_s")
CPUS = ("enqueue_cpu_us", "handle_cpu_us", "cpu_us")


def mode_options(
    mode: str, sample_ratio: float, in_request: bool = False
) -> tuple[dict[str, Any], TracerProvider | None, DropExporter | None]:
    """The service options of a mode; the SDK provider and exporter when it traces.

    With ``in_request`` every mode has the provider (the application traces its
    requests whatever delayq does); only the ``otel`` modes give it to delayq.
    """
    options: dict[str, Any] = {}
    provider = exporter = None
    if mode in ("prometheus", "observed", "observed-api"):
        options["metrics"] = PrometheusMetrics(CollectorRegistry())
    if in_request or mode in ("otel", "observed"):
        exporter = DropExporter()
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536))
    if mode in ("otel", "observed"):
        options["tracing"] = OTelTracing(provider)
    if mode in ("otel-api", "observed-api"):
        options["tracing"] = OTelTracing(NoOpTracerProvider())
    return options, provider, exporter


async def commands_processed(url: str) -> int:
    """Redis's ``total_commands_processed`` (script-internal calls included)."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        return int((await client.info("stats"))["total_commands_processed"])
    finally:
        await client.aclose()


async def one_round(
    url: str,
    options: dict[str, Any],
    args: argparse.Namespace,
    provider: TracerProvider | None = None,
) -> dict[str, float]:
    prefix = f"obsbench-{uuid.uuid4().hex[:8]}"
    commands_before = await commands_processed(url)
    producer = EventService.from_url(url, prefix=prefix, enable_scheduling=False, **options)
    n = args.events
    next_index = 0
    app_tracer = provider.get_tracer("app") if args.in_request and provider else None

    async def enqueue_some() -> None:
        nonlocal next_index
        while next_index < n:
            i = next_index
            next_index += 1
            if app_tracer is None:
                await producer.enqueue_with_delay(ObsBench(id=f"e{i}", n=i))
            else:  # the application's request span, sampled by its provider
                with app_tracer.start_as_current_span("request"):
                    await producer.enqueue_with_delay(ObsBench(id=f"e{i}", n=i))

    start, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(enqueue_some() for _ in range(args.tasks)))
    enqueue_s, enqueue_cpu = time.perf_counter() - start, time.process_time() - cpu0
    await producer.aclose()

    handled = 0
    all_done = asyncio.Event()
    checker = redis.asyncio.Redis.from_url(url) if args.handler == "redis" else None

    async def handle(event: ObsBench) -> None:
        nonlocal handled
        if checker is not None:
            await checker.get("obs-bench-status")
        handled += 1
        if handled == n:
            all_done.set()

    service = EventService.from_url(url, prefix=prefix, **options)
    service.add_handler(ObsBench, handle, concurrency=args.concurrency)
    start, cpu0 = time.perf_counter(), time.process_time()
    async with service:
        await asyncio.wait_for(all_done.wait(), timeout=300)
        handle_s, handle_cpu = time.perf_counter() - start, time.process_time() - cpu0
    if provider is not None:  # the export thread's CPU for these spans counts too
        cpu0 = time.process_time()
        provider.force_flush()
        handle_cpu += time.process_time() - cpu0
    if checker is not None:
        await checker.aclose()
    commands = await commands_processed(url) - commands_before
    return {
        "enqueue_per_s": n / enqueue_s,
        "handle_per_s": n / handle_s,
        "end_to_end_per_s": n / (enqueue_s + handle_s),
        "redis_commands_per_event": commands / n,
        "enqueue_cpu_us": enqueue_cpu / n * 1e6,
        "handle_cpu_us": handle_cpu / n * 1e6,
        "cpu_us": (enqueue_cpu + handle_cpu) / n * 1e6,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = RedisServer()
    server.start()
    modes = args.modes.split(",")
    rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    spans = 0
    try:
        for r in range(args.rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                options, provider, exporter = mode_options(mode, args.sample_ratio, args.in_request)
                result = await one_round(server.url, options, args, provider)
                if provider is not None and exporter is not None:
                    provider.force_flush()
                    provider.shutdown()
                    spans += exporter.exported
                    # the application's request spans are in every mode: the difference
                    # between modes is delayq's spans (what the SDK costs per event)
                    result["spans_per_event"] = exporter.exported / args.events
                result["load1"] = os.getloadavg()[0]
                rounds[mode].append(result)
                print(f"round {r + 1} {mode:12} enqueue {result['enqueue_per_s']:9,.0f}/s  "
                      f"handle {result['handle_per_s']:9,.0f}/s  CPU µs/event "
                      f"{result['enqueue_cpu_us']:.1f} + {result['handle_cpu_us']:.1f}  "
                      f"end to end {result['end_to_end_per_s']:9,.0f}/s  Redis commands/event "
                      f"{result['redis_commands_per_event']:.2f}  load {result['load1']:.2f}")  # fmt: skip
            await asyncio.sleep(0)
    finally:
        server.stop()
    best = {
        mode: {k: max(r[k] for r in results) for k in RATES} for mode, results in rounds.items()
    }
    base = best[modes[0]]
    ratio = {mode: {k: b[k] / base[k] for k in RATES} for mode, b in best.items()}
    # each round's rate over the baseline's in the same round (next to it in time), the
    # median over rounds: steadier than best against best when the machine drifts
    paired = {
        mode: {
            k: statistics.median(r[k] / p[k] for r, p in zip(results, rounds[modes[0]]))
            for k in RATES
        }
        for mode, results in rounds.items()
    }
    print()
    print(f"| mode | enqueue (events/s) | vs {modes[0]} | handle (events/s) | vs {modes[0]} "
          f"| end to end (events/s) | vs {modes[0]} | Redis commands/event |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode in modes:
        b, q = best[mode], ratio[mode]
        per_event = statistics.median(r["redis_commands_per_event"] for r in rounds[mode])
        cells = " | ".join(f"{b[k]:,.0f} | {100 * q[k]:.1f} %" for k in RATES)
        print(f"| {mode} | {cells} | {per_event:.2f} |")
    print(f"\npaired (median over rounds of each round's rate / {modes[0]}'s in that round):")
    for mode in modes[1:]:
        cells = " / ".join(f"{100 * paired[mode][k]:.1f} %" for k in RATES)
        print(f"  {mode:12} enqueue / handle / end to end: {cells}")
    cpu = {
        mode: {k: statistics.median(r[k] for r in results) for k in CPUS}
        for mode, results in rounds.items()
    }
    added = {
        mode: {
            k: statistics.median(r[k] - p[k] for r, p in zip(results, rounds[modes[0]]))
            for k in CPUS
        }
        for mode, results in rounds.items()
    }
    kept = {
        mode: statistics.median(
            p["cpu_us"] / r["cpu_us"] for r, p in zip(results, rounds[modes[0]])
        )
        for mode, results in rounds.items()
    }
    print(f"\n| mode | CPU µs/event: enqueue | handle | both | added vs {modes[0]}: enqueue "
          f"| handle | both | events per CPU second vs {modes[0]} |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode in modes:
        c, a = cpu[mode], added[mode]
        print(f"| {mode} | {c['enqueue_cpu_us']:.1f} | {c['handle_cpu_us']:.1f} | "
              f"{c['cpu_us']:.1f} | {a['enqueue_cpu_us']:+.1f} | {a['handle_cpu_us']:+.1f} | "
              f"{a['cpu_us']:+.1f} | {100 * kept[mode]:.1f} % |")  # fmt: skip
    print(f"\nspans exported (all rounds): {spans:,}")
    for mode, results in rounds.items():
        if results and "spans_per_event" in results[0]:
            per_event = statistics.median(r["spans_per_event"] for r in results)
            print(f"  {mode}: {per_event:.3f} spans per event (median over rounds)")
    return {
        "args": vars(args),
        "rounds": rounds,
        "best": best,
        "ratio": ratio,
        "paired": paired,
        "cpu_us_median": cpu,
        "cpu_us_added_median": added,
        "cpu_throughput_kept": kept,
        "spans_exported": spans,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=100, help="concurrent enqueueing tasks")
    parser.add_argument("--concurrency", type=int, default=64, help="handler concurrency")
    parser.add_argument(
        "--modes",
        default="plain,observed",
        help=f"comma-separated, the first is the baseline; from {', '.join(MODES)}",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    parser.add_argument("--sample-ratio", type=float, default=1.0, help="OTel sampling ratio")
    parser.add_argument(
        "--in-request",
        action="store_true",
        help="enqueue inside a span of the application's (a request's) in every mode, "
        "sampled at --sample-ratio; delayq's spans follow it",
    )
    parser.add_argument(
        "--handler",
        choices=("noop", "redis"),
        default="noop",
        help="noop: the handler does nothing; redis: one GET round trip per event",
    )
    args = parser.parse_args()
    results = asyncio.run(main(args))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d-%H%M%S")
    where = "-in-request" if args.in_request else ""
    name = f"observability-{stamp}-{args.handler}{where}-sample{args.sample_ratio:g}.json"
    out = args.out or HERE / "results" / name
    results["args"]["out"] = str(out)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    cli()
