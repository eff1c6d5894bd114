"""The tier node's HTTP API (FastAPI; OpenAPI at /openapi.json, docs at /docs, and a copy in
`schemas/openapi/tiers.json`): lookup by key, by embedding or by text (embedded with the local
all-MiniLM-L6-v2), batch lookup, put, delete, feedback on a match, stats, and the KV-block prefix lookup
and batch fetch (prefix.py). An optional bearer token guards every /v1 route.

Bad input is a clear 4xx: 422 for a wrong embedding dimension, NaN or inf, an empty key, text or
embedding, a malformed tensor, NUL or a lone surrogate in what L3 stores; 413 for a body, value, text or
batch over its bound; 401 for a missing or wrong token. 503 when L3 cannot take writes or the embedding
model is unavailable.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations of the nested route functions
# at runtime, and they name locals of create_app.
import base64
import binascii
import json
import math
import sys
from collections.abc import Awaitable
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from schemas.events import MAX_KEY_CHARS
from services.runtime.docs import serve_docs
from services.tiers import codec
from services.tiers.edge.asgi import (
    BodyLimit,
    EdgeFirst,
    LookupAnswers,
    LookupFastPath,
    bearer_matches,
    encode_json,
)
from services.tiers.edge.embedder import Embedder, EmbedderUnavailable
from services.tiers.edge.models import (
    BatchBody,
    BatchOut,
    DeleteOut,
    EmbeddingFields,
    FeedbackBody,
    FeedbackOut,
    LookupBody,
    LookupOut,
    PutBody,
    PutOut,
    TensorIn,
    storable,
)
from services.tiers.edge.prefix import prefix_router
from services.tiers.entry import EntryMeta, decode_value, encode_array, encode_text
from services.tiers.l1.vector_index import normalize
from services.tiers.metrics import TIERS
from services.tiers.node.plan import Lookup, Pending
from services.tiers.node.plan import Query as CacheQuery
from services.tiers.node.tiered import L3Unavailable, TieredCache
from services.tiers.ports import L3Rejected
from services.tiers.settings import TiersSettings

API_VERSION = "1"
VALUE_MEDIA_TYPE = "application/x-cachemesh-value"
_DTYPES: dict[str, codec.DType] = {d.name.lower(): d for d in codec.DType}


def _problem(code: int, message: str) -> HTTPException:
    return HTTPException(status_code=code, detail=message)


def _unavailable(cache: TieredCache, exc: L3Unavailable) -> HTTPException:
    """503 with Retry-After: when L3's breaker may let the write through again (at least 1 s)."""
    retry_s = max(1, math.ceil(cache.breaker.retry_after_ms() / 1000))
    return HTTPException(status_code=503, detail=str(exc), headers={"Retry-After": str(retry_s)})


def _embedding(fields: EmbeddingFields, dim: int) -> np.ndarray | None:
    if fields.embedding is not None and fields.embedding_b64 is not None:
        raise _problem(422, "give embedding or embedding_b64, not both")
    if fields.embedding is not None:
        with np.errstate(over="ignore"):  # beyond float32 becomes inf, refused below
            vec = np.asarray(fields.embedding, dtype=np.float32)
    elif fields.embedding_b64 is not None:
        try:
            raw = base64.b64decode(fields.embedding_b64, validate=True)
        except (binascii.Error, ValueError):
            raise _problem(422, "embedding_b64 is not valid base64") from None
        if len(raw) % 4:
            raise _problem(422, f"embedding_b64 holds {len(raw)} bytes, not a whole number of float32")
        vec = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    else:
        return None
    if vec.size == 0:
        raise _problem(422, "embedding is empty")
    if vec.shape != (dim,):
        raise _problem(422, f"embedding has {vec.size} dimensions; this cache uses {dim}")
    if not np.all(np.isfinite(vec)):
        raise _problem(422, "embedding must contain only finite numbers (no NaN or inf)")
    if not np.any(vec):
        raise _problem(422, "embedding is all zeros: it has no direction to compare")
    return vec


def _check_text(text: str, field: str, max_chars: int) -> str:
    if not text.strip():
        raise _problem(422, f"{field} is empty")
    if len(text) > max_chars:
        raise _problem(413, f"{field} has {len(text)} characters; the limit is {max_chars}")
    return text


