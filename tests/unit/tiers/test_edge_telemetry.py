"""FastAPI (0.165+) wraps every request in its own telemetry (a span, metrics and log hooks) outside the
middleware stack; the edge's lookup paths skip it as they skip the rest of FastAPI's machinery, and
every other route keeps it."""

from __future__ import annotations

from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.types import ASGIApp, Receive, Scope, Send

from services.tiers.edge.asgi import EdgeFirst, send_json


def _app(exporter: InMemorySpanExporter) -> EdgeFirst:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = EdgeFirst(telemetry={"tracer_provider": provider, "metrics": False, "logs": False})

    def edge(inner: ASGIApp) -> ASGIApp:
        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and scope["path"] == "/fast":
                await send_json(send, 200, {"fast": True})
                return
            await inner(scope, receive, send)

        return answer

    @app.get("/slow")
    async def slow() -> dict[str, bool]:
        return {"slow": True}

    app.edge = edge
    app.edge_paths = ("/fast",)
    return app


def test_the_edge_paths_skip_fastapis_telemetry_and_other_routes_keep_it() -> None:
    exporter = InMemorySpanExporter()
    with TestClient(_app(exporter)) as client:
        assert client.get("/fast").json() == {"fast": True}
        assert exporter.get_finished_spans() == ()
        assert client.get("/slow").json() == {"slow": True}
    assert len(exporter.get_finished_spans()) >= 1
