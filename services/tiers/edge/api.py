"""The tier node's HTTP API (FastAPI; OpenAPI at /openapi.json, docs at /docs, and a copy in
`schemas/openapi/tiers.json`): lookup by key, by embedding or by text (embedded with the local
all-MiniLM-L6-v2), batch lookup, put, delete, feedback on a match, stats, and the KV-block prefix lookup
and batch fetch (prefix.py). An optional bearer token guards every /v1 route.

Bad input is a clear 4xx: 422 for a wrong embedding dimension, NaN or inf, an empty key, text or
embedding, a malformed tensor, NUL or a lone surrogate in what L3 stores; 413 for a body, value, text or
batch over its bound; 401 for a missing or wrong token. 503 when L3 cannot take writes or the embedding
model is unavailable.
"""

# No `from __future__ import annotations`: FastAPI reads the route functions' annotations at runtime.
import json
import sys
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from services.runtime.docs import serve_docs
from services.tiers.edge.asgi import BodyLimit, EdgeFirst, LookupAnswers, LookupFastPath, bearer_matches
from services.tiers.edge.embedder import Embedder
from services.tiers.edge.entries import VALUE_MEDIA_TYPE, entries_router
from services.tiers.edge.lookups import Lookups, lookup_router
from services.tiers.edge.prefix import prefix_router
from services.tiers.metrics import TIERS
from services.tiers.node.tiered import TieredCache
from services.tiers.settings import TiersSettings

__all__ = ["VALUE_MEDIA_TYPE", "create_app", "openapi_document"]

API_VERSION = "1"


def create_app(
    cache: TieredCache,
    settings: TiersSettings,
    embedder: Embedder | None = None,
    screen: Embedder | None = None,
) -> FastAPI:
    """The API over one node's tiered cache, its routes grouped by resource (lookups.py, entries.py,
    prefix.py). `embedder` None: lookups by text answer 503. `screen`: a cheaper model that embeds text
    lookups first (services/tiers/node/refine.py); writes and feedback are embedded by `embedder`."""
    token = settings.token_bytes
    lookups = Lookups(cache, settings, embedder, screen)
    app = EdgeFirst(
        title="cachemesh tiers",
        version=API_VERSION,
        summary="Semantic cache tier node: L1 cuckoo + vector index, L2 block pool, L3 Postgres.",
        max_body_size=settings.max_request_bytes,
        # served from the package instead of a CDN (services/runtime/docs.py): /docs works offline
        docs_url=None,
        redoc_url=None,
    )
    serve_docs(app)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        # The offending input is not echoed: it may be NaN (not JSON), huge, or a secret.
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    app.include_router(lookup_router(lookups))
    app.include_router(entries_router(lookups))

    @app.get("/v1/stats", summary="Tier sizes, hit rates (remote L2 too), breaker state, event queues")
    async def stats() -> dict[str, Any]:
        report = cache.stats()
        report["embedder"] = embedder.health() if embedder is not None else None
        report["screen"] = screen.health() if screen is not None else None
        return report

    app.include_router(prefix_router(cache, settings))
    _document_bearer(app)

    answers = LookupAnswers(
        lookups.lookup_now,
        lookups.lookup_many,
        latency={p: TIERS.route(settings.node_id, p) for p in LookupAnswers.PATHS},
        max_bytes=settings.max_request_bytes,
        token=token,
    )

    def edge(inner: ASGIApp) -> ASGIApp:
        outer: ASGIApp = BodyLimit(LookupFastPath(inner, answers), settings.max_request_bytes)
        return outer if token is None else BearerAuth(outer, token=token)

    app.edge = edge
    app.lookup_answers = answers  # the wire-level fast path (wire.py) answers with it too
    app.edge_paths = LookupFastPath.PATHS

    # The process's series (the node's and the runtime's), as on the metrics port: one scrape target.
    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, Any]:
        return {"healthy": True, "degraded": cache.degraded, "l2_blocks": cache.placement.l2_address}

    return app


class BearerAuth:
    """Every /v1 request needs `Authorization: Bearer <token>` (constant-time compare). Plain ASGI: on
    the lookup path a FastAPI dependency costs more than the lookup."""

    def __init__(self, app: ASGIApp, token: bytes) -> None:
        self.app = app
        self.expected = b"bearer " + token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not bearer_matches(given, self.expected):
                response = JSONResponse(
                    {"detail": "missing or wrong bearer token"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _document_bearer(app: FastAPI) -> None:
    """Declare the bearer scheme on every /v1 operation in the OpenAPI document."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schema.setdefault("components", {})["securitySchemes"] = {
                "HTTPBearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "required when CACHEMESH_TIERS_API_TOKEN is set",
                }
            }
            for path, operations in schema["paths"].items():
                if path.startswith("/v1/"):
                    for operation in operations.values():
                        operation["security"] = [{"HTTPBearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document, built from an app over empty tiers (no servers needed)."""
    from services.runtime.breaker import LatencyBreaker
    from services.tiers.l1.cache import L1Cache
    from services.tiers.node.outbox import Outbox

    settings = TiersSettings(api_token=None)
    cache = TieredCache(
        l1=L1Cache(dim=settings.embedding_dim, capacity_bytes=1 << 20, max_entries=16),
        l2=None,
        l3=None,
        outbox=Outbox(clock=lambda: 0),
        breaker=LatencyBreaker(clock=lambda: 0),
        node_id="openapi",
    )
    return create_app(cache, settings).openapi()


if __name__ == "__main__":
    # `python -m services.tiers.edge.api > schemas/openapi/tiers.json` refreshes the published copy.
    json.dump(openapi_document(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
