"""The entry routes: read, write and delete an entry by key (as JSON, or as a value in the binary
encoding), and feedback on whether an entry was the right answer to a request."""

# No `from __future__ import annotations`: FastAPI reads the route functions' annotations at runtime.
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Query, Request, Response

from schemas.events import MAX_KEY_CHARS
from services.tiers import codec
from services.tiers.edge.checks import (
    check_key,
    check_storable,
    check_text,
    embedding_of,
    encode_value,
    problem,
    unavailable,
)
from services.tiers.edge.lookups import Lookups, json_response, lookup_dict
from services.tiers.edge.models import DeleteOut, FeedbackBody, FeedbackOut, LookupOut, PutBody, PutOut
from services.tiers.entry import EntryMeta, decode_value
from services.tiers.l1.vector_index import normalize
from services.tiers.node.tiered import L3Unavailable, TieredCache
from services.tiers.ports import L3Rejected

VALUE_MEDIA_TYPE = "application/x-cachemesh-value"


async def put_through(
    cache: TieredCache, meta: EntryMeta, blob: bytes, threshold: float | None = None
) -> PutOut:
    """A write through the tiered cache, its failures as HTTP problems: 503 while L3 is unavailable
    (retry later), 422 for data Postgres refused."""
    try:
        result = await cache.put(meta, blob, invalidate_threshold=threshold)
    except L3Unavailable as exc:
        raise unavailable(cache, exc) from None
    except L3Rejected as exc:
        raise problem(422, str(exc)) from None
    return PutOut(
        key=result.key,
        size_bytes=result.size_bytes,
        tiers=list(result.tiers),
        persisted=result.persisted,
        invalidated_local=list(result.invalidated_local),
        updated_at_ms=result.updated_at_ms,
    )


def entries_router(lookups: Lookups) -> APIRouter:
    """`lookups` brings the cache, the settings and the embedding model (for `embed_text` and feedback)."""
    cache, settings = lookups.cache, lookups.settings
    v1 = APIRouter(prefix="/v1")

    @v1.get("/entries/{key:path}", response_model=LookupOut, summary="Exact-key lookup (404 on a miss)")
    async def get_entry(key: str, model: Annotated[str | None, Query()] = None) -> Response:
        check_key(key)
        check_storable(model, "model")
        result = await cache.get(key, model=model)
        return json_response(lookup_dict(result, True), status_code=200 if result.hit else 404)

    @v1.put("/entries/{key:path}", response_model=PutOut, status_code=201, summary="Write an entry")
    async def put_entry(key: str, body: PutBody) -> PutOut:
        check_key(key)
        vec = embedding_of(body, settings.embedding_dim)
        text = None
        if body.embed_text is not None:
            if vec is not None:
                raise problem(422, "give embed_text or an embedding, not both")
            text = check_text(body.embed_text, "embed_text", settings.max_text_chars)
            vec = (await lookups.embed_texts([text]))[0]
        blob = encode_value(body, settings.max_value_bytes)
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
        return await put_through(cache, meta, blob, body.invalidate_threshold)

    @v1.post(
        "/feedback",
        response_model=FeedbackOut,
        summary="Whether an entry was the right answer to a request (its text or embedding)",
    )
    async def feedback(body: FeedbackBody) -> FeedbackOut:
        vec = embedding_of(body, settings.embedding_dim)
        if body.text is not None:
            if vec is not None:
                raise problem(422, "give text or an embedding, not both")
            vec = (await lookups.embed_texts([check_text(body.text, "text", settings.max_text_chars)]))[0]
        elif vec is None:
            raise problem(422, "feedback needs the request's text or embedding")
        meta = await cache.entry_meta(body.key)
        if meta is None:
            raise problem(404, f"no entry {body.key!r}")
        if meta.embedding is None:
            raise problem(422, f"entry {body.key!r} has no embedding: it is matched by key only")
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
        check_key(key)
        try:
            return DeleteOut(key=key, deleted=await cache.delete(key))
        except L3Unavailable as exc:
            raise unavailable(cache, exc) from None

    @v1.get(
        "/values/{key:path}",
        summary="The value in the LLM-aware binary encoding (header + raw payload)",
        responses={200: {"content": {VALUE_MEDIA_TYPE: {}}}, 404: {"description": "miss"}},
    )
    async def get_value(key: str, model: Annotated[str | None, Query()] = None) -> Response:
        check_key(key)
        check_storable(model, "model")
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
        check_key(key)
        check_storable(trace_id, "trace_id")
        blob = await request.body()
        if len(blob) > settings.max_value_bytes:
            raise problem(413, f"value of {len(blob)} bytes; the limit is {settings.max_value_bytes}")
        try:
            header = decode_value(blob).header
        except codec.CodecError as exc:
            raise problem(422, f"not a cachemesh value: {exc}") from None
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
        return await put_through(cache, meta, bytes(blob))

    return v1
