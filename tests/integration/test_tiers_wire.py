"""The lookups answered at the HTTP wire (services/tiers/edge/wire.py) on a real node over real sockets:
the same answers as the ASGI path, every request that is not plain left to the ASGI app (which answers it
as it always did), responses in order on a connection that pipelines, and the bearer token and the body
limit still enforced."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from pydantic import SecretStr

from services.tiers.entry import EntryMeta, encode_text
from services.tiers.service import TiersService
from tests.integration.nodes import running

pytestmark = pytest.mark.integration


def request(path: str, body: bytes, *headers: str, method: str = "POST") -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: node", *headers]
    if body or method == "POST":
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
        return status, headers, body
    return status, headers, await reader.readexactly(int(headers.get("content-length", "0")))


async def exchange(node: TiersService, *raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Send `raw` in one write (pipelined when several) and read one response each."""
    reader, writer = await asyncio.open_connection("127.0.0.1", node.api_port)
    try:
        writer.write(b"".join(raw))
        return [await read_response(reader) for _ in raw]
    finally:
        writer.close()


async def one_by_one(node: TiersService, *raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Send each of `raw` on one kept-alive connection after the previous one's response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", node.api_port)
    try:
        out = []
        for r in raw:
            writer.write(r)
            out.append(await read_response(reader))
        return out
    finally:
        writer.close()


def without_timing(body: bytes) -> Any:
    out = json.loads(body)
    for result in out.get("results", [out]):
        result.pop("latency_us", None)  # and when each node wrote the entry:
        for stamp in ("created_at_ms", "updated_at_ms"):
            (result.get("descriptor") or {}).pop(stamp, None)
    return out


async def put(node: TiersService, key: str, answer: str) -> None:
    assert node.cache is not None
    await node.cache.put(EntryMeta(key=key, kind="prompt", model="m"), encode_text(answer, model="m"))


async def test_plain_lookups_are_answered_at_the_wire_as_the_asgi_path_answers_them(
    kafka, topics_on, node_settings
) -> None:
    await topics_on(kafka)
    key = f"wire-{uuid.uuid4().hex[:8]}"
    one = json.dumps({"key": key}).encode()
    miss = json.dumps({"key": key + "-missing"}).encode()
    bad = b'{"key": 5, "tolerance": "high"}'
    batch = json.dumps({"requests": [{"key": key}, {"key": key + "-missing"}]}).encode()
    cases = [("/v1/lookup", one), ("/v1/lookup", miss), ("/v1/lookup", bad), ("/v1/lookup/batch", batch)]
    answers: dict[bool, list[tuple[int, Any]]] = {}
    for fast in (True, False):
        async with running(node_settings(f"wire{int(fast)}", wire_fast_path=fast)) as node:
            await put(node, key, "the answer")
            got = [await exchange(node, request(path, body)) for path, body in cases]
            answers[fast] = [(status, without_timing(body)) for ((status, _, body),) in got]
            assert node.wire_answered == (len(cases) if fast else 0)
            # keep-alive: many lookups on one connection, each answered at the wire
            before = node.wire_answered
            many = await one_by_one(node, *[request("/v1/lookup", one) for _ in range(20)])
            assert [s for s, _, _ in many] == [200] * 20
            assert node.wire_answered - before == (20 if fast else 0)
    assert answers[True] == answers[False]
    assert [s for s, _ in answers[True]] == [200, 200, 422, 200]
    assert answers[True][0][1]["hit"] and not answers[True][1][1]["hit"]


async def test_requests_that_are_not_plain_go_through_the_asgi_app_in_order(
    kafka, topics_on, node_settings
) -> None:
    await topics_on(kafka)
    settings = node_settings("wire-edge", api_token=SecretStr("wire-token"), max_request_bytes=4096)
    async with running(settings) as node:
        key = f"wire-{uuid.uuid4().hex[:8]}"
        await put(node, key, "the answer")
        auth = "Authorization: Bearer wire-token"
        one = json.dumps({"key": key}).encode()

        # Pipelined in one write: lookup, another route, lookup, lookup. Answers come back in order; the
        # first is answered at the wire, the ones queued behind another request by the ASGI app.
        got = await exchange(
            node,
            request("/v1/lookup", one, auth),
            request("/healthz", b"", method="GET"),
            request("/v1/lookup", one, auth),
            request("/v1/lookup", json.dumps({"key": "other"}).encode(), auth),
        )
        assert [s for s, _, _ in got] == [200, 200, 200, 200]
        assert [json.loads(b).get("hit") for _, _, b in got] == [True, None, True, False]
        assert "healthy" in json.loads(got[1][2])
        assert node.wire_answered >= 1
        # A miss (it waits on L3, in a task) pipelined ahead of hits settled at once: still in order.
        miss = request("/v1/lookup", json.dumps({"key": f"{key}-absent"}).encode(), auth)
        got = await exchange(
            node, miss, request("/v1/lookup", one, auth), miss, request("/v1/lookup", one, auth)
        )
        assert [json.loads(b)["hit"] for _, _, b in got] == [False, True, False, True]

        before = node.wire_answered
        # No token, a wrong one: the ASGI app's 401.
        ((status, headers, _),) = await exchange(node, request("/v1/lookup", one))
        assert (status, headers.get("www-authenticate")) == (401, "Bearer")
        ((status, _, _),) = await exchange(node, request("/v1/lookup", one, "Authorization: Bearer nope"))
        assert status == 401
        # Over the body limit: the ASGI app's JSON 413, before anything reads the body.
        big = json.dumps({"key": key, "text": "x" * 5000}).encode()
        ((status, _, body),) = await exchange(node, request("/v1/lookup", big, auth))
        assert status == 413 and "limit" in json.loads(body)["detail"]
        # A chunked body, a query string, HTTP/1.0, Connection: close: answered as before, by the app.
        chunked = (
            (
                f"POST /v1/lookup HTTP/1.1\r\nHost: node\r\n{auth}\r\nContent-Type: application/json\r\n"
                f"Transfer-Encoding: chunked\r\n\r\n{len(one):x}\r\n"
            ).encode()
            + one
            + b"\r\n0\r\n\r\n"
        )
        ((status, _, body),) = await exchange(node, chunked)
        assert status == 200 and json.loads(body)["hit"]
        ((status, _, body),) = await exchange(node, request("/v1/lookup?x=1", one, auth))
        assert status == 200 and json.loads(body)["hit"]
        old = request("/v1/lookup", one, auth).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
        ((status, _, body),) = await exchange(node, old)
        assert status == 200 and json.loads(body)["hit"]
        ((status, headers, body),) = await exchange(
            node, request("/v1/lookup", one, auth, "Connection: close")
        )
        assert status == 200 and headers.get("connection") == "close" and json.loads(body)["hit"]
        assert node.wire_answered == before

        # With the token, a plain lookup is answered at the wire again.
        ((status, _, body),) = await exchange(node, request("/v1/lookup", one, auth))
        assert status == 200 and json.loads(body)["hit"]
        assert node.wire_answered == before + 1
