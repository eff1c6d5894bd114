"""Spans leave a service over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set: a real collector
stand-in (an HTTP server on 127.0.0.1 that decodes the protobuf body) receives the span a service
records, with the service's name."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from services.runtime import tracing

pytestmark = pytest.mark.integration


@pytest.fixture
def collector() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    received: list[ExportTraceServiceRequest] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/traces":
                received.append(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def test_a_recorded_span_reaches_the_collector(
    collector: tuple[str, list[ExportTraceServiceRequest]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, received = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    provider = tracing.tracer_provider("otlp-test")
    with provider.get_tracer("test").start_as_current_span("lookup") as span:
        span.set_attribute("cachemesh.key", "k1")
    assert provider.force_flush(10_000)
    provider.shutdown()
    spans = [
        (s.name, rs.resource)
        for req in received
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]
    assert [name for name, _ in spans] == ["lookup"]
    attrs = {a.key: a.value.string_value for a in spans[0][1].attributes}
    assert attrs["service.name"] == "otlp-test"
