"""The KV-block routes of the tier node's API: how much of a prompt's KV a node already holds, and the
blocks themselves in one call (LMCache's `lookup` / `retrieve`, Mooncake's batch get, over HTTP).

POST /v1/prefix, /v1/blocks/fetch, /v1/blocks/locate and /v1/blocks/put; what each takes and answers:
docs/tiers.md ("The KV-block routes").
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations at runtime.
from typing import Any

from cachemesh_client.kvkeys import KEY_PREFIX
from fastapi import APIRouter, HTTPException, Request, Response
from starlette.types import Receive, Scope, Send

from services.tiers.codec import CodecError
from services.tiers.edge.blockframe import MEDIA_TYPE, FetchedBlock, FrameError, frame_parts, parse_blocks
from services.tiers.edge.models import BlocksPutOut, FetchBody, LocateOut, PrefixBody, PrefixOut
from services.tiers.entry import EntryMeta, decode_value
from services.tiers.l2.block_pool import UNIT_BYTES
from services.tiers.node.plan import Lookup, Query
from services.tiers.node.tiered import TieredCache
from services.tiers.settings import TiersSettings


class FrameResponse(Response):
    """A block frame sent part by part: 64 KV blocks are 17 MB that joining would copy once more."""

    media_type = MEDIA_TYPE

    def __init__(self, parts: list[bytes | memoryview]) -> None:
        super().__init__(media_type=MEDIA_TYPE)
        self.parts = parts
        self.headers["content-length"] = str(sum(len(p) for p in parts))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        for part in self.parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


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
        # What this node's memory holds is answered from its descriptors; the rest (peers, L3) by one
        # batched walk of the remaining tiers.
        local = cache.held_locally(body.keys, body.model)
        blocks = [
            {"key": k, "tier": tier, "node": cache.node_id, "remote": False, "size_bytes": size}
            for k, (tier, size) in zip(body.keys, local, strict=False)
        ]
        rest = body.keys[len(local) :]
        results = await cache.get_many([Query(key=k, model=body.model) for k in rest]) if rest else []
        for key, result in zip(rest[: longest_prefix(results)], results, strict=False):
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
        n = len(blocks)
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
        return FrameResponse(frame_parts(out))

    @router.post(
        "/blocks/locate",
        response_model=LocateOut,
        summary="Where the leading blocks of a chain lie in this node's shared L2 pool (same host only)",
    )
    async def locate_blocks(body: FetchBody) -> dict[str, Any]:
        check_size(body.keys)
        pool = cache.l2.pool if cache.l2 is not None else None
        segment = None if pool is None else pool.segment
        located = cache.locate_prefix(body.keys, body.model) if segment is not None else []
        return {
            "segment": segment,
            "segment_bytes": 0 if pool is None else pool.total_bytes,
            "blocks": [
                {
                    "key": key,
                    "spans": [(s.block_id * UNIT_BYTES, s.length) for s in loc.spans],
                    "nbytes": loc.nbytes,
                    "crc32": loc.crc32,
                }
                for key, loc in zip(body.keys, located, strict=False)
            ],
        }

    @router.post(
        "/blocks/put",
        response_model=BlocksPutOut,
        summary="Write many KV blocks in one binary body (content-addressed: a block held already stays)",
        openapi_extra={"requestBody": {"content": {MEDIA_TYPE: {}}, "required": True}},
    )
    async def put_blocks(request: Request) -> dict[str, Any]:
        try:
            records = parse_blocks(await request.body())
        except FrameError as exc:
            raise HTTPException(422, f"not a block frame: {exc}") from None
        check_size([r.key for r in records])
        items = [(block_meta(r, settings), bytes(r.value)) for r in records]
        results = await cache.put_blocks(items)
        return {
            "stored": sum(r.status == "stored" for r in results),
            "present": sum(r.status == "present" for r in results),
            "results": [{"key": r.key, "status": r.status, "tiers": list(r.tiers)} for r in results],
        }

    return router


def block_meta(record: FetchedBlock, settings: TiersSettings) -> EntryMeta:
    """The descriptor of one record of a block write, or the 4xx that says what is wrong with it."""
    key = record.key
    if not key.startswith(KEY_PREFIX) or len(key) > 200:
        raise HTTPException(422, f"{key[:80]!r} is not a KV block key ({KEY_PREFIX}<digest>)")
    if record.status != "hit":
        raise HTTPException(422, f"block {key}: a write carries values (status hit), not {record.status}")
    if len(record.value) > settings.max_value_bytes:
        raise HTTPException(
            413, f"block {key} is {len(record.value)} bytes; the limit is {settings.max_value_bytes}"
        )
    try:
        header = decode_value(record.value).header
    except CodecError as exc:
        raise HTTPException(422, f"block {key} is not a cachemesh value: {exc}") from None
    if header.kind != "kv_block" or not header.model:
        raise HTTPException(422, f"block {key} is a {header.kind} value for model {header.model!r}")
    return EntryMeta(
        key=key,
        kind="kv_block",
        model=header.model,
        similarity_tolerance=settings.default_similarity_tolerance,
    )