def _tensor(t: TensorIn, max_bytes: int) -> tuple[np.ndarray, codec.DType]:
    wire = _DTYPES[t.dtype]
    itemsize = codec.CARRIER[wire].itemsize
    count = math.prod(t.shape)
    if count * itemsize > max_bytes:
        raise _problem(413, f"tensor of {count * itemsize} bytes; the limit is {max_bytes}")
    try:
        raw = base64.b64decode(t.data_b64, validate=True)
    except (binascii.Error, ValueError):
        raise _problem(422, "tensor data_b64 is not valid base64") from None
    if len(raw) != count * itemsize:
        raise _problem(
            422, f"tensor data has {len(raw)} bytes; shape {t.shape} of {t.dtype} needs {count * itemsize}"
        )
    array = np.frombuffer(raw, dtype=codec.CARRIER[wire]).reshape(t.shape)
    if wire in (codec.DType.FLOAT32, codec.DType.FLOAT16) and not np.all(np.isfinite(array)):
        raise _problem(422, "tensor must contain only finite numbers (no NaN or inf)")
    return array, wire


# Lookup responses are built as plain dicts and serialized once (the models above document them): a
# batch of a thousand results through pydantic twice costs more than the lookups themselves.


# Small values' dicts by content: decoding a header costs more than the rest of an exact lookup, and a
# hot key is looked up again and again. Content-addressed, so any app may share it; bounded by clearing.
_VALUE_MEMO_MAX_BLOB = 4096
_VALUE_MEMO_ENTRIES = 4096
_value_memo: dict[bytes, dict[str, Any]] = {}


def _value_dict(blob: bytes) -> dict[str, Any]:
    """The value as the API shows it (shared when memoised: read it, do not change it)."""
    memo = len(blob) <= _VALUE_MEMO_MAX_BLOB
    if memo and (known := _value_memo.get(blob)) is not None:
        return known
    out = _decode_value_dict(blob)
    if memo:
        if len(_value_memo) >= _VALUE_MEMO_ENTRIES:
            _value_memo.clear()
        _value_memo[blob] = out
    return out


def _decode_value_dict(blob: bytes) -> dict[str, Any]:
    v = decode_value(blob, verify=False)  # verified when it entered the cache
    h = v.header
    text = v.text
    return {
        "kind": h.kind,
        "model": h.model,
        "dtype": h.dtype.name.lower(),
        "shape": list(h.shape),
        "layer_range": list(h.layer_range),
        "token_range": list(h.token_range),
        "checksum": h.checksum,
        "size_bytes": len(blob),
        "text": text,
        "data_b64": None if text is not None else base64.b64encode(v.array.data).decode(),
    }


async def _put(cache: TieredCache, meta: EntryMeta, blob: bytes, threshold: float | None = None) -> PutOut:
    """A write through the tiered cache, its failures as HTTP problems: 503 while L3 is unavailable
    (retry later), 422 for data Postgres refused."""
    try:
        result = await cache.put(meta, blob, invalidate_threshold=threshold)
    except L3Unavailable as exc:
        raise _unavailable(cache, exc) from None
    except L3Rejected as exc:
        raise _problem(422, str(exc)) from None
    return PutOut(
        key=result.key,
        size_bytes=result.size_bytes,
        tiers=list(result.tiers),
        persisted=result.persisted,
        invalidated_local=list(result.invalidated_local),
        updated_at_ms=result.updated_at_ms,
    )


def _lookup_dict(result: Lookup, include_value: bool, omitted: bool = False) -> dict[str, Any]:
    entry = result.entry
    return {
        "hit": entry is not None,
        "key": None if entry is None else entry.key,
        "tier": result.tier,
        "match": result.match,
        # A cosine of float32 unit vectors can read 1.0000001: reported within [-1, 1].
        "similarity": None if result.similarity is None else max(-1.0, min(1.0, result.similarity)),
        "latency_us": result.latency_us,
        "degraded": result.degraded,
        "remote": result.remote,
        "peer": result.peer,
        "explore_key": result.explore_key,
        "miss_rule": result.miss_rule,
        "miss_reason": result.miss_reason,
        "descriptor": None if entry is None else entry.meta.as_dict(),
        "value": _value_dict(entry.blob) if entry is not None and include_value else None,
        "value_omitted": omitted,
        "explore_value": (
            _value_dict(result.explore_entry.blob)
            if result.explore_entry is not None and include_value
            else None
        ),
    }


