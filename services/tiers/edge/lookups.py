"""The lookup routes (`POST /v1/lookup`, `/v1/lookup/batch`) and what answers them: a request's input
checked and its text embedded (by the cheap screening model first where one is loaded), then the tiered
cache's walk. `LookupFastPath` (asgi.py) answers the same paths with the same methods, ahead of FastAPI.

Responses are plain dicts serialized once (the models in models.py document them): a batch of a
thousand results through pydantic twice costs more than the lookups themselves."""

# No `from __future__ import annotations`: FastAPI reads the route functions' annotations at runtime.
import base64
from collections.abc import Awaitable
from typing import Any

import numpy as np
from fastapi import APIRouter, Response

from services.tiers.edge.asgi import encode_json
from services.tiers.edge.checks import check_text, embedding_of, problem
from services.tiers.edge.embedder import Embedder, EmbedderUnavailable
from services.tiers.edge.models import BatchBody, BatchOut, LookupBody, LookupOut
from services.tiers.entry import decode_value
from services.tiers.node.plan import Lookup, Pending
from services.tiers.node.plan import Query as CacheQuery
from services.tiers.node.tiered import TieredCache
from services.tiers.settings import TiersSettings

# Small values' dicts by content: decoding a header costs more than the rest of an exact lookup, and a
# hot key is looked up again and again. Content-addressed, so any app may share it; bounded by clearing.
_VALUE_MEMO_MAX_BLOB = 4096
_VALUE_MEMO_ENTRIES = 4096
_value_memo: dict[bytes, dict[str, Any]] = {}


def value_dict(blob: bytes) -> dict[str, Any]:
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


def lookup_dict(result: Lookup, include_value: bool, omitted: bool = False) -> dict[str, Any]:
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
        "value": value_dict(entry.blob) if entry is not None and include_value else None,
        "value_omitted": omitted,
        "explore_value": (
            value_dict(result.explore_entry.blob)
            if result.explore_entry is not None and include_value
            else None
        ),
    }


class Lookups:
    """Lookups over one node's cache. `embedder` None: lookups by text answer 503. `screen`: a cheaper
    model that embeds text lookups first (services/tiers/node/refine.py)."""

    def __init__(
        self,
        cache: TieredCache,
        settings: TiersSettings,
        embedder: Embedder | None = None,
        screen: Embedder | None = None,
    ) -> None:
        self.cache, self.settings, self.embedder, self.screen = cache, settings, embedder, screen

    def screening(self) -> Embedder | None:
        """The screen, once it loaded as a model other than the precise one (a fallback may not be)."""
        screen, embedder = self.screen, self.embedder
        if screen is None or embedder is None or screen.state != "ready":
            return None
        return screen if screen.backend != embedder.backend else None

    async def embed_texts(self, texts: list[str]) -> np.ndarray:
        if self.embedder is None:
            raise problem(503, "this node has no embedding model; send an embedding instead of text")
        try:
            return await self.embedder.embed(texts)
        except EmbedderUnavailable as exc:
            raise problem(503, f"embedding model unavailable: {exc}") from None

    def query_of(self, body: LookupBody) -> tuple[np.ndarray | None, str | None]:
        """(embedding, text to embed first) of one lookup, its input checked."""
        vec = embedding_of(body, self.settings.embedding_dim)
        if body.text is None:
            if vec is None and body.key is None:
                raise problem(422, "a lookup needs a key, an embedding or a text")
            return vec, None
        if vec is not None:
            raise problem(422, "give text or an embedding, not both")
        text = check_text(body.text, "text", self.settings.max_text_chars)
        # A key held in memory is answered exactly: no need to embed its text.
        held = body.key is not None and self.cache.holds_exact(body.key, body.model)
        return vec, None if held else text

    async def to_queries(self, bodies: list[LookupBody]) -> list[CacheQuery]:
        planned = [self.query_of(body) for body in bodies]
        vectors = [vec for vec, _ in planned]
        texts = {i: text for i, (_, text) in enumerate(planned) if text is not None}
        cheap = self.screening() if texts else None
        if texts:
            wanted, embedded = list(texts.values()), None
            if cheap is not None:
                try:
                    embedded = await cheap.embed(wanted)
                except EmbedderUnavailable:
                    cheap = None  # the precise model embeds them instead
            if embedded is None:
                embedded = await self.embed_texts(wanted)
            for i, row in zip(texts, embedded, strict=True):
                vectors[i] = row
        return [
            CacheQuery(b.key, v, b.model, b.tolerance, b.trace_id, b.text, cheap is not None and i in texts)
            for i, (b, v) in enumerate(zip(bodies, vectors, strict=True))
        ]

    def lookup_now(self, body: LookupBody) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """One lookup, answered at once where this node's memory settles it (no text to embed, an
        exact or conclusive hit in L1/L2), else what to await for it."""
        vec, text = self.query_of(body)
        if text is not None:
            return self.lookup_one(body)
        got = self.cache.begin(
            CacheQuery(body.key, vec, body.model, body.tolerance, body.trace_id, body.text)
        )
        return self.answer(body, got) if isinstance(got, Lookup) else self.lookup_rest(body, got)

    async def lookup_rest(self, body: LookupBody, pending: Pending) -> dict[str, Any]:
        return self.answer(body, await self.cache.finish(pending))

    async def lookup_one(self, body: LookupBody) -> dict[str, Any]:
        (q,) = await self.to_queries([body])
        result = await self.cache.get(
            q.key,
            q.embedding,
            model=q.model,
            tolerance=q.tolerance,
            trace_id=q.trace_id,
            text=q.text,
            screened=q.screened,
        )
        return self.answer(body, result)

    @staticmethod
    def answer(body: LookupBody, result: Lookup) -> dict[str, Any]:
        return lookup_dict(result, body.include_value, omitted=result.hit and not body.include_value)

    async def lookup_many(self, body: BatchBody) -> dict[str, Any]:
        limit = self.settings.max_batch
        if len(body.requests) > limit:
            raise problem(413, f"{len(body.requests)} lookups in one batch; the limit is {limit}")
        results = await self.cache.get_many(await self.to_queries(body.requests))
        out, budget = [], self.settings.max_request_bytes
        for req, result in zip(body.requests, results, strict=True):
            size = len(result.entry.blob) if result.entry is not None else 0
            include = req.include_value and size <= budget
            budget -= size if include else 0
            # omitted: asked without the value, or over the response budget
            out.append(lookup_dict(result, include, omitted=result.hit and not include))
        return {"results": out}


def lookup_router(lookups: Lookups) -> APIRouter:
    """The two routes document the lookups; `LookupFastPath` answers them with the same methods."""
    v1 = APIRouter(prefix="/v1")

    @v1.post("/lookup", response_model=LookupOut, summary="Look up by key, embedding or text")
    async def lookup(body: LookupBody) -> Response:
        return json_response(await lookups.lookup_one(body))

    @v1.post("/lookup/batch", response_model=BatchOut, summary="Many lookups in one call")
    async def lookup_batch(body: BatchBody) -> Response:
        return json_response(await lookups.lookup_many(body))

    return v1


def json_response(body: Any, status_code: int = 200) -> Response:
    return Response(encode_json(body), status_code=status_code, media_type="application/json")
