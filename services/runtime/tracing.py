"""W3C trace context for events: a span per publish and per handled record, `traceparent` in Kafka
headers. Uses OpenTelemetry; spans are exported over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set.

Spans nobody samples (the default: see `configure_tracing`) take a fast path: the same trace and
span ids the SDK would give a non-recording span, written straight into the headers and the context,
without the SDK's sampler, span and propagator machinery, which cost more than the rest of a record's
path. Sampled traces, trace state, baggage and any other tracing setup take the SDK path.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagate import extract, get_global_textmap, inject
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

Headers = Sequence[tuple[str, bytes]]

log = logging.getLogger(__name__)

_configured = False
# Set while unsampled spans may take the fast path: our provider and sampler are the global ones and
# the propagators are the default W3C pair. Holds the provider's id generator.
_fast_ids: IdGenerator | None = None
# As the SDK's TraceContext propagator parses `traceparent`.
_TRACEPARENT = re.compile("^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:(-.*)|[ \t]*)$")
_TRACEPARENT_MAX_CHARS = 512
_EMPTY_CONTEXT = otel_context.Context()


def configure_tracing(service_name: str) -> None:
    """Installs an SDK tracer provider so trace ids are real; idempotent per process.

    Spans are recorded only when someone samples them: OTEL_TRACES_SAMPLER (the SDK's standard
    variable) decides when set; otherwise root spans are not recorded, which halves the cost of a
    span, while trace ids still travel in `traceparent` and children follow their parent's choice.
    With OTEL_EXPORTER_OTLP_ENDPOINT set, recorded spans go out over OTLP/HTTP (`tracer_provider`).
    """
    global _configured, _fast_ids
    if _configured:
        return
    provider = tracer_provider(service_name)
    trace.set_tracer_provider(provider)
    _configured = True
    if _unsampled_by_default() and trace.get_tracer_provider() is provider and _default_propagators():
        _fast_ids = provider.id_generator


def _unsampled_by_default() -> bool:
    return not os.environ.get("OTEL_TRACES_SAMPLER")


def tracer_provider(service_name: str) -> TracerProvider:
    """The provider `configure_tracing` installs: the sampler as above, and a batching OTLP/HTTP
    exporter when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) names a collector and the
    exporter package (opentelemetry-exporter-otlp-proto-http) is installed; the exporter reads the
    standard OTEL_EXPORTER_OTLP_* variables (headers, timeout, compression) itself."""
    sampler = ParentBased(ALWAYS_OFF) if _unsampled_by_default() else None
    resource = Resource.create({"service.name": service_name})
    provider = TracerProvider(resource=resource, sampler=sampler)
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not endpoint:
        return provider
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-exporter-otlp-proto-http is not "
            "installed: spans are not exported",
            extra={"endpoint": endpoint},
        )
        return provider
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if sampler is not None:
        log.warning(
            "exporting spans over OTLP, but OTEL_TRACES_SAMPLER is unset: only traces sampled upstream "
            "are recorded (set it, e.g. parentbased_traceidratio with OTEL_TRACES_SAMPLER_ARG=0.01)",
            extra={"endpoint": endpoint},
        )
    else:
        log.info("exporting spans over OTLP", extra={"endpoint": endpoint})
    return provider


def _default_propagators() -> bool:
    textmap = get_global_textmap()
    kinds = [type(p) for p in getattr(textmap, "_propagators", ())]
    return isinstance(textmap, CompositePropagator) and kinds == [
        TraceContextTextMapPropagator,
        W3CBaggagePropagator,
    ]


_ROOT_FLAGS = {True: TraceFlags(TraceFlags.RANDOM_TRACE_ID), False: TraceFlags(TraceFlags.DEFAULT)}
# The common header, matched in one go; anything else takes the general parse below.
_TRACEPARENT_V00 = re.compile(rb"00-([0-9a-f]{32})-([0-9a-f]{16})-(0[02468ace])")
_NO_TRACE = 0


def _remote_parent(headers: Headers | None) -> tuple[bool, int, bool]:
    """(whether the fast path can stand in for the SDK: no sampled parent, no trace state; the
    trace id `traceparent` names, 0 if none is valid; whether the parent says it is random)."""
    value: bytes | None = None
    for key, raw in headers or ():
        if key == "traceparent" and raw is not None:
            value = raw
        elif key == "tracestate" and raw is not None:
            return False, _NO_TRACE, False
    if value is None or len(value) > _TRACEPARENT_MAX_CHARS:
        return True, _NO_TRACE, False
    common = _TRACEPARENT_V00.fullmatch(value)
    if common is not None:
        trace_hex, span_hex, flag_hex = common.group(1, 2, 3)
        if trace_hex == b"0" * 32 or span_hex == b"0" * 16:
            return True, _NO_TRACE, False
        return True, int(trace_hex, 16), bool(int(flag_hex, 16) & TraceFlags.RANDOM_TRACE_ID)
    match = _TRACEPARENT.search(value.decode("latin-1"))
    if match is None:
        return True, _NO_TRACE, False
    version, trace_id, span_id, flags = match.group(1, 2, 3, 4)
    if trace_id == "0" * 32 or span_id == "0" * 16 or version == "ff" or (version == "00" and match.group(5)):
        return True, _NO_TRACE, False
    trace_flags = TraceFlags(int(flags, 16))
    if trace_flags.sampled:
        return False, _NO_TRACE, False
    return True, int(trace_id, 16), trace_flags.random_trace_id


def publish_headers(topic: str, headers: Sequence[tuple[str, bytes]] = ()) -> list[tuple[str, bytes]]:
    """`headers` plus the trace context of a producer span for a record sent to `topic`."""
    ids = _fast_ids
    if ids is not None:
        current = otel_context.get_current()
        if not current:
            # Nothing in the context (no span, no baggage): a root span.
            return [*headers, ("traceparent", _traceparent_of(_NO_TRACE, False, ids))]
        span = trace.get_current_span(current)
        if type(span) is _UnsampledSpan and len(current) == 1:
            # A handler's own publish: its record's trace, nothing else in the context.
            return [*headers, ("traceparent", _traceparent_of(span.trace, span.random_id, ids))]
        parent = span.get_span_context()
        if not parent.trace_flags.sampled and not parent.trace_state and not baggage.get_all(current):
            trace_id = parent.trace_id if parent.is_valid else _NO_TRACE
            traceparent = _traceparent_of(trace_id, parent.trace_flags.random_trace_id, ids)
            return [*headers, ("traceparent", traceparent)]
    with producer_span(topic):
        return inject_headers(list(headers))


def _trace_or_new(trace_id: int, random_id: bool, ids: IdGenerator) -> tuple[int, bool]:
    """(trace id, whether it is random) of an unsampled span in trace `trace_id`, or in a new trace
    when that is `_NO_TRACE`, as the SDK's ParentBased(ALWAYS_OFF) sampler leaves it."""
    if trace_id == _NO_TRACE:
        return ids.generate_trace_id(), ids.is_trace_id_random()
    return trace_id, random_id


