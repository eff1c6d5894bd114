"""The KV-block prefix routes in-process (httpx's ASGI transport, no socket): over the Mooncake dev trace's
chains the longest prefix the route reports equals the simulator's prefix hit for every request, and the
batch fetch returns the blocks byte for byte; bounds answer 4xx with a reason; the binary frame parses
back and refuses what is not one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest

from policies.recency.lru import LRU
from services.runtime.breaker import LatencyBreaker
from services.tiers.edge.api import create_app
from services.tiers.edge.blockframe import FetchedBlock, FrameError, encode_blocks, parse_blocks
from services.tiers.edge.client import AsyncTiersClient, TiersError
from services.tiers.entry import EntryMeta, encode_array
from services.tiers.l1.cache import L1Cache
from services.tiers.node.outbox import Outbox
from services.tiers.node.tiered import TieredCache
from services.tiers.settings import TiersSettings
from tests.prefix_trace import MODEL, block_key, block_value, chains, replay_prefix_hits, requests
from tests.unit.tiers.fakes import Clock, MemoryL3

DIM = 16


def make_cache(clock: Clock) -> TieredCache:
    return TieredCache(
        l1=L1Cache(dim=DIM, capacity_bytes=1 << 26, max_entries=50_000, policy=LRU(1 << 26), clock=clock),
        l2=None,
        l3=MemoryL3(clock=clock),
        outbox=Outbox(clock=clock),
        breaker=LatencyBreaker(clock=clock),
        node_id="prefix-test",
        wall_ms=clock,
        perf_ns=clock.ns,
    )


@pytest.fixture
async def node() -> AsyncIterator[tuple[TieredCache, AsyncTiersClient]]:
    cache = make_cache(Clock())
    settings = TiersSettings(embedding_dim=DIM, max_batch=512, max_request_bytes=1 << 20)
    async with AsyncTiersClient(
        "http://tiers", transport=httpx.ASGITransport(app=create_app(cache, settings))
    ) as c:
        yield cache, c


async def test_the_prefix_equals_the_replays_prefix_hit_over_the_mooncake_trace(node) -> None:  # type: ignore[no-untyped-def]
    cache, client = node
    trace = requests(3600, 393)  # the trace's last 393 requests: 17k block accesses, 268 prefix hits
    expected = replay_prefix_hits(trace)
    stored: set[int] = set()
    reported = []
    for chain in chains(trace):
        keys = [block_key(b) for b in chain]
        got = await client.prefix(keys, model=MODEL, block_size_tokens=512)
        reported.append(got.prefix_blocks)
        assert got.requested == len(chain) and got.prefix_tokens == 512 * got.prefix_blocks
        assert [b.key for b in got.blocks] == keys[: got.prefix_blocks]
        assert all(b.node == "prefix-test" and not b.remote and b.tier in ("l1", "l3") for b in got.blocks)
        assert got.first_miss == (keys[got.prefix_blocks] if got.prefix_blocks < len(keys) else None)
        if got.prefix_blocks:  # the cached prefix, fetched in one call, byte for byte
            fetched = await client.fetch_blocks(keys[: got.prefix_blocks], model=MODEL)
            assert [f.value for f in fetched] == [block_value(b) for b in chain[: got.prefix_blocks]]
            assert all(f.hit for f in fetched)
        for b in chain:  # as the replay does: every block of the request is resident afterwards
            if b not in stored:
                await cache.put(EntryMeta(block_key(b), "kv_block", MODEL), block_value(b))
                stored.add(b)
    assert reported == expected
    assert sum(1 for n in expected if n) > 200, "the slice exercises prefix hits"


async def test_a_fetch_answers_misses_in_place_and_omits_what_passes_the_budget(node) -> None:  # type: ignore[no-untyped-def]
    cache, client = node
    big = np.zeros(300_000, dtype=np.int8)
    blobs = {
        k: encode_array(big + i, kind="kv_block", model=MODEL) for i, k in enumerate(["a", "b", "c", "d"])
    }
    for k, blob in blobs.items():
        await cache.put(EntryMeta(k, "kv_block", MODEL), blob)
    fetched = await client.fetch_blocks(["a", "nope", "b", "c", "d"], model=MODEL)
    assert [f.key for f in fetched] == ["a", "nope", "b", "c", "d"]
    assert [f.status for f in fetched] == ["hit", "miss", "hit", "hit", "omitted"]  # 1 MiB budget
    assert [f.value for f in fetched[2:4]] == [blobs["b"], blobs["c"]]
    assert fetched[4].value == b"" and fetched[4].tier == "l1"
    prefix = await client.prefix(["a", "b", "nope", "c"])
    assert prefix.prefix_blocks == 2 and prefix.first_miss == "nope"


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        (
            "/v1/prefix",
            {"keys": [f"k{i}" for i in range(513)]},
            413,
            "513 keys in one request; the limit is 512",
        ),
        ("/v1/blocks/fetch", {"keys": [f"k{i}" for i in range(513)]}, 413, "the limit is 512"),
        ("/v1/prefix", {"keys": []}, 422, "at least 1"),
        ("/v1/prefix", {"keys": [""]}, 422, "at least 1 character"),
        ("/v1/prefix", {"keys": ["x" * 513]}, 422, "at most 512"),
        ("/v1/prefix", {"keys": ["a"], "block_size_tokens": 0}, 422, "greater than 0"),
        ("/v1/blocks/fetch", {"keys": ["a"], "include": "all"}, 422, "Extra inputs"),
        ("/v1/blocks/fetch", {}, 422, "Field required"),
    ],
)
async def test_bad_requests_say_why(node, path: str, body: object, status: int, words: str) -> None:  # type: ignore[no-untyped-def]
    _, client = node
    response = await client._http.post(path, json=body)
    assert response.status_code == status
    assert words in response.text


async def test_the_client_raises_the_nodes_reason() -> None:
    settings = TiersSettings(embedding_dim=DIM, max_batch=2)
    app = create_app(make_cache(Clock()), settings)
    async with AsyncTiersClient("http://tiers", transport=httpx.ASGITransport(app=app)) as client:
        with pytest.raises(TiersError) as err:
            await client.fetch_blocks(["a", "b", "c"])
    assert err.value.status == 413 and "the limit is 2" in str(err.value.detail)


def test_the_block_frame_round_trips_and_refuses_what_is_not_one() -> None:
    blocks = [
        FetchedBlock("ключ/1", "hit", "l2", b"\x00\x01" * 10),
        FetchedBlock("k2", "miss"),
        FetchedBlock("k3", "omitted", "l3"),
    ]
    data = encode_blocks(blocks)
    assert data[:9] == b"CMBF\x01\x00\x00\x00\x03"
    assert parse_blocks(data) == blocks
    assert parse_blocks(encode_blocks([])) == []
    for bad in (b"", b"XXXX\x01\x00\x00\x00\x00", data[:-1], data + b"\x00", data[:12]):
        with pytest.raises(FrameError):
            parse_blocks(bad)
