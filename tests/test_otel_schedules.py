"""Schedule fires get the send span an enqueue gets (issue 21), checked with the SDK's
in-memory exporter; with tracing off they carry no trace context and make no span."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from test_otel import _global_provider, by_kind, spans  # noqa: F401  (spans: a fixture)

from delayq import Event, EventService, current_delivery
from delayq.otel import OTelTracing

FAST = {"scheduling_interval": 0.2, "lock_timeout": 1.0, "polling_timeout": 1.0}


class Beat(Event, event_name="otel-sched-beat"):
    n: int = 0


async def test_fires_and_triggers_get_a_send_span_with_schedule_and_slot(
    redis_url: str,
    prefix: str,
    spans: InMemorySpanExporter,
    wait_for,
) -> None:
    seen: dict[str, str] = {}  # event id -> the slot the handler saw (ISO)

    async def handle(event: Beat) -> None:
        delivery = current_delivery()
        assert delivery is not None and delivery.slot is not None
        seen[event.id] = delivery.slot.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    service = EventService.from_url(
        redis_url, prefix=prefix, tracing=OTelTracing(_global_provider()), **FAST
    )
    service.add_handler(Beat, handle)
    async with service:
        await service.schedule("traced", Beat, every=timedelta(seconds=1), overlap="allow")
        await wait_for(lambda: len(seen) >= 2, timeout=10)
        trigger_id = await service.trigger_schedule("traced")
        assert trigger_id is not None
        await wait_for(lambda: trigger_id in seen, timeout=10)

        def consumers() -> dict[str, object]:
            done = by_kind(spans.get_finished_spans(), SpanKind.CONSUMER)
            return {s.attributes["messaging.message.id"]: s for s in done}  # type: ignore[index]

        await wait_for(lambda: set(seen) <= set(consumers()), timeout=10)
        await service.unschedule("traced")
    finished = spans.get_finished_spans()
    producers = {
        s.attributes["messaging.message.id"]: s  # type: ignore[index]
        for s in by_kind(finished, SpanKind.PRODUCER)
        if s.attributes and s.attributes.get("messaging.delayq.schedule.name") == "traced"
    }
    assert set(seen) <= set(producers)
    for event_id, slot in seen.items():
        producer = producers[event_id]
        attrs = producer.attributes
        assert attrs is not None
        assert producer.name == "send otel-sched-beat"
        assert attrs["messaging.destination.name"] == "otel-sched-beat"
        assert attrs["messaging.delayq.schedule.slot"] == slot
        assert attrs["messaging.delayq.schedule.outcome"] == "fired"
        assert attrs.get("messaging.delayq.schedule.trigger", False) == (event_id == trigger_id)
        # a fire made by the loop starts a trace of its own (nothing nests in another fire)
        assert producer.parent is None
        # the handler's span links to the fire's send span, as for any enqueued event
        consumer = consumers()[event_id]
        assert [link.context.span_id for link in consumer.links] == [  # type: ignore[attr-defined]
            producer.context.span_id  # type: ignore[union-attr]
        ]


async def test_without_tracing_fires_carry_no_trace_context(
    redis_url: str, prefix: str, wait_for
) -> None:
    contexts: list[dict[str, str]] = []

    async def handle(event: Beat) -> None:
        delivery = current_delivery()
        assert delivery is not None
        contexts.append(dict(delivery.context or {}))

    service = EventService.from_url(redis_url, prefix=prefix, **FAST)
    service.add_handler(Beat, handle)
    async with service:
        await service.schedule("plain", Beat, every=timedelta(seconds=1))
        await wait_for(lambda: contexts, timeout=10)
        await service.unschedule("plain")
    assert "delayq-schedule" in contexts[0] and "traceparent" not in contexts[0]


def test_a_tracing_without_a_firing_hook_gets_one_sending_span_per_fire() -> None:
    from contextlib import contextmanager

    from delayq.observer import Observer

    calls: list[tuple[tuple[str, ...], str | None]] = []

    class Plain:
        @contextmanager
        def sending(self, type_names, event_id, count, context):  # type: ignore[no-untyped-def]
            calls.append((tuple(type_names), event_id))
            yield {"traceparent": f"tp-{event_id}"}

        def handling(self, delivery):  # type: ignore[no-untyped-def]
            return None

        def handled(self, state, outcome, failure, error):  # type: ignore[no-untyped-def]
            return None

    assert Observer().firing("t", [("s@1", "s", 1)]) is None  # tracing off: nothing at all
    spans_ = Observer(Plain()).firing("t", [("s@1", "s", 1), ("s@2", "s", 2)])
    assert spans_ is not None
    assert list(spans_.carriers) == [{"traceparent": "tp-s@1"}, {"traceparent": "tp-s@2"}]
    assert calls == [(("t",), "s@1"), (("t",), "s@2")]
    spans_.end(["fired", "skipped"], None)