def _traceparent_of(trace_id: int, random_id: bool, ids: IdGenerator) -> bytes:
    """`traceparent` of an unsampled span in trace `trace_id` (`_NO_TRACE`: a new one) under a new
    span id."""
    trace_id, random_id = _trace_or_new(trace_id, random_id, ids)
    return b"00-%032x-%016x-%s" % (trace_id, ids.generate_span_id(), b"02" if random_id else b"00")


class _UnsampledSpan(NonRecordingSpan):
    """The non-recording span the SDK's consumer span would be, made current for the handler by
    `with`. Its span id is drawn when first asked for: a record's handler rarely asks, and a
    `SpanContext` up front cost more than the rest of the span."""

    def __init__(self, trace_id: int, random_id: bool, ids: IdGenerator) -> None:
        self.trace, self.random_id = _trace_or_new(trace_id, random_id, ids)
        self._ids = ids
        self._context: SpanContext | None = None  # type: ignore[assignment]
        self._token: object = None

    def get_span_context(self) -> SpanContext:
        context = self._context
        if context is None:
            span_id, flags = self._ids.generate_span_id(), _ROOT_FLAGS[self.random_id]
            context = self._context = SpanContext(self.trace, span_id, is_remote=False, trace_flags=flags)
        return context

    def __enter__(self) -> _UnsampledSpan:
        self._token = otel_context.attach(trace.set_span_in_context(self, _EMPTY_CONTEXT))
        return self

    def __exit__(self, *_: object) -> None:
        otel_context.detach(self._token)  # type: ignore[arg-type]


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


def consumer_span(topic: str, headers: Headers | None) -> AbstractContextManager[Span]:
    """A span for handling one record, child of the producer's span when `traceparent` is present."""
    ids = _fast_ids
    if ids is not None:
        fast, trace_id, random_id = _remote_parent(headers)
        if fast:
            return _UnsampledSpan(trace_id, random_id, ids)
    return _sdk_consumer_span(topic, headers)


@contextmanager
def _sdk_consumer_span(topic: str, headers: Headers | None) -> Iterator[Span]:
    parent = extract(headers_carrier(headers))
    token = otel_context.attach(parent)
    try:
        with _tracer().start_as_current_span(f"process {topic}", kind=SpanKind.CONSUMER) as span:
            span.set_attribute("messaging.destination.name", topic)
            yield span
    finally:
        otel_context.detach(token)


def trace_id_of(span: Span) -> str | None:
    if type(span) is _UnsampledSpan:
        return format(span.trace, "032x")
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def current_trace_id() -> str | None:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def current_traceparent() -> str | None:
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")
