"""Regressions from fuzzing the tiers API (tests/integration/test_tiers_fuzz.py): each input below once
answered 5xx, plain text, or reached Postgres and failed there (counted against the L3 breaker)."""

from __future__ import annotations

import json
import warnings
from collections.abc import AsyncIterator

import httpx
import pytest

from services.tiers.edge.api import VALUE_MEDIA_TYPE, create_app
from services.tiers.node.tiered import TieredCache
from tests.unit.tiers.fakes import Clock
from tests.unit.tiers.test_api import DIM, WordEmbedder, make_cache, settings

PUT_TEXT = {"value": {"text": "an answer"}, "model": "m"}


@pytest.fixture
def cache() -> TieredCache:
    return make_cache(Clock())


@pytest.fixture
async def http(cache: TieredCache) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(cache, settings(), WordEmbedder())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tiers") as c:
        yield c


def _reason(response: httpx.Response) -> str:
    detail = response.json()["detail"]
    return detail if isinstance(detail, str) else " ".join(d["msg"] for d in detail)


async def test_a_lone_surrogate_in_a_text_value_is_a_422_not_a_500(http: httpx.AsyncClient) -> None:
    # stdlib json (FastAPI's routes) accepts "\ud800"; UTF-8 cannot encode it.
    body = b'{"value": {"text": "\\ud800"}, "model": "m"}'
    response = await http.put("/v1/entries/k", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    assert "surrogate" in _reason(response)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/entries/a%00b", PUT_TEXT),
        ("/v1/entries/k", {**PUT_TEXT, "model": "m\u0000"}),
        ("/v1/entries/k", {**PUT_TEXT, "semantic_tags": {"t": "v\u0000"}}),
        ("/v1/entries/k", {**PUT_TEXT, "semantic_tags": {"t\u0000": "v"}}),
        ("/v1/entries/k", {**PUT_TEXT, "context_dependency_ids": ["c\u0000"]}),
        ("/v1/entries/k", {**PUT_TEXT, "trace_id": "t\u0000"}),
        ("/v1/entries/k", {**PUT_TEXT, "embed_text": "hello \u0000 there"}),
    ],
)
async def test_nul_in_what_l3_stores_is_refused_at_the_edge(
    http: httpx.AsyncClient, cache: TieredCache, path: str, body: dict[str, object]
) -> None:
    response = await http.put(path, json=body)
    assert response.status_code == 422, response.text
    assert "NUL" in _reason(response)
    assert len(cache.l1) == 0 and cache.counters.l3_errors == 0


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/lookup", {"key": "a\u0000b"}),
        ("POST", "/v1/lookup", {"key": "k", "model": "\u0000"}),
        ("POST", "/v1/lookup/batch", {"requests": [{"key": "\u0000"}]}),
        ("GET", "/v1/entries/a%00b", None),
        ("GET", "/v1/entries/k?model=%00", None),
        ("GET", "/v1/values/a%00b", None),
        ("DELETE", "/v1/entries/a%00b", None),
        ("POST", "/v1/feedback", {"key": "\u0000", "embedding": [1.0] * DIM, "correct": True}),
    ],
)
async def test_nul_in_a_key_or_model_is_a_422_not_an_l3_failure(
    http: httpx.AsyncClient, cache: TieredCache, method: str, path: str, body: object
) -> None:
    response = await http.request(method, path, json=body)
    assert response.status_code == 422, response.text
    assert "NUL" in _reason(response)
    assert cache.counters.l3_errors == 0


async def test_nul_in_a_put_value_query_is_refused(http: httpx.AsyncClient) -> None:
    response = await http.put(
        "/v1/values/k?trace_id=%00", content=b"\x00" * 64, headers={"Content-Type": VALUE_MEDIA_TYPE}
    )
    assert response.status_code == 422
    assert "NUL" in _reason(response)


@pytest.mark.parametrize("path", ["/v1/lookup", "/v1/entries/k"])
async def test_a_body_over_the_limit_is_a_json_413_with_a_reason(http: httpx.AsyncClient, path: str) -> None:
    big = json.dumps({**PUT_TEXT, "value": {"text": "x" * (65 * 1024)}}).encode()
    method = "POST" if path == "/v1/lookup" else "PUT"
    response = await http.request(method, path, content=big, headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert "limit" in _reason(response)


@pytest.mark.parametrize("path", ["/v1/lookup", "/v1/entries/k"])
async def test_a_chunked_body_over_the_limit_is_a_json_413(http: httpx.AsyncClient, path: str) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(70):
            yield b" " * 1024  # no Content-Length: counted as it arrives

    method = "POST" if path == "/v1/lookup" else "PUT"
    headers = {"Content-Type": "application/json"}
    response = await http.request(method, path, content=chunks(), headers=headers)
    assert response.status_code == 413
    assert "limit" in _reason(response)


async def test_an_embedding_beyond_float32_is_refused_without_a_warning(http: httpx.AsyncClient) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warning must not escape (or become a 500)
        response = await http.post("/v1/lookup", json={"embedding": [1e39] * DIM})
    assert response.status_code == 422
    assert "finite" in _reason(response)
