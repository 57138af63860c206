"""OpenTelemetry tracing, checked with the SDK's in-memory exporter (issue 11).

A request to the FastAPI example enqueues an event inside the request's trace; another
service instance handles it through Redis; the producer span and the handler's span are
connected as docs/OBSERVABILITY.md says (a link by default, a parent when asked). A
retried event has one consumer span per attempt; a failing handler's span is ERROR.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from core_support import ServicePool

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

from delayq import Event, current_delivery, event_context, events, fixed
from delayq.otel import OTelTracing

ROOT = Path(__file__).resolve().parent.parent

_EXPORTER = InMemorySpanExporter()


def _global_provider() -> TracerProvider:
    """The process-wide SDK provider (it can be set once), exporting to ``_EXPORTER``."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    return provider


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _global_provider()
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def by_kind(
    finished: tuple[ReadableSpan, ...] | list[ReadableSpan], kind: SpanKind
) -> list[ReadableSpan]:
    return [s for s in finished if s.kind == kind]


class TraceJob(Event, event_name="obs-trace-job"):
    """An event handled under tracing."""

    n: int = 0


@pytest.fixture
def example() -> Iterator[Any]:
    """examples/fastapi_app.py, loaded in this process.

    Its ``PaymentCheck`` takes the wire name "PaymentCheck" in the process-wide registry
    of event types; the name is handed back afterwards, so that other tests (the README's
    example) may define a ``PaymentCheck`` of their own.
    """
    saved = dict(events._registry)
    # and takes it from an earlier test's own PaymentCheck (tests/postgres runs the README's)
    events._registry.pop("PaymentCheck", None)
    spec = importlib.util.spec_from_file_location(
        "fastapi_app", ROOT / "examples" / "fastapi_app.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    events._registry.clear()
    events._registry.update(saved)


async def test_fastapi_request_to_handler_in_another_service(
    redis_url: str, prefix: str, spans: InMemorySpanExporter, wait_for, example: Any
) -> None:
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    # the example read REDIS_URL and DELAYQ_PREFIX when it was loaded
    example.REDIS_URL, example.PREFIX = redis_url, prefix
    FastAPIInstrumentor.instrument_app(example.app)
    seen: list[dict[str, Any]] = []

    async def handle(event: Any) -> None:
        seen.append(
            {
                "span": trace.get_current_span().get_span_context(),
                "context": dict(event_context()),
                "raw": dict(event_context(propagation=True)),
                "delivery": current_delivery(),
            }
        )

    pool = ServicePool(redis_url, prefix, tracing=True)
    try:
        async with example.lifespan(example.app):
            # this instance only produces: the event travels through Redis to `worker`
            assert await example.app.state.service.remove_handler(example.PaymentCheck)
            worker = await pool.start()
            worker.add_handler(example.PaymentCheck, handle)
            transport = httpx.ASGITransport(app=example.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
                response = await client.post("/orders/42?delay=0", headers={"X-Request-ID": "r-42"})
            assert response.status_code == 202, response.text
            await wait_for(lambda: seen, timeout=15)
    finally:
        await pool.aclose()

    finished = spans.get_finished_spans()
    server = [s for s in by_kind(finished, SpanKind.SERVER) if "/orders" in s.name]
    (producer,) = by_kind(finished, SpanKind.PRODUCER)
    (consumer,) = by_kind(finished, SpanKind.CONSUMER)
    assert len(server) == 1
    # the producer span belongs to the request's trace
    assert producer.name == "send PaymentCheck"
    assert producer.context.trace_id == server[0].context.trace_id
    assert producer.parent is not None
    assert producer.attributes["messaging.system"] == "delayq"
    assert producer.attributes["messaging.operation.type"] == "send"
    assert producer.attributes["messaging.destination.name"] == "PaymentCheck"
    assert producer.attributes["messaging.message.id"] == "order-42"
    # the handler's span: a new trace that links to the producer span (the documented default)
    assert consumer.name == "process PaymentCheck"
    assert consumer.parent is None
    assert consumer.context.trace_id != producer.context.trace_id
    (link,) = consumer.links
    assert (link.context.trace_id, link.context.span_id) == (
        producer.context.trace_id,
        producer.context.span_id,
    )
    assert consumer.attributes["messaging.operation.type"] == "process"
    assert consumer.attributes["messaging.destination.name"] == "PaymentCheck"
    assert consumer.attributes["messaging.message.id"] == "order-42"
    assert consumer.attributes["messaging.delayq.message.delivery_attempt"] == 1
    assert consumer.status.status_code == StatusCode.UNSET
    # the handler ran inside its span; its context hides the propagation keys
    (run,) = seen
    assert run["span"].span_id == consumer.context.span_id
    assert run["context"] == {"request_id": "r-42"}
    assert run["raw"]["request_id"] == "r-42"
    assert run["raw"]["traceparent"].split("-")[1:3] == [
        f"{producer.context.trace_id:032x}",
        f"{producer.context.span_id:016x}",
    ]


async def test_parent_mode_makes_one_trace(
    redis_url: str, prefix: str, spans: InMemorySpanExporter, wait_for
) -> None:
    handled: list[int] = []

    async def handle(event: TraceJob) -> None:
        with trace.get_tracer("test").start_as_current_span("inside the handler"):
            handled.append(event.n)

    pool = ServicePool(redis_url, prefix, tracing=OTelTracing(parent=True))
    try:
        service = await pool.start()
        service.add_handler(TraceJob, handle)
        with trace.get_tracer("test").start_as_current_span("request"):
            assert await service.enqueue_many([TraceJob(id="a", n=1), TraceJob(id="b", n=2)]) == [
                True,
                True,
            ]
        await wait_for(lambda: len(handled) == 2, timeout=15)
    finally:
        await pool.aclose()
    finished = spans.get_finished_spans()
    (producer,) = by_kind(finished, SpanKind.PRODUCER)
    consumers = by_kind(finished, SpanKind.CONSUMER)
    assert producer.name == "send obs-trace-job"
    assert producer.attributes["messaging.batch.message_count"] == 2
    assert "messaging.message.id" not in producer.attributes
    assert len(consumers) == 2
    for consumer in consumers:
        assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id
        assert consumer.context.trace_id == producer.context.trace_id
        assert [link.context.span_id for link in consumer.links] == [producer.context.span_id]
    inner = [s for s in finished if s.name == "inside the handler"]
    assert {s.parent.span_id for s in inner if s.parent} == {c.context.span_id for c in consumers}


async def test_one_consumer_span_per_attempt_and_errors(
    redis_url: str, prefix: str, spans: InMemorySpanExporter, wait_for
) -> None:
    attempts: dict[str, int] = {}

    async def flaky(event: TraceJob) -> bool:
        attempts[event.id] = attempts.get(event.id, 0) + 1
        if event.id == "always":
            raise ValueError("never works")
        if attempts[event.id] < 3:
            raise RuntimeError(f"attempt {attempts[event.id]} fails")
        return True

    provider = _global_provider()
    pool = ServicePool(
        redis_url,
        prefix,
        tracing=OTelTracing(provider),
        retry_attempts=2,
        retry_backoff=fixed(0.05),
    )
    try:
        service = await pool.start()
        service.add_handler(TraceJob, flaky, concurrency=2)
        assert await service.enqueue_with_delay(TraceJob(id="third-time"))
        assert await service.enqueue_with_delay(TraceJob(id="always"))

        async def done() -> bool:
            return (await service.stats_for(TraceJob)).dead == 1 and len(
                by_kind(spans.get_finished_spans(), SpanKind.CONSUMER)
            ) == 6

        await wait_for(done, timeout=20)
    finally:
        await pool.aclose()
    finished = spans.get_finished_spans()
    producers = {
        s.attributes["messaging.message.id"]: s for s in by_kind(finished, SpanKind.PRODUCER)
    }
    consumers: dict[str, list[ReadableSpan]] = {}
    for span in by_kind(finished, SpanKind.CONSUMER):
        consumers.setdefault(span.attributes["messaging.message.id"], []).append(span)
    for event_id, runs in consumers.items():
        runs.sort(key=lambda s: s.attributes["messaging.delayq.message.delivery_attempt"])
        assert [s.attributes["messaging.delayq.message.delivery_attempt"] for s in runs] == [
            1,
            2,
            3,
        ]
        # every attempt links to the same creation context
        for span in runs:
            assert [link.context.span_id for link in span.links] == [
                producers[event_id].context.span_id
            ]
    statuses = [s.status.status_code for s in consumers["third-time"]]
    assert statuses == [StatusCode.ERROR, StatusCode.ERROR, StatusCode.UNSET]
    assert consumers["third-time"][0].attributes["error.type"] == "RuntimeError"
    assert consumers["third-time"][0].status.description == "RuntimeError: attempt 1 fails"
    assert [e.name for e in consumers["third-time"][0].events] == ["exception"]
    assert all(s.status.status_code == StatusCode.ERROR for s in consumers["always"])
    assert {s.attributes["error.type"] for s in consumers["always"]} == {"ValueError"}


async def test_custom_creation_context_is_kept(
    redis_url: str, prefix: str, spans: InMemorySpanExporter, wait_for
) -> None:
    """A context that already carries a traceparent is stored as given; the send span links to it."""
    given = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    raw: list[dict[str, str]] = []

    async def handle(event: TraceJob) -> None:
        raw.append(dict(event_context(propagation=True)))

    pool = ServicePool(redis_url, prefix, tracing=True)
    try:
        service = await pool.start()
        service.add_handler(TraceJob, handle)
        assert await service.enqueue_with_delay(TraceJob(id="c"), context={"traceparent": given})
        await wait_for(lambda: raw, timeout=15)
    finally:
        await pool.aclose()
    assert raw == [{"traceparent": given}]
    (producer,) = by_kind(spans.get_finished_spans(), SpanKind.PRODUCER)
    (consumer,) = by_kind(spans.get_finished_spans(), SpanKind.CONSUMER)
    assert [f"{link.context.trace_id:032x}" for link in producer.links] == [given.split("-")[1]]
    assert [f"{link.context.span_id:016x}" for link in consumer.links] == [given.split("-")[2]]


def test_no_opentelemetry_means_no_tracing_and_light_imports() -> None:
    """Without opentelemetry, tracing=True is a no-op; importing delayq imports no extra."""
    code = """
import sys
sys.modules["opentelemetry"] = None  # as if it were not installed
import redis.asyncio as aioredis
import delayq
heavy = [m for m in ("prometheus_client", "opentelemetry.trace", "starlette", "typer", "rich")
         if m in sys.modules]
assert not heavy, heavy
service = delayq.EventService(aioredis.Redis(), tracing=True)
assert service.options.tracing is None
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_fast_w3c_extract_matches_the_propagator() -> None:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate

    tracing = OTelTracing()
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    carriers = [
        {"traceparent": f"00-{trace_id}-{span_id}-01"},
        {"traceparent": f"00-{trace_id}-{span_id}-00", "tracestate": "a=1,b=2"},
        {"traceparent": f"01-{trace_id}-{span_id}-01-extra"},  # a later version may add fields
        {"traceparent": f"00-{trace_id}-{span_id}-01-extra"},  # version 00 may not
        {"traceparent": f"ff-{trace_id}-{span_id}-01"},
        {"traceparent": f"00-{'0' * 32}-{span_id}-01"},
        {"traceparent": f"00-{trace_id.upper()}-{span_id}-01"},
        {"traceparent": "garbage"},
        {"traceparent": f"00-{trace_id}-{span_id}-01", "baggage": "k=v"},
    ]
    for carrier in carriers:
        ours = trace.get_current_span(tracing._extract(carrier)).get_span_context()
        theirs = trace.get_current_span(
            propagate.extract(carrier, context=otel_context.Context())
        ).get_span_context()
        assert (ours.is_valid, ours.trace_id, ours.span_id, ours.trace_flags) == (
            theirs.is_valid, theirs.trace_id, theirs.span_id, theirs.trace_flags,
        ), carrier  # fmt: skip
        assert dict(ours.trace_state or {}) == dict(theirs.trace_state or {}), carrier


async def test_baggage_reaches_the_handler(
    redis_url: str, prefix: str, spans: InMemorySpanExporter, wait_for
) -> None:
    from opentelemetry import baggage
    from opentelemetry import context as otel_context

    seen: list[Any] = []

    async def handle(event: TraceJob) -> None:
        seen.append((baggage.get_baggage("tenant"), sorted(event_context(propagation=True))))

    pool = ServicePool(redis_url, prefix, tracing=True)
    try:
        service = await pool.start()
        service.add_handler(TraceJob, handle)
        token = otel_context.attach(baggage.set_baggage("tenant", "t-1"))
        try:
            with trace.get_tracer("test").start_as_current_span("request"):
                assert await service.enqueue_with_delay(TraceJob(id="bag"))
        finally:
            otel_context.detach(token)
        await wait_for(lambda: seen, timeout=15)
    finally:
        await pool.aclose()
    assert seen == [("t-1", ["baggage", "traceparent"])]


def _unsampled_parent() -> trace.NonRecordingSpan:
    """A span of a trace its sampler dropped (as a request's span is when not sampled)."""
    return trace.NonRecordingSpan(
        trace.SpanContext(
            int(uuid.uuid4().hex, 16),
            int(uuid.uuid4().hex[:16], 16),
            is_remote=False,
            trace_flags=trace.TraceFlags(trace.TraceFlags.DEFAULT),
        )
    )


@pytest.mark.parametrize("follow", [True, False])
async def test_handlers_follow_the_sampling_of_the_enqueue(
    redis_url: str, prefix: str, wait_for, follow: bool
) -> None:
    """An event created in an unsampled trace: no send span, no process span, and the
    handler's own spans and enqueues stay in that (unsampled) trace. With
    follow_sampling=False each process span (the root of its own trace) is left to the
    sampler, which records roots here."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_ON))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen: dict[str, dict[str, str]] = {}

    async def handle(event: TraceJob) -> None:
        seen[event.id] = dict(event_context(propagation=True))
        with provider.get_tracer("test").start_as_current_span("inside the handler"):
            if event.id == "first":
                await service.enqueue_with_delay(TraceJob(id="second"))

    pool = ServicePool(redis_url, prefix, tracing=OTelTracing(provider, follow_sampling=follow))
    try:
        service = await pool.start()
        service.add_handler(TraceJob, handle)
        parent = _unsampled_parent()
        with trace.use_span(parent):
            assert await service.enqueue_with_delay(TraceJob(id="first"))
        await wait_for(lambda: len(seen) == 2, timeout=15)
    finally:
        await pool.aclose()
    trace_id = f"{parent.get_span_context().trace_id:032x}"
    finished = exporter.get_finished_spans()
    if follow:
        # the whole story stays unsampled and in the request's trace
        assert seen["first"]["traceparent"] == (
            f"00-{trace_id}-{parent.get_span_context().span_id:016x}-00"
        )
        assert seen["second"]["traceparent"].split("-")[1] == trace_id
        assert seen["second"]["traceparent"].endswith("-00")
        assert finished == ()
    else:
        # the first send span is dropped with its parent; the handler's spans are recorded
        (send,) = by_kind(finished, SpanKind.PRODUCER)
        assert send.attributes["messaging.message.id"] == "second"
        assert len(by_kind(finished, SpanKind.CONSUMER)) == 2
        assert len([s for s in finished if s.name == "inside the handler"]) == 2
        assert all(s.context.trace_flags.sampled for s in finished)


@pytest.mark.parametrize("parent", [True, False])
async def test_sampled_enqueues_are_traced_whole_under_ratio_sampling(
    redis_url: str, prefix: str, wait_for, parent: bool
) -> None:
    """Under a ratio sampler, a handler run is recorded only if its send span was: always in
    parent mode (the run is in the send span's trace), at the sampler's ratio in link mode
    (the run is the root of a trace of its own)."""
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.5)))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    handled: list[str] = []

    async def handle(event: TraceJob) -> None:
        handled.append(event.id)

    n = 200
    pool = ServicePool(redis_url, prefix, tracing=OTelTracing(provider, parent=parent))
    try:
        service = await pool.start()
        service.add_handler(TraceJob, handle, concurrency=16)
        for i in range(n):
            assert await service.enqueue_with_delay(TraceJob(id=f"r{i}"))
        await wait_for(lambda: len(handled) == n, timeout=20)
    finally:
        await pool.aclose()
    finished = exporter.get_finished_spans()
    sent = {s.attributes["messaging.message.id"] for s in by_kind(finished, SpanKind.PRODUCER)}
    processed = {s.attributes["messaging.message.id"] for s in by_kind(finished, SpanKind.CONSUMER)}
    assert 0 < len(sent) < n  # some sampled, some not
    if parent:
        assert processed == sent
    else:
        assert processed < sent


def test_enqueues_in_one_unsampled_span_share_its_carrier_and_see_new_baggage() -> None:
    from opentelemetry import baggage
    from opentelemetry import context as otel_context

    tracing = OTelTracing(TracerProvider())
    parent = _unsampled_parent()
    sc = parent.get_span_context()
    expected = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-00"
    with trace.use_span(parent):
        with tracing.sending(("t",), "a", 1, None) as first:
            pass
        with tracing.sending(("t",), "b", 1, {"k": "v"}) as second:
            pass
        token = otel_context.attach(baggage.set_baggage("tenant", "t-1"))
        try:
            with tracing.sending(("t",), "c", 1, None) as third:
                pass
        finally:
            otel_context.detach(token)
        with tracing.sending(("t",), "d", 1, None) as fourth:
            pass
    assert first == {"traceparent": expected}
    assert second == {"k": "v", "traceparent": expected}
    assert third is not None and third["traceparent"] == expected
    assert "tenant=t-1" in third["baggage"]
    assert fourth == {"traceparent": expected} and fourth is not first


async def test_process_spans_of_a_named_group_name_it(
    redis_url: str, prefix: str, wait_for: Any
) -> None:
    """A handler of a named delivery group runs in a span with
    ``messaging.consumer.group.name``; the default group's span has none."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    handled: list[str] = []

    async def handle(event: TraceJob) -> None:
        handled.append(current_delivery().group)  # type: ignore[union-attr]

    pool = ServicePool(redis_url, prefix, tracing=OTelTracing(provider))
    try:
        service = pool.make()
        service.add_handler(TraceJob, handle)
        service.add_handler(TraceJob, handle, group="audit")
        await service.start()

        async def registered() -> bool:
            return "audit" in await service.groups(TraceJob)

        await wait_for(registered, timeout=10)
        assert await service.enqueue_with_delay(TraceJob(id="g1"))
        await wait_for(lambda: len(handled) == 2, timeout=15)
    finally:
        await pool.aclose()
    spans = by_kind(exporter.get_finished_spans(), SpanKind.CONSUMER)
    groups = sorted(str((s.attributes or {}).get("messaging.consumer.group.name")) for s in spans)
    assert groups == ["None", "audit"]
    assert sorted(handled) == ["audit", "default"]


class TraceParent(Event, event_name="obs-trace-parent"):
    """A parent of a child event under tracing."""


async def test_a_childs_process_span_links_to_its_parents_send_spans(
    redis_url: str, prefix: str, spans: InMemorySpanExporter, wait_for
) -> None:
    ran: list[str] = []

    async def handle(event: Event) -> None:
        ran.append(event.id)

    pool = ServicePool(redis_url, prefix, tracing=OTelTracing())
    try:
        service = await pool.start()
        service.add_handler(TraceJob, handle)
        service.add_handler(TraceParent, handle)
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("first request"):
            await service.enqueue_with_delay(TraceParent(id="p1"), 0.3)
        await service.enqueue_with_delay(TraceJob(id="p2"), 0.3)  # a root send span
        with tracer.start_as_current_span("child request"):
            assert await service.enqueue_with_delay(
                TraceJob(id="child"), 0, after=[(TraceParent, "p1"), (TraceJob, "p2")]
            )
        await wait_for(lambda: "child" in ran, timeout=15)
    finally:
        await pool.aclose()
    finished = spans.get_finished_spans()
    sends = {
        s.attributes["messaging.message.id"]: s.context
        for s in by_kind(finished, SpanKind.PRODUCER)
    }
    (child,) = [
        s
        for s in by_kind(finished, SpanKind.CONSUMER)
        if s.attributes["messaging.message.id"] == "child"
    ]
    # its parents' send spans, in the order of after= (after its own creation's link,
    # when its enqueue carried one)
    links = [link for link in child.links if (link.attributes or {}).get("messaging.delayq.link")]
    assert [link.context.span_id for link in links] == [sends["p1"].span_id, sends["p2"].span_id]
    assert [dict(link.attributes or {}) for link in links] == [
        {
            "messaging.delayq.link": "parent",
            "messaging.delayq.parent.type": "obs-trace-parent",
            "messaging.delayq.parent.id": "p1",
        },
        {
            "messaging.delayq.link": "parent",
            "messaging.delayq.parent.type": "obs-trace-job",
            "messaging.delayq.parent.id": "p2",
        },
    ]
    # the context key that carries them stays out of the handler's event_context()
    assert "delayq-parent-spans" not in event_context()
