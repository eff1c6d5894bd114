"""W3C trace context for events: a span per publish and per handled record, `traceparent` in Kafka
headers. Uses OpenTelemetry; spans are exported only if an exporter is configured."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import Span, SpanKind

Headers = Sequence[tuple[str, bytes]]

_configured = False


def configure_tracing(service_name: str) -> None:
    """Installs an SDK tracer provider so trace ids are real; idempotent per process.

    Spans are recorded only when someone samples them: OTEL_TRACES_SAMPLER (the SDK's standard
    variable) decides when set; otherwise root spans are not recorded, which halves the cost of a
    span, while trace ids still travel in `traceparent` and children follow their parent's choice.
    """
    global _configured
    if _configured:
        return
    sampler = None if os.environ.get("OTEL_TRACES_SAMPLER") else ParentBased(ALWAYS_OFF)
    resource = Resource.create({"service.name": service_name})
    trace.set_tracer_provider(TracerProvider(resource=resource, sampler=sampler))
    _configured = True


_tracer_cache: trace.Tracer | None = None


def _tracer() -> trace.Tracer:
    # get_tracer is costly (it builds and compares instrumentation scopes); one per process will do.
    global _tracer_cache
    if _tracer_cache is None or not _configured:
        _tracer_cache = trace.get_tracer("cachemesh")
    return _tracer_cache


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
