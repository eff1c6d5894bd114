"""A small Python client for a tier node's API, sync (`TiersClient`) and async (`AsyncTiersClient`), over
httpx. Embeddings travel as base64 float32; values come back as `str` (answers) or numpy arrays. The one
implementation: the server re-exports it (`services.tiers.edge.client`) and needs nothing else of it.
numpy is imported only for tensors (`pip install './client[tensors]'`): text answers and embeddings
given as lists of floats need httpx alone; orjson is used when installed.

    with TiersClient("http://127.0.0.1:8700", token=...) as c:
        c.put("k1", "Paris", model="m", embed_text="capital of France?")
        hit = c.lookup(text="What is France's capital?")
        hit.value  # "Paris"
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import quote

import httpx

from cachemesh_client.blockframe import MEDIA_TYPE as BLOCKS_MEDIA_TYPE
from cachemesh_client.blockframe import FetchedBlock, parse_blocks

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:  # pragma: no cover - the light client without it
        return None


_orjson: Any = _optional("orjson")  # faster, when the environment has it (the server's does)


def _dumps(obj: Any) -> bytes:
    if _orjson is not None:
        return bytes(_orjson.dumps(obj))
    return json.dumps(obj, separators=(",", ":")).encode()


def _loads(data: bytes) -> Any:
    return _orjson.loads(data) if _orjson is not None else json.loads(data)


VALUE_MEDIA_TYPE = "application/x-cachemesh-value"
# Lookups per batch request: the node's default max_batch (a node refuses a larger batch with 413).
DEFAULT_BATCH = 1024
_JSON = {"Content-Type": "application/json"}

# Wire dtype -> the numpy dtype its bytes are carried in (bfloat16 as raw uint16 bit patterns); the
# server's codec (services/tiers/codec.py CARRIER) has the same table, a unit test keeps them equal.
CARRIER: dict[str, str] = {
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": "<u2",
    "int8": "i1",
    "uint8": "u1",
    "int32": "<i4",
    "int64": "<i8",
}


class TiersError(Exception):
    """The node answered with an error status; `status` and `detail` say which and why, `retry_after_s`
    when to try again (a 503 while L3 cannot take writes), if the node said."""

    def __init__(self, status: int, detail: Any, retry_after_s: float | None = None) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class LookupResult:
    hit: bool
    key: str | None = None
    tier: str | None = None
    match: str | None = None
    similarity: float | None = None
    latency_us: float = 0.0
    degraded: bool = False
    remote: bool = False  # served from another node's L2 (tier "l2"), the block server at `peer`
    peer: str | None = None
    value: str | np.ndarray | None = None
    descriptor: dict[str, Any] = field(default_factory=dict)
    # A semantic miss says why: the rule that refused its nearest entry (threshold, floor,
    # guard:<name>, uncertain, no candidate) and in words; `similarity` is that entry's.
    miss_rule: str | None = None
    miss_reason: str | None = None
    # A miss the node explores: ask the model anyway, then say whether its answer agreed with this
    # entry's (`feedback(..., explored=True)`); `explore_value` is that entry's value (with include_value).
    explore_key: str | None = None
    explore_value: str | np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class LookupRequest:
    key: str | None = None
    embedding: npt.ArrayLike | None = None
    text: str | None = None
    model: str | None = None
    tolerance: float | None = None
    trace_id: str | None = None
    include_value: bool = True


@dataclass(frozen=True, slots=True)
class PrefixBlock:
    key: str
    tier: str
    node: str  # this node's id, or a peer's block server (host:port) for a remote L2 hit
    remote: bool
    size_bytes: int


@dataclass(frozen=True, slots=True)
class PrefixResult:
    """The longest cached prefix of a chain of KV blocks (POST /v1/prefix)."""

    requested: int
    prefix_blocks: int
    prefix_tokens: int | None
    first_miss: str | None
    blocks: tuple[PrefixBlock, ...]


def prefix_body(keys: Sequence[str], model: str | None, block_size_tokens: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"keys": list(keys)}
    if model is not None:
        body["model"] = model
    if block_size_tokens is not None:
        body["block_size_tokens"] = block_size_tokens
    return body


def parse_prefix(data: Mapping[str, Any]) -> PrefixResult:
    return PrefixResult(
        requested=data["requested"],
        prefix_blocks=data["prefix_blocks"],
        prefix_tokens=data.get("prefix_tokens"),
        first_miss=data.get("first_miss"),
        blocks=tuple(PrefixBlock(**b) for b in data["blocks"]),
    )


def _fetched(response: httpx.Response) -> list[FetchedBlock]:
    if response.status_code != 200:
        _check(response)
    return parse_blocks(response.content)


def _numpy() -> Any:
    try:
        return importlib.import_module("numpy")
    except ImportError:
        raise ImportError("tensor values need numpy: pip install 'cachemesh-client[tensors]'") from None


def _b64_embedding(embedding: npt.ArrayLike) -> str:
    if isinstance(embedding, list | tuple):
        return base64.b64encode(struct.pack(f"<{len(embedding)}f", *embedding)).decode()
    xp = _numpy()
    return base64.b64encode(xp.ascontiguousarray(embedding, dtype="<f4").tobytes()).decode()


def lookup_body(req: LookupRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"include_value": req.include_value}
    for name in ("key", "text", "model", "tolerance", "trace_id"):
        if (v := getattr(req, name)) is not None:
            body[name] = v
    if req.embedding is not None:
        body["embedding_b64"] = _b64_embedding(req.embedding)
    return body


def put_body(
    value: str | npt.ArrayLike,
    *,
    model: str,
    kind: str | None = None,
    embedding: npt.ArrayLike | None = None,
    embed_text: str | None = None,
    ttl_hint_ms: int | None = None,
    similarity_tolerance: float | None = None,
    invalidate_threshold: float | None = None,
    trace_id: str | None = None,
    context_dependency_ids: Iterable[str] = (),
    semantic_tags: Mapping[str, str] | None = None,
    layer_range: tuple[int, int] = (0, 0),
    token_range: tuple[int, int] = (0, 0),
    dtype: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model}
    if isinstance(value, str):
        body["value"] = {"text": value}
        body["kind"] = kind or "prompt"
    else:
        xp = _numpy()
        arr = xp.asarray(value)
        wire = dtype or arr.dtype.name
        carrier = CARRIER[wire.lower()]
        data = xp.ascontiguousarray(
            arr.view(carrier) if wire == "bfloat16" else arr.astype(carrier, copy=False)
        )
        body["value"] = {
            "tensor": {
                "dtype": wire,
                "shape": list(arr.shape),
                "data_b64": base64.b64encode(data.tobytes()).decode(),
            }
        }
        body["kind"] = kind or "kv_block"
    if embedding is not None:
        body["embedding_b64"] = _b64_embedding(embedding)
    optional = {
        "embed_text": embed_text,
        "ttl_hint_ms": ttl_hint_ms,
        "similarity_tolerance": similarity_tolerance,
        "invalidate_threshold": invalidate_threshold,
        "trace_id": trace_id,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if deps := list(context_dependency_ids):
        body["context_dependency_ids"] = deps
    if semantic_tags:
        body["semantic_tags"] = dict(semantic_tags)
    if layer_range != (0, 0):
        body["layer_range"] = list(layer_range)
    if token_range != (0, 0):
        body["token_range"] = list(token_range)
    return body


def parse_value(value: Mapping[str, Any] | None) -> str | np.ndarray | None:
    if value is None:
        return None
    if value.get("text") is not None:
        return str(value["text"])
    raw = base64.b64decode(value["data_b64"])
    carrier = CARRIER[str(value["dtype"]).lower()]
    array: np.ndarray = _numpy().frombuffer(raw, dtype=carrier).reshape(value["shape"])
    return array


def parse_lookup(data: Mapping[str, Any]) -> LookupResult:
    return LookupResult(
        hit=bool(data["hit"]),
        key=data.get("key"),
        tier=data.get("tier"),
        match=data.get("match"),
        similarity=data.get("similarity"),
        latency_us=float(data.get("latency_us", 0.0)),
        degraded=bool(data.get("degraded", False)),
        remote=bool(data.get("remote", False)),
        peer=data.get("peer"),
        value=parse_value(data.get("value")),
        descriptor=dict(data.get("descriptor") or {}),
        miss_rule=data.get("miss_rule"),
        miss_reason=data.get("miss_reason"),
        explore_key=data.get("explore_key"),
        explore_value=parse_value(data.get("explore_value")),
    )


def feedback_body(key: str, text: str, correct: bool, explored: bool) -> dict[str, Any]:
    return {"key": key, "text": text, "correct": correct, "explored": explored}


def _entry_path(key: str) -> str:
    return "/v1/entries/" + quote(key, safe="")


def _value_path(key: str) -> str:
    return "/v1/values/" + quote(key, safe="")


def _check(response: httpx.Response, ok: Sequence[int] = (200, 201)) -> Any:
    if response.status_code in ok:
        return _loads(response.content) if response.content else None
    try:
        detail = _loads(response.content).get("detail")
    except (ValueError, AttributeError):
        detail = response.text
    try:
        retry_after_s: float | None = float(response.headers["retry-after"])
    except (KeyError, ValueError):
        retry_after_s = None
    raise TiersError(response.status_code, detail, retry_after_s)


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _batches(requests: Sequence[LookupRequest], size: int) -> list[bytes]:
    """Batch bodies of at most `size` lookups each, encoded once."""
    if size < 1:
        raise ValueError(f"batch size must be positive, got {size}")
    return [
        _dumps({"requests": [lookup_body(r) for r in requests[i : i + size]]})
        for i in range(0, len(requests), size)
    ]


class TiersClient:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers=_headers(token), timeout=timeout_s, transport=transport
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def lookup(self, key: str | None = None, **kwargs: Any) -> LookupResult:
        body = _dumps(lookup_body(LookupRequest(key=key, **kwargs)))
        return parse_lookup(_check(self._http.post("/v1/lookup", content=body, headers=_JSON)))

    def lookup_many(
        self, requests: Sequence[LookupRequest], *, batch_size: int = DEFAULT_BATCH
    ) -> list[LookupResult]:
        """Results in request order; more than `batch_size` lookups go as several batch requests."""
        out: list[LookupResult] = []
        for body in _batches(requests, batch_size):
            data = _check(self._http.post("/v1/lookup/batch", content=body, headers=_JSON))
            out.extend(parse_lookup(r) for r in data["results"])
        return out

    def get(self, key: str, *, model: str | None = None) -> LookupResult:
        params = {"model": model} if model else None
        response = self._http.get(_entry_path(key), params=params)
        return parse_lookup(_check(response, ok=(200, 404)))

    def put(self, key: str, value: str | npt.ArrayLike, **kwargs: Any) -> dict[str, Any]:
        result: dict[str, Any] = _check(self._http.put(_entry_path(key), json=put_body(value, **kwargs)))
        return result

    def put_blob(self, key: str, blob: bytes, **params: Any) -> dict[str, Any]:
        response = self._http.put(
            _value_path(key),
            content=blob,
            params={k: v for k, v in params.items() if v is not None},
            headers={"Content-Type": VALUE_MEDIA_TYPE},
        )
        result: dict[str, Any] = _check(response)
        return result

    def get_blob(self, key: str) -> bytes | None:
        response = self._http.get(_value_path(key))
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            _check(response)
        return response.content

    def delete(self, key: str) -> bool:
        return bool(_check(self._http.delete(_entry_path(key)))["deleted"])

    def feedback(self, key: str, text: str, *, correct: bool, explored: bool = False) -> dict[str, Any]:
        """Whether entry `key` answered `text` rightly: a served answer rated, or (`explored`) whether
        the model's own answer agreed with the entry's on an explored miss. The node learns from it."""
        body = feedback_body(key, text, correct, explored)
        result: dict[str, Any] = _check(self._http.post("/v1/feedback", json=body))
        return result

    def prefix(
        self, keys: Sequence[str], *, model: str | None = None, block_size_tokens: int | None = None
    ) -> PrefixResult:
        body = prefix_body(keys, model, block_size_tokens)
        return parse_prefix(_check(self._http.post("/v1/prefix", json=body)))

    def fetch_blocks(self, keys: Sequence[str], *, model: str | None = None) -> list[FetchedBlock]:
        """Every key's block, in order (`status` hit, miss or omitted); a hit's `value` is its bytes."""
        body = prefix_body(keys, model, None)
        return _fetched(self._http.post("/v1/blocks/fetch", json=body, headers={"Accept": BLOCKS_MEDIA_TYPE}))

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = _check(self._http.get("/v1/stats"))
        return result


class AsyncTiersClient:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 100,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        """`http`: an httpx client already set up for the node (its base URL, token and limits), which
        its owner closes; `base_url` and the other options are then not used."""
        self._owned = http is None
        self._http = http or httpx.AsyncClient(
            base_url=base_url,
            headers=_headers(token),
            timeout=timeout_s,
            transport=transport,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owned:
            await self._http.aclose()

    async def lookup(self, key: str | None = None, **kwargs: Any) -> LookupResult:
        body = _dumps(lookup_body(LookupRequest(key=key, **kwargs)))
        return parse_lookup(_check(await self._http.post("/v1/lookup", content=body, headers=_JSON)))

    async def lookup_many(
        self, requests: Sequence[LookupRequest], *, batch_size: int = DEFAULT_BATCH
    ) -> list[LookupResult]:
        """Results in request order; more than `batch_size` lookups go as several batch requests, in
        flight together (on the client's pooled connections)."""

        async def one(body: bytes) -> list[LookupResult]:
            data = _check(await self._http.post("/v1/lookup/batch", content=body, headers=_JSON))
            return [parse_lookup(r) for r in data["results"]]

        parts = await asyncio.gather(*(one(b) for b in _batches(requests, batch_size)))
        return [result for part in parts for result in part]

    async def get(self, key: str, *, model: str | None = None) -> LookupResult:
        params = {"model": model} if model else None
        response = await self._http.get(_entry_path(key), params=params)
        return parse_lookup(_check(response, ok=(200, 404)))

    async def put(self, key: str, value: str | npt.ArrayLike, **kwargs: Any) -> dict[str, Any]:
        result: dict[str, Any] = _check(
            await self._http.put(_entry_path(key), json=put_body(value, **kwargs))
        )
        return result

    async def put_blob(self, key: str, blob: bytes, **params: Any) -> dict[str, Any]:
        response = await self._http.put(
            _value_path(key),
            content=blob,
            params={k: v for k, v in params.items() if v is not None},
            headers={"Content-Type": VALUE_MEDIA_TYPE},
        )
        result: dict[str, Any] = _check(response)
        return result

    async def get_blob(self, key: str) -> bytes | None:
        response = await self._http.get(_value_path(key))
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            _check(response)
        return response.content

    async def delete(self, key: str) -> bool:
        return bool(_check(await self._http.delete(_entry_path(key)))["deleted"])

    async def feedback(self, key: str, text: str, *, correct: bool, explored: bool = False) -> dict[str, Any]:
        """As TiersClient.feedback."""
        body = feedback_body(key, text, correct, explored)
        result: dict[str, Any] = _check(await self._http.post("/v1/feedback", json=body))
        return result

    async def prefix(
        self, keys: Sequence[str], *, model: str | None = None, block_size_tokens: int | None = None
    ) -> PrefixResult:
        body = prefix_body(keys, model, block_size_tokens)
        return parse_prefix(_check(await self._http.post("/v1/prefix", json=body)))

    async def fetch_blocks(self, keys: Sequence[str], *, model: str | None = None) -> list[FetchedBlock]:
        """Every key's block, in order (`status` hit, miss or omitted); a hit's `value` is its bytes."""
        body = prefix_body(keys, model, None)
        headers = {"Accept": BLOCKS_MEDIA_TYPE}
        return _fetched(await self._http.post("/v1/blocks/fetch", json=body, headers=headers))

    async def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = _check(await self._http.get("/v1/stats"))
        return result
