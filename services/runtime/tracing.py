"""W3C trace context for events: a span per publish and per handled record, `traceparent` in Kafka
headers. Uses OpenTelemetry; spans are exported only if an exporter is configured."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind

Headers = Sequence[tuple[str, bytes]]

_configured = False


def configure_tracing(service_name: str) -> None:
    """Installs an SDK tracer provider so trace ids are real; idempotent per process."""
    global _configured
    if _configured:
        return
    trace.set_tracer_provider(TracerProvider(resource=Resource.create({"service.name": service_name})))
    _configured = True


def _tracer() -> trace.Tracer:
    return trace.get_tracer("cachemesh")


def inject_headers(headers: list[tuple[str, bytes]] | None = None) -> list[tuple[str, bytes]]:
    carrier: dict[str, str] = {}
    inject(carrier)
    out = list(headers or [])
    out.extend((k, v.encode()) for k, v in carrier.items())
    return out


def headers_carrier(headers: Headers | None) -> dict[str, str]:
    carrier: dict[str, str] = {}
    for key, value in headers or ():
        if key in ("traceparent", "tracestate") and value is not None:
            carrier[key] = value.decode("latin-1")
    return carrier


@contextmanager
def producer_span(topic: str) -> Iterator[Span]:
    with _tracer().start_as_current_span(f"publish {topic}", kind=SpanKind.PRODUCER) as span:
        span.set_attribute("messaging.destination.name", topic)
        yield span


@contextmanager
def consumer_span(topic: str, headers: Headers | None) -> Iterator[Span]:
    """A span for handling one record, child of the producer's span when `traceparent` is present."""
    parent = extract(headers_carrier(headers))
    token = otel_context.attach(parent)
    try:
        with _tracer().start_as_current_span(f"process {topic}", kind=SpanKind.CONSUMER) as span:
            span.set_attribute("messaging.destination.name", topic)
            yield span
    finally:
        otel_context.detach(token)


def current_trace_id() -> str | None:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def current_traceparent() -> str | None:
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")
