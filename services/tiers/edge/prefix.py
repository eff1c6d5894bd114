"""The KV-block routes of the tier node's API: how much of a prompt's KV a node already holds, and the
blocks themselves in one call (LMCache's `lookup` / `retrieve`, Mooncake's batch get, over HTTP).

POST /v1/prefix takes a chain of block keys in prompt order and answers the longest cached prefix (a
block after the first miss is of no use to the engine: its attention needs every block before it),
with the tier and node of each block in it. POST /v1/blocks/fetch answers many blocks' values in one
binary body (blockframe.py documents it). Both take at most `max_batch` keys (413 beyond); the fetch
stops adding values once the body would pass `max_request_bytes` (those blocks come back "omitted").
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations at runtime.
from typing import Any

from fastapi import APIRouter, HTTPException, Response

from services.tiers.edge.blockframe import MEDIA_TYPE, FetchedBlock, encode_blocks
from services.tiers.edge.models import FetchBody, PrefixBody, PrefixOut
from services.tiers.node.plan import Lookup, Query
from services.tiers.node.tiered import TieredCache
from services.tiers.settings import TiersSettings


def longest_prefix(results: list[Lookup]) -> int:
    """How many leading lookups hit."""
    for i, result in enumerate(results):
        if result.entry is None:
            return i
    return len(results)


def prefix_router(cache: TieredCache, settings: TiersSettings) -> APIRouter:
    router = APIRouter(prefix="/v1")

    def check_size(keys: list[str]) -> None:
        if len(keys) > settings.max_batch:
            raise HTTPException(413, f"{len(keys)} keys in one request; the limit is {settings.max_batch}")

    @router.post(
        "/prefix", response_model=PrefixOut, summary="The longest cached prefix of a chain of KV blocks"
    )
    async def prefix(body: PrefixBody) -> dict[str, Any]:
        check_size(body.keys)
        # One batched walk of every tier (peers and L3 included) for the whole chain.
        results = await cache.get_many([Query(key=k, model=body.model) for k in body.keys])
        n = longest_prefix(results)
        blocks = []
        for key, result in zip(body.keys[:n], results[:n], strict=True):
            assert result.entry is not None
            blocks.append(
                {
                    "key": key,
                    "tier": result.tier,
                    "node": result.peer if result.remote and result.peer else cache.node_id,
                    "remote": result.remote,
                    "size_bytes": len(result.entry.blob),
                }
            )
        return {
            "requested": len(body.keys),
            "prefix_blocks": n,
            "prefix_tokens": None if body.block_size_tokens is None else n * body.block_size_tokens,
            "first_miss": body.keys[n] if n < len(body.keys) else None,
            "blocks": blocks,
        }

    @router.post(
        "/blocks/fetch",
        summary="Many blocks' values in one binary body (length-prefixed records, in request order)",
        responses={
            200: {"content": {MEDIA_TYPE: {}}, "description": "see services/tiers/edge/blockframe.py"}
        },
    )
    async def fetch_blocks(body: FetchBody) -> Response:
        check_size(body.keys)
        results = await cache.get_many([Query(key=k, model=body.model) for k in body.keys])
        budget = settings.max_request_bytes
        out = []
        for key, result in zip(body.keys, results, strict=True):
            if result.entry is None:
                out.append(FetchedBlock(key, "miss"))
            elif len(result.entry.blob) > budget:
                out.append(FetchedBlock(key, "omitted", result.tier))
            else:
                budget -= len(result.entry.blob)
                out.append(FetchedBlock(key, "hit", result.tier, result.entry.blob))
        return Response(encode_blocks(out), media_type=MEDIA_TYPE)

    return router
