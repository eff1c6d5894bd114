"""The tier node's ASGI edge, in front of FastAPI's whole middleware stack: the JSON body limit and the
lookup fast path (POST /v1/lookup and /v1/lookup/batch), where FastAPI's machinery costs more than an
exact lookup; JSON encoded once, with orjson, and sent as bare ASGI messages."""

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, HTTPException
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.tiers.edge.models import BatchBody, LookupBody
from services.tiers.metrics import LatencyMs

log = logging.getLogger(__name__)


def encode_json(body: Any) -> bytes:
    # orjson: a tenth of json.dumps' cost on a lookup result; NaN and inf come out as null, not as
    # invalid JSON.
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def bearer_matches(authorization: bytes, expected: bytes) -> bool:
    """Whether an Authorization header value carries `expected` (b"bearer " + token): the scheme in any
    casing, compared in constant time."""
    scheme, _, credentials = authorization.partition(b" ")
    return hmac.compare_digest(scheme.lower() + b" " + credentials.strip(), expected)


async def send_json(send: Send, status_code: int, body: Any) -> None:
    """A JSON response as bare ASGI messages (no Response object: the lookup path counts microseconds)."""
    await send_raw_json(send, status_code, encode_json(body))


async def send_raw_json(send: Send, status_code: int, raw: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status_code,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(raw))],
        }
    )
    await send({"type": "http.response.body", "body": raw})


class EdgeFirst(FastAPI):
    """FastAPI with `edge` in front of its whole middleware stack (error pages, body limit, exception
    handlers): the lookups answered there skip a stack that costs more than they do."""

    edge: Callable[[ASGIApp], ASGIApp] | None = None
    # Paths the edge answers whole: FastAPI's own telemetry (0.165+: a span, metrics and log hooks per
    # request, wrapped around the app outside its middleware stack) is skipped for them too.
    edge_paths: tuple[str, ...] = ()
    # What the wire-level fast path (wire.py) answers the lookups with, below uvicorn's ASGI cycle.
    lookup_answers: "LookupAnswers | None" = None

    def build_middleware_stack(self) -> ASGIApp:
        inner = super().build_middleware_stack()
        return inner if self.edge is None else self.edge(inner)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") in self.edge_paths:
            if self.root_path:
                scope["root_path"] = self.root_path
            await Starlette.__call__(self, scope, receive, send)
            return
        await super().__call__(scope, receive, send)


class BodyLimit:
    """Refuses a request body over `max_bytes` with a JSON 413 that says so, by its Content-Length before
    anything reads it, or as a chunked body arrives (starlette's own limit behind it answers in plain
    text)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is None:
            receive = self._counting(receive)
        elif length.isdigit() and int(length) > self.max_bytes:
            detail = f"request body of {int(length)} bytes; the limit is {self.max_bytes}"
            await send_json(send, 413, {"detail": detail})
            return
        await self.app(scope, receive, send)

    def _counting(self, receive: Receive) -> Receive:
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise HTTPException(413, f"request body over the limit of {self.max_bytes} bytes")
            return message

        return counted


class LookupAnswers:
    """The lookup routes' answers (POST /v1/lookup and /v1/lookup/batch) from the raw request body to the
    encoded response: the body is validated by pydantic straight from JSON, errors come out as the routes'
    would. Shared by the ASGI fast path below and the wire-level one (`wire.py`).

    `one` answers a lookup at once where the node's memory settles it (a dict), else returns what to
    await for it (the text to embed, the peers, L3); `many` is awaited."""

    PATHS = ("/v1/lookup", "/v1/lookup/batch")

    def __init__(
        self,
        one: Callable[[LookupBody], dict[str, Any] | Awaitable[dict[str, Any]]],
        many: Callable[[BatchBody], Awaitable[dict[str, Any]]],
        latency: dict[str, LatencyMs] | None = None,
        *,
        max_bytes: int,
        token: bytes | None = None,
    ) -> None:
        self.one = one
        self.many = many
        self.latency = latency or {}  # by path: the request's time here, body read to answer sent
        self.max_bytes = max_bytes  # what BodyLimit refuses (the wire path leaves such a request to it)
        # what BearerAuth asks for (likewise), as it compares it
        self.bearer = None if token is None else b"bearer " + token

    def answer_now(self, path: str, body: bytes) -> tuple[int, bytes] | Awaitable[tuple[int, bytes]]:
        """(status, JSON) for `body` posted to `path` (one of PATHS) where no wait is needed (a lookup
        this node's memory answers, a refused request), else an awaitable of it."""
        try:
            if path != "/v1/lookup":
                return self._settle(path, self.many(BatchBody.model_validate_json(body)))
            got = self.one(LookupBody.model_validate_json(body))
            if not isinstance(got, dict):
                return self._settle(path, got)
            status, payload = 200, got
        except Exception as exc:
            status, payload = _refusal(exc, path)
        return status, encode_json(payload)

    async def answer(self, path: str, body: bytes) -> tuple[int, bytes]:
        """(status, JSON) for `body` posted to `path` (one of PATHS)."""
        got = self.answer_now(path, body)
        return got if isinstance(got, tuple) else await got

    async def _settle(self, path: str, pending: Awaitable[dict[str, Any]]) -> tuple[int, bytes]:
        try:
            status, payload = 200, await pending
        except Exception as exc:
            status, payload = _refusal(exc, path)
        return status, encode_json(payload)

    def observe(self, path: str, started_ns: int) -> None:
        hist = self.latency.get(path)
        if hist is not None:
            hist.observe((time.perf_counter_ns() - started_ns) / 1e6)


def _refusal(exc: Exception, path: str) -> tuple[int, Any]:
    """(status, payload) for a lookup that raised: what the routes would answer."""
    if isinstance(exc, ValidationError):
        detail = [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return 422, {"detail": detail}
    if isinstance(exc, HTTPException):
        return exc.status_code, {"detail": exc.detail}
    # in front of FastAPI's error middleware: a bug here still answers, and is logged
    log.error("lookup failed", extra={"path": path}, exc_info=exc)
    return 500, {"detail": "internal error (logged by the node)"}


class LookupFastPath:
    """Answers the lookup routes (`LookupAnswers`) in front of FastAPI's middleware, routing and
    dependency machinery (on this path it costs more than the lookup itself). Everything else goes to
    the app."""

    PATHS = LookupAnswers.PATHS

    def __init__(self, app: ASGIApp, answers: LookupAnswers) -> None:
        self.app = app
        self.answers = answers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.PATHS:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter_ns()
        chunks = []
        try:
            while True:  # `BodyLimit` wraps `receive` and raises a 413 past the limit
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
        except HTTPException as exc:
            await send_json(send, exc.status_code, {"detail": exc.detail})
            return
        status, raw = await self.answers.answer(scope["path"], b"".join(chunks))
        await send_raw_json(send, status, raw)
        self.answers.observe(scope["path"], started)
