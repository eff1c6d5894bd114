"""The gateway's HTTP API (FastAPI): the OpenAI routes (`/v1/chat/completions`, `/v1/completions`,
`/v1/models`) and cachemesh's own (`/v1/cachemesh/feedback`, the end of a conversation, stats). Bodies
are read raw so whatever the upstream accepts passes through untouched; a body over its bound is a 413
before it is read whole; an optional bearer token guards every /v1 route."""

# No `from __future__ import annotations`: FastAPI reads the route functions' annotations at runtime.
import hmac
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from services.gateway import openapi
from services.gateway.answers import error_body
from services.gateway.proxy import REQUEST_MS, Proxy, problem
from services.gateway.requests import BadRequest, parse_body
from services.gateway.settings import GatewaySettings
from services.runtime.docs import serve_docs
from services.runtime.metrics import child


class PayloadTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(
    proxy: Proxy,
    settings: GatewaySettings,
    health: Callable[[], dict[str, Any]],
    status: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """`health`: the stats page; `status`: what a client gets now ({"status", "degraded"}, see
    services/gateway/health.py), on /healthz."""
    app = FastAPI(
        title="cachemesh gateway",
        version="1",
        summary="OpenAI-compatible endpoint in front of a model server, answering from the cache.",
        # served from the package instead of a CDN (services/runtime/docs.py): /docs works offline
        docs_url=None,
        redoc_url=None,
    )
    serve_docs(app)
    limit = settings.max_request_bytes

    async def complete(route: Any, request: Request) -> Response:
        try:
            raw = await read_body(request, limit)
        except PayloadTooLarge as exc:
            return problem(413, str(exc), kind="invalid_request_error", code="payload_too_large")
        started = time.perf_counter()
        try:
            return await proxy.complete(route, raw, request.headers)
        finally:
            child(REQUEST_MS, route).observe((time.perf_counter() - started) * 1000)

    @app.post(
        "/v1/chat/completions",
        summary="Chat completion, from the cache or the upstream",
        openapi_extra=openapi.body(openapi.CHAT),
    )
    async def chat_completions(request: Request) -> Response:
        return await complete("chat", request)

    @app.post(
        "/v1/completions",
        summary="Text completion, from the cache or the upstream",
        openapi_extra=openapi.body(openapi.COMPLETION),
    )
    async def completions(request: Request) -> Response:
        return await complete("completion", request)

    @app.get("/v1/models", summary="The upstream's models")
    async def models(request: Request) -> Response:
        return await proxy.models(request.headers)

    @app.post(
        "/v1/cachemesh/feedback",
        summary="That answer was wrong (or right)",
        openapi_extra=openapi.body(openapi.FEEDBACK),
    )
    async def feedback(request: Request) -> Response:
        try:
            body = parse_body(await read_body(request, 64 * 1024))
        except PayloadTooLarge as exc:
            return problem(413, str(exc), kind="invalid_request_error", code="payload_too_large")
        except BadRequest as exc:
            return problem(400, str(exc), kind="invalid_request_error")
        return await proxy.feedback(body)

    @app.delete(
        "/v1/cachemesh/conversations/{conversation_id:path}",
        summary="The conversation is over: its entries go (context.lifecycle.v1)",
        status_code=202,
    )
    async def end_conversation(conversation_id: str) -> Response:
        return await proxy.end_conversation(conversation_id)

    @app.get("/v1/cachemesh/stats", summary="Hits, misses, bypasses, breakers, conversations")
    async def stats() -> dict[str, Any]:
        return health()

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, Any]:
        # Up (200) while it answers at all; `status` says whether a client gets everything.
        return {"healthy": True, **(status() if status else {"status": "healthy", "degraded": []})}

    if settings.api_token_bytes is not None:
        app.add_middleware(BearerAuth, token=settings.api_token_bytes)
    return app


class BearerAuth:
    """Every /v1 request needs `Authorization: Bearer <token>` (constant-time compare)."""

    def __init__(self, app: ASGIApp, token: bytes) -> None:
        self.app = app
        self.expected = b"bearer " + token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            scheme, _, credentials = given.partition(b" ")
            if not hmac.compare_digest(scheme.lower() + b" " + credentials.strip(), self.expected):
                body = error_body(
                    "missing or wrong bearer token", kind="invalid_request_error", code="invalid_api_key"
                )
                response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
