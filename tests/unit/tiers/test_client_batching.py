"""The Python client's batch path over the API in process (httpx's ASGI transport, no socket): a batch
over the node's max_batch is split into several requests (in flight together on the async client) and
answered in order."""

from __future__ import annotations

import json

import httpx

from services.tiers.edge.api import create_app
from services.tiers.edge.client import AsyncTiersClient, LookupRequest, TiersClient
from tests.unit.tiers.fakes import Clock
from tests.unit.tiers.test_api import WordEmbedder, make_cache, settings


class Counting(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.batches: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/lookup/batch":
            self.batches.append(request.content.count(b'"key"'))
        return await self.inner.handle_async_request(request)


async def test_async_lookup_many_splits_a_batch_over_the_limit_and_keeps_order() -> None:
    app = create_app(make_cache(Clock()), settings(max_batch=8), WordEmbedder())
    transport = Counting(httpx.ASGITransport(app=app))
    async with AsyncTiersClient("http://tiers", transport=transport) as c:
        for i in range(0, 20, 3):
            await c.put(f"k{i}", f"v{i}", model="m")
        results = await c.lookup_many([LookupRequest(key=f"k{i}") for i in range(20)], batch_size=8)
    assert transport.batches == [8, 8, 4]
    assert [r.hit for r in results] == [i % 3 == 0 for i in range(20)]
    assert [r.value for r in results if r.hit] == [f"v{i}" for i in range(0, 20, 3)]


def test_sync_lookup_many_splits_too() -> None:
    # The sync client over a sync transport: a stub node that echoes each batch's keys back as misses.
    sizes: list[int] = []

    def node(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sizes.append(len(body["requests"]))
        results = [{"hit": False, "key": r["key"], "latency_us": 1.0} for r in body["requests"]]
        return httpx.Response(200, json={"results": results})

    with TiersClient("http://tiers", transport=httpx.MockTransport(node)) as c:
        results = c.lookup_many([LookupRequest(key=f"k{i}") for i in range(5)], batch_size=2)
    assert sizes == [2, 2, 1]
    assert [r.key for r in results] == [f"k{i}" for i in range(5)]
