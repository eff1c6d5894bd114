"""With a sampler configured (OTEL_TRACES_SAMPLER), a published and consumed event is recorded as a
producer span and its consumer span, in one trace, and handed to the exporter; an OTLP endpoint without
the exporter package is said in the log, not a crash."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from aiokafka.structs import ConsumerRecord
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from schemas.events import ConversationEnded
from schemas.wire import encode
from services.runtime import tracing
from services.runtime.kafka import Delivery, EventConsumer
from services.runtime.settings import KafkaSettings

TOPIC = "context.lifecycle.v1"


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The module's tracer swapped for one of a provider built as `configure_tracing` builds it (the
    process-wide provider can be set only once), with an in-memory exporter."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    provider = tracing.tracer_provider("unit")
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_configured", True)
    monkeypatch.setattr(tracing, "_fast_ids", None)  # a configured sampler: the SDK path
    monkeypatch.setattr(tracing, "_tracer_cache", provider.get_tracer("cachemesh"))
    yield exporter
    provider.shutdown()


async def test_a_consumed_event_is_exported_as_a_child_of_its_publish(exported: InMemorySpanExporter) -> None:
    seen: list[Delivery] = []

    async def handler(delivery: Delivery) -> None:
        seen.append(delivery)

    consumer = EventConsumer(KafkaSettings(bootstrap="unused:1"), [TOPIC], "g-unit", handler, None)  # type: ignore[arg-type]
    event = ConversationEnded(trace_id="conv-1")
    headers = tracing.publish_headers(TOPIC)
    record = ConsumerRecord(TOPIC, 0, 7, 0, 0, b"conv-1", encode(event), None, 0, 0, headers)
    await consumer._process(record)

    assert len(seen) == 1
    spans = {s.kind: s for s in exported.get_finished_spans()}
    producer, handled = spans[SpanKind.PRODUCER], spans[SpanKind.CONSUMER]
    assert producer.name == f"publish {TOPIC}" and handled.name == f"process {TOPIC}"
    assert handled.context.trace_id == producer.context.trace_id
    assert handled.parent is not None and handled.parent.span_id == producer.context.span_id
    assert seen[0].trace_id == format(producer.context.trace_id, "032x")
    assert handled.resource.attributes["service.name"] == "unit"


def test_an_endpoint_without_the_exporter_package_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
    except ImportError:
        with caplog.at_level(logging.WARNING, logger="services.runtime.tracing"):
            provider = tracing.tracer_provider("unit")
        assert "opentelemetry-exporter-otlp-proto-http is not installed" in caplog.text
        assert not provider._active_span_processor._span_processors
    else:
        provider = tracing.tracer_provider("unit")
        assert provider._active_span_processor._span_processors  # the OTLP batch exporter
    provider.shutdown()