def _json(body: Any, status_code: int = 200) -> Response:
    return Response(encode_json(body), status_code=status_code, media_type="application/json")


def create_app(
    cache: TieredCache,
    settings: TiersSettings,
    embedder: Embedder | None = None,
    screen: Embedder | None = None,
) -> FastAPI:
    """The API over one node's tiered cache. `embedder` None: lookups by text answer 503. `screen`: a
    cheaper model that embeds text lookups first (services/tiers/node/refine.py); writes and feedback
    are embedded by `embedder`."""
    dim = settings.embedding_dim
    token = settings.token_bytes

    def screening() -> Embedder | None:
        """The screen, once it loaded as a model other than the precise one (a fallback may not be)."""
        if screen is None or embedder is None or screen.state != "ready":
            return None
        return screen if screen.backend != embedder.backend else None

    async def embed_texts(texts: list[str]) -> np.ndarray:
        if embedder is None:
            raise _problem(503, "this node has no embedding model; send an embedding instead of text")
        try:
            return await embedder.embed(texts)
        except EmbedderUnavailable as exc:
            raise _problem(503, f"embedding model unavailable: {exc}") from None

    def query_of(body: LookupBody) -> tuple[np.ndarray | None, str | None]:
        """(embedding, text to embed first) of one lookup, its input checked."""
        vec = _embedding(body, dim)
        if body.text is None:
            if vec is None and body.key is None:
                raise _problem(422, "a lookup needs a key, an embedding or a text")
            return vec, None
        if vec is not None:
            raise _problem(422, "give text or an embedding, not both")
        text = _check_text(body.text, "text", settings.max_text_chars)
        # A key held in memory is answered exactly: no need to embed its text.
        held = body.key is not None and cache.holds_exact(body.key, body.model)
        return vec, None if held else text

    async def to_queries(bodies: list[LookupBody]) -> list[CacheQuery]:
        planned = [query_of(body) for body in bodies]
        vectors = [vec for vec, _ in planned]
        texts = {i: text for i, (_, text) in enumerate(planned) if text is not None}
        cheap = screening() if texts else None
        if texts:
            wanted, embedded = list(texts.values()), None
            if cheap is not None:
                try:
                    embedded = await cheap.embed(wanted)
                except EmbedderUnavailable:
                    cheap = None  # the precise model embeds them instead
            if embedded is None:
                embedded = await embed_texts(wanted)
            for i, row in zip(texts, embedded, strict=True):
                vectors[i] = row
        return [
            CacheQuery(b.key, v, b.model, b.tolerance, b.trace_id, b.text, cheap is not None and i in texts)
            for i, (b, v) in enumerate(zip(bodies, vectors, strict=True))
        ]

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

    v1 = APIRouter(prefix="/v1")

    def lookup_now(body: LookupBody) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """One lookup, answered at once where this node's memory settles it (no text to embed, an
        exact or conclusive hit in L1/L2), else what to await for it."""
        vec, text = query_of(body)
        if text is not None:
            return lookup_one(body)
        got = cache.begin(
            body.key, vec, model=body.model, tolerance=body.tolerance, trace_id=body.trace_id, text=body.text
        )
        return lookup_dict(body, got) if isinstance(got, Lookup) else lookup_rest(body, got)

    async def lookup_rest(body: LookupBody, pending: Pending) -> dict[str, Any]:
        return lookup_dict(body, await cache.finish(pending))

    async def lookup_one(body: LookupBody) -> dict[str, Any]:
        (q,) = await to_queries([body])
        result = await cache.get(
            q.key,
            q.embedding,
            model=q.model,
            tolerance=q.tolerance,
            trace_id=q.trace_id,
            text=q.text,
            screened=q.screened,
        )
        return lookup_dict(body, result)

    def lookup_dict(body: LookupBody, result: Lookup) -> dict[str, Any]:
        return _lookup_dict(result, body.include_value, omitted=result.hit and not body.include_value)

    async def lookup_many(body: BatchBody) -> dict[str, Any]:
        if len(body.requests) > settings.max_batch:
            raise _problem(
                413, f"{len(body.requests)} lookups in one batch; the limit is {settings.max_batch}"
            )
        results = await cache.get_many(await to_queries(body.requests))
        out, budget = [], settings.max_request_bytes
        for req, result in zip(body.requests, results, strict=True):
            size = len(result.entry.blob) if result.entry is not None else 0
            include = req.include_value and size <= budget
            budget -= size if include else 0
            out.append(
                # omitted: asked without the value, or over the response budget
                _lookup_dict(result, include, omitted=result.hit and not include)
            )
        return {"results": out}

    # The two routes below document the lookups; `LookupFastPath` answers them with the same functions.
    @v1.post("/lookup", response_model=LookupOut, summary="Look up by key, embedding or text")
    async def lookup(body: LookupBody) -> Response:
        return _json(await lookup_one(body))

    @v1.post("/lookup/batch", response_model=BatchOut, summary="Many lookups in one call")
    async def lookup_batch(body: BatchBody) -> Response:
        return _json(await lookup_many(body))

    @v1.get("/entries/{key:path}", response_model=LookupOut, summary="Exact-key lookup (404 on a miss)")
    async def get_entry(key: str, model: Annotated[str | None, Query()] = None) -> Response:
        _check_key(key)
        _check_storable(model, "model")
        result = await cache.get(key, model=model)
        return _json(_lookup_dict(result, True), status_code=200 if result.hit else 404)

    @v1.put("/entries/{key:path}", response_model=PutOut, status_code=201, summary="Write an entry")
    async def put_entry(key: str, body: PutBody) -> PutOut:
        _check_key(key)
        vec = _embedding(body, dim)
        text = None
        if body.embed_text is not None:
            if vec is not None:
                raise _problem(422, "give embed_text or an embedding, not both")
            text = _check_text(body.embed_text, "embed_text", settings.max_text_chars)
            vec = (await embed_texts([text]))[0]
        blob = _encode_value(body, settings.max_value_bytes)
        meta = EntryMeta(
            key=key,
            kind=body.kind,
            model=body.model,
            embedding=vec,
            similarity_tolerance=(
                settings.default_similarity_tolerance
                if body.similarity_tolerance is None
                else body.similarity_tolerance
            ),
            ttl_hint_ms=body.ttl_hint_ms,
            trace_id=body.trace_id,
            context_dependency_ids=tuple(body.context_dependency_ids),
            semantic_tags=dict(body.semantic_tags),
            prompt_text=text,
        )
        return await _put(cache, meta, blob, body.invalidate_threshold)

    @v1.post(
        "/feedback",
        response_model=FeedbackOut,
        summary="Whether an entry was the right answer to a request (its text or embedding)",
    )
    async def feedback(body: FeedbackBody) -> FeedbackOut:
        vec = _embedding(body, dim)
        if body.text is not None:
            if vec is not None:
                raise _problem(422, "give text or an embedding, not both")
            vec = (await embed_texts([_check_text(body.text, "text", settings.max_text_chars)]))[0]
        elif vec is None:
            raise _problem(422, "feedback needs the request's text or embedding")
        meta = await cache.entry_meta(body.key)
        if meta is None:
            raise _problem(404, f"no entry {body.key!r}")
        if meta.embedding is None:
            raise _problem(422, f"entry {body.key!r} has no embedding: it is matched by key only")
        sim = float(np.clip(normalize(meta.embedding)[0] @ normalize(vec)[0], -1.0, 1.0))
        learned = cache.matcher.teaches(meta, body.text)
        if learned:
            cache.matcher.feedback(meta, sim, body.correct, explored=body.explored)
        return FeedbackOut(
            key=body.key,
            similarity=sim,
            correct=body.correct,
            learned=learned,
            labels=cache.matcher.labels(meta.key),
            threshold=cache.matcher.threshold(meta),
        )

    @v1.delete("/entries/{key:path}", response_model=DeleteOut, summary="Delete everywhere")
    async def delete_entry(key: str) -> DeleteOut:
        _check_key(key)
        try:
            return DeleteOut(key=key, deleted=await cache.delete(key))
        except L3Unavailable as exc:
            raise _unavailable(cache, exc) from None

    @v1.get(
        "/values/{key:path}",
        summary="The value in the LLM-aware binary encoding (header + raw payload)",
        responses={200: {"content": {VALUE_MEDIA_TYPE: {}}}, 404: {"description": "miss"}},
    )
    async def get_value(key: str, model: Annotated[str | None, Query()] = None) -> Response:
        _check_key(key)
        _check_storable(model, "model")
        result = await cache.get(key, model=model)
        if result.entry is None:
            return Response(status_code=404)
        headers = {"X-Cachemesh-Tier": str(result.tier)}
        if result.peer is not None:
            headers["X-Cachemesh-Peer"] = result.peer
        return Response(result.entry.blob, media_type=VALUE_MEDIA_TYPE, headers=headers)

    @v1.put(
        "/values/{key:path}",
        response_model=PutOut,
        status_code=201,
        summary="Write a value already in the binary encoding (kind and model come from its header)",
        openapi_extra={"requestBody": {"content": {VALUE_MEDIA_TYPE: {}}, "required": True}},
    )
    async def put_value(
        key: str,
        request: Request,
        ttl_hint_ms: Annotated[int | None, Query(gt=0)] = None,
        trace_id: Annotated[str | None, Query(min_length=1, max_length=MAX_KEY_CHARS)] = None,
        similarity_tolerance: Annotated[float | None, Query(ge=0.0, le=1.0)] = None,
    ) -> PutOut:
        _check_key(key)
        _check_storable(trace_id, "trace_id")
        blob = await request.body()
        if len(blob) > settings.max_value_bytes:
            raise _problem(413, f"value of {len(blob)} bytes; the limit is {settings.max_value_bytes}")
        try:
            header = decode_value(blob).header
        except codec.CodecError as exc:
            raise _problem(422, f"not a cachemesh value: {exc}") from None
        meta = EntryMeta(
            key=key,
            kind=header.kind,
            model=header.model or "unknown",
            similarity_tolerance=(
                settings.default_similarity_tolerance
                if similarity_tolerance is None
                else similarity_tolerance
            ),
            ttl_hint_ms=ttl_hint_ms,
            trace_id=trace_id,
        )
        return await _put(cache, meta, bytes(blob))

    @v1.get("/stats", summary="Tier sizes, hit rates (remote L2 too), breaker state, event queues")
    async def stats() -> dict[str, Any]:
        report = cache.stats()
        report["embedder"] = embedder.health() if embedder is not None else None
        report["screen"] = screen.health() if screen is not None else None
        return report

    app.include_router(v1)
    app.include_router(prefix_router(cache, settings))
    _document_bearer(app)

    answers = LookupAnswers(
        lookup_now,
        lookup_many,
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
        return {"healthy": True, "degraded": cache.degraded, "l2_blocks": cache.l2_address}

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


def _check_key(key: str) -> None:
    if not key:
        raise _problem(422, "key is empty")
    if len(key) > MAX_KEY_CHARS:
        raise _problem(413, f"key has {len(key)} characters; the limit is {MAX_KEY_CHARS}")
    _check_storable(key, "key")


def _check_storable(text: str | None, field: str) -> None:
    """A path or query string L3 can store (the bodies' fields are checked by their models)."""
    if text is not None:
        try:
            storable(text)
        except ValueError as exc:
            raise _problem(422, f"{field} {exc}") from None


def _encode_value(body: PutBody, max_bytes: int) -> bytes:
    value = body.value
    if (value.text is None) == (value.tensor is None):
        raise _problem(422, "value needs exactly one of text or tensor")
    if value.text is not None:
        size = len(value.text.encode())
        if size > max_bytes:
            raise _problem(413, f"value text is {size} bytes; the limit is {max_bytes}")
        if body.kind != "prompt":
            raise _problem(422, "a text value is a prompt answer: kind must be 'prompt'")
        return encode_text(value.text, model=body.model)
    assert value.tensor is not None
    array, wire = _tensor(value.tensor, max_bytes)
    lo, hi = body.layer_range
    t0, t1 = body.token_range
    if lo > hi or t0 > t1:
        raise _problem(422, "layer_range and token_range must be [start, end] with start <= end")
    try:
        return encode_array(
            array, kind=body.kind, model=body.model, layer_range=(lo, hi), token_range=(t0, t1), dtype=wire
        )
    except codec.CodecError as exc:
        raise _problem(422, str(exc)) from None


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
