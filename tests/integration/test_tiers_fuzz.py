"""Hostile input against a real tier node (real Kafka, Postgres, uvicorn): the HTTP API fuzzed from its own
OpenAPI document with schemathesis (schema-valid and schema-breaking requests alike), and garbage on the
L2 block port. Neither may answer 5xx, crash or hang; every HTTP rejection is a 4xx that says why."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from pydantic import SecretStr

from services.tiers.edge.api import VALUE_MEDIA_TYPE
from services.tiers.edge.blockframe import MEDIA_TYPE as BLOCKS_MEDIA_TYPE
from services.tiers.edge.blockframe import FetchedBlock, encode_blocks
from services.tiers.settings import TiersSettings
from tests.integration.fuzzing import REQUEST_TIMEOUT_S, fuzz
from tests.integration.nodes import running, until

pytestmark = pytest.mark.integration

TOKEN = "fuzz-token"


@schemathesis.serializer(VALUE_MEDIA_TYPE, BLOCKS_MEDIA_TYPE)
def _value_bytes(_: Any, value: Any) -> dict[str, bytes]:
    """PUT /v1/values and POST /v1/blocks/put take raw bytes: whatever was generated, as bytes (the
    codecs must refuse it)."""
    if isinstance(value, bytes):
        return {"data": value}
    return {"data": value.encode() if isinstance(value, str) else json.dumps(value).encode()}


def _problem(case: Any, response: requests.Response) -> str | None:
    """What is wrong with one answer, or None: no 5xx, and a rejection is a 4xx with a reason."""
    status = response.status_code
    where = f"{case.method} {case.formatted_path} -> {status}"
    if status >= 500:
        return f"{where}: server error {response.text[:300]!r}"
    if status >= 400:
        if status == 404 and not response.content:
            return None  # GET /v1/values/{key}: a miss has no body by design
        try:
            body = response.json()
            if status == 404 and body.get("hit") is False:
                return None  # GET /v1/entries/{key}: a miss is a lookup result, not a rejection
            detail = body.get("detail")
        except (ValueError, AttributeError):
            return f"{where}: rejection without a JSON body {response.text[:200]!r}"
        if not detail:
            return f"{where}: rejection without a reason"
    return None


async def test_api_survives_fuzzing(node_settings: Callable[..., TiersSettings]) -> None:
    settings = node_settings(
        "fuzz", api_token=SecretStr(TOKEN), max_text_chars=512, max_batch=16, embedder_preload=True
    )
    async with running(settings) as node:
        # Text lookups are fuzzed too: against a node whose model has loaded (a load can outlast the
        # per-request timeout on a busy machine, and is not what this test measures).
        await until(lambda: node.embedder.state == "ready", timeout_s=120, step_s=0.1)
        sent, problems = await asyncio.to_thread(
            fuzz, node.api_url, {"Authorization": f"Bearer {TOKEN}"}, _problem
        )
        # The node still answers after all of it.
        async with httpx.AsyncClient(base_url=node.api_url) as http:
            assert (await http.get("/healthz")).status_code == 200
    assert sent > 100
    assert not problems, "\n".join(sorted(set(problems))[:40])


def _json_body(value: object) -> bytes:
    return json.dumps(value).encode()


PUT_TEXT = {"value": {"text": "an answer"}, "model": "m"}
# What a generator built from the schema does not send: broken JSON and UTF-8, strings Postgres cannot
# store (NUL, lone surrogates), nesting and sizes past the bounds.
HOSTILE: list[tuple[str, str, bytes]] = [
    ("POST", "/v1/lookup", b"{"),
    ("POST", "/v1/lookup", b"\xff\xfe\x00"),
    ("POST", "/v1/lookup", b"[" * 50_000 + b"]" * 50_000),
    ("POST", "/v1/lookup", b'{"key": "a\\u0000b"}'),
    ("POST", "/v1/lookup", b'{"key": "\\ud800"}'),
    ("POST", "/v1/lookup", b'{"key": "k", "model": "\\u0000"}'),
    ("POST", "/v1/lookup", b'{"key": "k", "trace_id": "\\udfff"}'),
    ("POST", "/v1/lookup", b'{"text": "\\ud800 hello"}'),
    ("POST", "/v1/lookup", b'{"embedding": [1e39, 1e39]}'),
    ("POST", "/v1/lookup/batch", b'{"requests": [{"key": "\\u0000"}]}'),
    ("POST", "/v1/lookup/batch", _json_body({"requests": [{"key": "k"}] * 1000})),
    ("GET", "/v1/entries/a%00b", b""),
    ("GET", "/v1/entries/%ED%A0%80", b""),
    ("GET", "/v1/entries/%FF", b""),
    ("GET", "/v1/entries/k?model=%00", b""),
    ("GET", "/v1/values/a%00b", b""),
    ("DELETE", "/v1/entries/a%00b", b""),
    ("PUT", "/v1/entries/a%00b", _json_body(PUT_TEXT)),
    ("PUT", "/v1/entries/k-nul-model", _json_body({**PUT_TEXT, "model": "m\u0000"})),
    ("PUT", "/v1/entries/k-sur", b'{"value": {"text": "\\ud800"}, "model": "m"}'),
    ("PUT", "/v1/entries/k-tags", _json_body({**PUT_TEXT, "semantic_tags": {"t": "\u0000"}})),
    ("PUT", "/v1/entries/k-deps", _json_body({**PUT_TEXT, "context_dependency_ids": ["\u0000"]})),
    ("PUT", "/v1/entries/k-trace", _json_body({**PUT_TEXT, "trace_id": "t\u0000"})),
    ("PUT", "/v1/entries/k-embed", _json_body({**PUT_TEXT, "embed_text": "hello \u0000 there"})),
    ("PUT", "/v1/entries/k-big", _json_body({**PUT_TEXT, "value": {"text": "x" * (9 << 20)}})),
    ("PUT", "/v1/values/k-garbage", b"\x00" * 64),
    ("PUT", "/v1/values/k-trace?trace_id=%00", b"\x00" * 64),
    ("POST", "/v1/blocks/put", b"CMBF\x01\xff\xff\xff\xff"),
    ("POST", "/v1/blocks/put", encode_blocks([FetchedBlock("not-a-kv-key", "hit", None, b"x")])),
    ("POST", "/v1/blocks/put", encode_blocks([FetchedBlock("kv:" + "ab" * 16, "hit", None, b"\x00" * 64)])),
    ("POST", "/v1/blocks/put", encode_blocks([FetchedBlock("kv:" + "ab" * 16, "miss")])),
    ("POST", "/v1/feedback", _json_body({"key": "\u0000", "embedding_b64": "AACAPw==", "correct": True})),
]


async def test_hostile_requests_are_refused_cleanly(node_settings: Callable[..., TiersSettings]) -> None:
    async with running(node_settings("hostile", embedder_preload=True)) as node:
        assert node.cache is not None
        await until(lambda: node.embedder.state == "ready", timeout_s=120, step_s=0.1)
        problems = []
        async with httpx.AsyncClient(base_url=node.api_url, timeout=REQUEST_TIMEOUT_S) as http:
            for method, path, content in HOSTILE:
                headers = {"Content-Type": "application/json"}
                if path.startswith("/v1/values/"):
                    headers = {"Content-Type": VALUE_MEDIA_TYPE}
                elif path.startswith("/v1/blocks/put"):
                    headers = {"Content-Type": BLOCKS_MEDIA_TYPE}
                response = await http.request(method, path, content=content, headers=headers)
                where = f"{method} {path} {content[:60]!r} -> {response.status_code} {response.text[:200]}"
                if response.status_code >= 500:
                    problems.append(where)
                elif response.status_code >= 400 and response.content:
                    try:
                        body = response.json()
                    except ValueError:
                        problems.append(f"{where}: not JSON")
                        continue
                    if not body.get("detail") and body.get("hit") is not False:
                        problems.append(f"{where}: no reason")
            assert (await http.get("/healthz")).status_code == 200
        # Bad input is the client's fault: it must not count against L3 (enough of it would open the
        # circuit breaker and degrade every lookup).
        assert node.cache.counters.l3_errors == 0, problems
        assert node.cache.breaker.state == "closed"
    assert not problems, "\n".join(problems)
