"""The HTTP API in-process (httpx's ASGI transport: no socket) over fake ports, through the Python client:
every route, the bearer token, and a clear 4xx for every kind of bad input."""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator, Sequence

import httpx
import numpy as np
import pytest
from pydantic import SecretStr

from policies.recency.lru import LRU
from services.runtime.breaker import LatencyBreaker
from services.tiers import codec
from services.tiers.edge.api import create_app
from services.tiers.edge.client import AsyncTiersClient, LookupRequest, TiersError, parse_lookup
from services.tiers.edge.embedder import Embedder
from services.tiers.l1.cache import L1Cache
from services.tiers.l2.block_pool import BlockPool
from services.tiers.l2.store import L2Store
from services.tiers.node.matcher import Matcher
from services.tiers.node.outbox import Outbox
from services.tiers.node.tiered import TieredCache
from services.tiers.settings import TiersSettings
from tests.unit.tiers.fakes import Clock, MemoryL3, at_cosine, unit

DIM = 16
RNG = np.random.default_rng(7)
TOKEN = "s3cret-token"


class WordEmbedder(Embedder):
    """Deterministic stand-in for MiniLM: texts with the same first word embed close together."""

    def __init__(self) -> None:
        super().__init__()
        self.state = "ready"
        self.calls: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        out = []
        for t in texts:
            word = t.split()[0].strip(",.?!").lower()
            base = unit(np.random.default_rng(zlib.crc32(word.encode())), DIM)
            out.append(at_cosine(np.random.default_rng(len(t)), base, 0.97))
        return np.stack(out).astype(np.float32)


def make_cache(clock: Clock) -> TieredCache:
    return TieredCache(
        l1=L1Cache(dim=DIM, capacity_bytes=1 << 20, max_entries=64, policy=LRU(1 << 20), clock=clock),
        l2=L2Store(BlockPool(16, xp=np, clock=clock), dim=DIM),
        l3=MemoryL3(clock=clock),
        outbox=Outbox(clock=clock),
        breaker=LatencyBreaker(clock=clock),
        node_id="api-test",
        wall_ms=clock,
        perf_ns=clock.ns,
    )


def settings(**kw: object) -> TiersSettings:
    base: dict[str, object] = {
        "embedding_dim": DIM,
        "max_value_bytes": 4096,
        "max_batch": 8,
        "max_text_chars": 200,
        "max_request_bytes": 64 * 1024,
    }
    return TiersSettings(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture
async def client() -> AsyncIterator[AsyncTiersClient]:
    app = create_app(make_cache(Clock()), settings(), WordEmbedder())
    async with AsyncTiersClient("http://tiers", transport=httpx.ASGITransport(app=app)) as c:
        yield c


@pytest.fixture
async def raw() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(make_cache(Clock()), settings(), WordEmbedder())
    async with httpx.AsyncClient(base_url="http://tiers", transport=httpx.ASGITransport(app=app)) as c:
        yield c


async def test_put_then_lookup_by_key_embedding_text_and_batch(client: AsyncTiersClient) -> None:
    vec = unit(RNG, DIM)
    put = await client.put("model:m:v1:q1", "Paris", model="m", embedding=vec, semantic_tags={"lang": "en"})
    assert put["tiers"] == ["l1", "l2", "l3"] and put["persisted"]
    by_key = await client.get("model:m:v1:q1")
    assert (by_key.hit, by_key.tier, by_key.match, by_key.value) == (True, "l1", "exact", "Paris")
    assert by_key.descriptor["semantic_tags"] == {"lang": "en"}
    by_vec = await client.lookup(embedding=at_cosine(RNG, vec, 0.95))
    assert (by_vec.match, by_vec.key, by_vec.value) == ("semantic", "model:m:v1:q1", "Paris")
    assert by_vec.similarity == pytest.approx(0.95, abs=1e-4)
    await client.put("capital", "Paris again", model="m", embed_text="Capital of France?")
    by_text = await client.lookup(text="capital city of France")
    assert (by_text.hit, by_text.key) == (True, "capital")
    batch = await client.lookup_many(
        [LookupRequest(key="model:m:v1:q1"), LookupRequest(text="Capital, please"), LookupRequest(key="nope")]
    )
    assert [(r.hit, r.key) for r in batch] == [(True, "model:m:v1:q1"), (True, "capital"), (False, None)]
    missing = await client.get("nope")
    assert not missing.hit


async def test_tensor_values_round_trip_with_their_header(client: AsyncTiersClient) -> None:
    kv = RNG.standard_normal((2, 4, 8)).astype(np.float16)
    await client.put("kv:1", kv, model="llama", kind="kv_block", layer_range=(0, 2), token_range=(16, 24))
    got = await client.get("kv:1")
    assert isinstance(got.value, np.ndarray) and got.value.dtype == np.float16
    np.testing.assert_array_equal(got.value, kv)
    bits = codec.float32_to_bfloat16(RNG.standard_normal(6).astype(np.float32))
    await client.put("kv:bf16", bits, model="llama", dtype="bfloat16")
    blob = await client.get_blob("kv:bf16")
    assert blob is not None
    header, payload = codec.decode(blob)
    assert header.dtype is codec.DType.BFLOAT16 and np.array_equal(payload, bits)
    header16 = codec.decode(await client.get_blob("kv:1") or b"")[0]
    assert (header16.layer_range, header16.token_range, header16.model) == ((0, 2), (16, 24), "llama")


async def test_binary_put_takes_kind_and_model_from_the_header(client: AsyncTiersClient) -> None:
    blob = codec.encode(np.arange(10, dtype=np.int32), kind="embedding", model="enc-1")
    put = await client.put_blob("bin", blob, ttl_hint_ms=60_000)
    assert put["size_bytes"] == len(blob)
    got = await client.get("bin")
    assert got.descriptor["kind"] == "embedding" and got.descriptor["model"] == "enc-1"
    assert got.descriptor["ttl_hint_ms"] == 60_000
    assert await client.get_blob("bin") == blob
    damaged = bytearray(blob)
    damaged[-1] ^= 0xFF
    with pytest.raises(TiersError) as err:
        await client.put_blob("bad", bytes(damaged))
    assert err.value.status == 422 and "checksum" in str(err.value.detail)


async def test_delete_and_stats(client: AsyncTiersClient) -> None:
    await client.put("k", "v", model="m")
    assert await client.delete("k")
    assert not await client.delete("k")
    assert not (await client.get("k")).hit
    stats = await client.stats()
    assert stats["puts"] == 1 and stats["deletes"] == 2 and stats["degraded"] is False
    assert stats["l3"]["breaker"]["state"] == "closed" and stats["embedder"]["state"] == "ready"


BAD_LOOKUPS = [
    ({"embedding": [0.1] * (DIM - 1)}, 422, f"has {DIM - 1} dimensions; this cache uses {DIM}"),
    ({"embedding": []}, 422, "empty"),
    ({"embedding": [0.0] * DIM}, 422, "all zeros"),
    ({"embedding_b64": "!!!"}, 422, "base64"),
    ({"embedding_b64": "AAAAAA=="}, 422, f"has 1 dimensions; this cache uses {DIM}"),
    ({"key": ""}, 422, "at least 1 character"),
    ({"text": "   "}, 422, "text is empty"),
    ({"text": "x" * 201}, 413, "limit is 200"),
    ({}, 422, "needs a key, an embedding or a text"),
    ({"text": "hi", "embedding": [0.1] * DIM}, 422, "not both"),
    ({"key": "k", "surprise": 1}, 422, "Extra inputs"),
]


@pytest.mark.parametrize(("body", "code", "message"), BAD_LOOKUPS)
async def test_bad_lookups_get_a_clear_4xx(
    raw: httpx.AsyncClient, body: dict[str, object], code: int, message: str
) -> None:
    response = await raw.post("/v1/lookup", json=body)
    assert response.status_code == code, response.text
    assert message in response.text


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
async def test_nan_and_inf_are_refused(raw: httpx.AsyncClient, literal: str) -> None:
    # Python's JSON parser accepts these literals; the API must not.
    body = '{"embedding": [' + ", ".join(["0.1"] * (DIM - 1) + [literal]) + "]}"
    response = await raw.post("/v1/lookup", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and "finite" in response.text
    put = (
        '{"model": "m", "value": {"text": "v"}, "embedding": ['
        + ", ".join(["1"] * (DIM - 1) + [literal])
        + "]}"
    )
    response = await raw.put("/v1/entries/k", content=put, headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and "finite" in response.text


async def test_bad_puts_get_a_clear_4xx(raw: httpx.AsyncClient) -> None:
    cases: list[tuple[dict[str, object], int, str]] = [
        ({"model": "m", "value": {"text": "x" * 4097}}, 413, "limit is 4096"),
        ({"model": "m", "value": {}}, 422, "exactly one of text or tensor"),
        ({"model": "", "value": {"text": "v"}}, 422, "at least 1 character"),
        ({"model": "m", "value": {"text": "v"}, "kind": "kv_block"}, 422, "kind must be 'prompt'"),
        (
            {"model": "m", "value": {"tensor": {"dtype": "float32", "shape": [3], "data_b64": "AAAA"}}},
            422,
            "needs 12",
        ),
        (
            {"model": "m", "value": {"tensor": {"dtype": "float32", "shape": [2048], "data_b64": ""}}},
            413,
            "limit is 4096",
        ),
        ({"model": "m", "value": {"text": "v"}, "similarity_tolerance": 1.5}, 422, "less than or equal to 1"),
        ({"model": "m", "value": {"text": "v"}, "embed_text": ""}, 422, "embed_text is empty"),
        ({"model": "m", "value": {"text": "v"}, "semantic_tags": {"t" * 129: "v"}}, 422, "at most 128"),
    ]
    for body, code, message in cases:
        response = await raw.put("/v1/entries/k", json=body)
        assert response.status_code == code, (body, response.text)
        assert message in response.text, (body, response.text)


async def test_oversized_bodies_and_batches(raw: httpx.AsyncClient) -> None:
    huge = json.dumps({"key": "k", "text": "x" * (70 * 1024)})
    response = await raw.post("/v1/lookup", content=huge, headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    too_many = {"requests": [{"key": f"k{i}"} for i in range(9)]}
    response = await raw.post("/v1/lookup/batch", json=too_many)
    assert response.status_code == 413 and "limit is 8" in response.text
    response = await raw.post("/v1/lookup/batch", json={"requests": []})
    assert response.status_code == 422
    long_key = "k" * 600
    response = await raw.get(f"/v1/entries/{long_key}")
    assert response.status_code == 413


async def test_bearer_token_guards_every_v1_route_and_is_never_echoed() -> None:
    app = create_app(make_cache(Clock()), settings(api_token=SecretStr(TOKEN)), WordEmbedder())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(base_url="http://tiers", transport=transport) as anon:
        for method, path in [("GET", "/v1/stats"), ("POST", "/v1/lookup"), ("DELETE", "/v1/entries/k")]:
            response = await anon.request(method, path, json={"key": "k"})
            assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        wrong = await anon.get("/v1/stats", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and TOKEN not in wrong.text
        assert (await anon.get("/healthz")).status_code == 200
        schema = (await anon.get("/openapi.json")).json()
        assert "HTTPBearer" in schema["components"]["securitySchemes"]
    async with AsyncTiersClient("http://tiers", token=TOKEN, transport=transport) as client:
        await client.put("k", "v", model="m")
        assert (await client.get("k")).value == "v"


async def test_a_write_l3_cannot_take_is_503_with_retry_after() -> None:
    clock = Clock()
    cache = make_cache(clock)
    assert isinstance(cache.l3, MemoryL3)
    cache.l3.fail = True
    app = create_app(cache, settings(), WordEmbedder())
    async with AsyncTiersClient("http://tiers", transport=httpx.ASGITransport(app=app)) as client:
        for i in range(20):  # failing calls open the breaker (5 s cooldown)
            with pytest.raises(TiersError) as err:
                await client.put(f"k{i}", "v", model="m")
            assert err.value.status == 503 and "not acknowledged" in str(err.value.detail)
        assert cache.breaker.state == "open" and err.value.retry_after_s == 5
        clock.advance(4_200)
        with pytest.raises(TiersError) as err:
            await client.delete("k0")
        assert err.value.status == 503 and err.value.retry_after_s == 1


async def test_text_lookup_without_an_embedder_is_503() -> None:
    app = create_app(make_cache(Clock()), settings(), None)
    async with AsyncTiersClient("http://tiers", transport=httpx.ASGITransport(app=app)) as client:
        with pytest.raises(TiersError) as err:
            await client.lookup(text="hello")
        assert err.value.status == 503
        assert not (await client.lookup(key="k")).hit  # everything else still works


async def test_a_put_by_text_keeps_its_prompt_for_the_guards(raw: httpx.AsyncClient) -> None:
    body = {"value": {"text": "Settings > Reset"}, "model": "m", "embed_text": "reset my password"}
    assert (await raw.put("/v1/entries/pw", json=body)).status_code == 201
    got = (await raw.post("/v1/lookup", json={"key": "pw"})).json()
    assert got["descriptor"]["prompt_text"] == "reset my password"
    # WordEmbedder puts the two 0.97 apart (same first word); the negation guard refuses the trap.
    trap = (await raw.post("/v1/lookup", json={"text": "reset not my password"})).json()
    assert not trap["hit"]
    # The miss says why: the guard that refused the best candidate, and how near that one was.
    assert trap["miss_rule"] == "guard:negation" and "negat" in trap["miss_reason"]
    assert trap["similarity"] > 0.9
    assert parse_lookup(trap).miss_rule == "guard:negation"  # and the client reads it
    far = (await raw.post("/v1/lookup", json={"text": "zebra quantum harbour"})).json()
    assert not far["hit"] and far["miss_rule"] in {"no candidate", "threshold"}
    assert (await raw.post("/v1/lookup", json={"key": "nothing-here"})).json()["miss_rule"] is None
    para = (await raw.post("/v1/lookup", json={"text": "reset my password, please"})).json()
    assert (para["hit"], para["key"], para["match"]) == (True, "pw", "semantic")


async def test_feedback_is_recorded_for_the_entry(raw: httpx.AsyncClient) -> None:
    vec = unit(RNG, DIM)
    body = {"value": {"text": "v"}, "model": "m", "embedding": vec.tolist()}
    assert (await raw.put("/v1/entries/k", json=body)).status_code == 201
    near = at_cosine(RNG, vec, 0.95).tolist()
    served = (await raw.post("/v1/lookup", json={"embedding": near})).json()
    assert served["hit"] and served["explore_key"] is None
    response = await raw.post("/v1/feedback", json={"key": "k", "embedding": near, "correct": False})
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["similarity"] == pytest.approx(0.95, abs=1e-4) and out["labels"] == 1
    assert out["threshold"] > out["similarity"] and not out["correct"]
    assert not (await raw.post("/v1/lookup", json={"embedding": near})).json()["hit"]
    by_text = await raw.post("/v1/feedback", json={"key": "k", "text": "hello there", "correct": True})
    assert by_text.status_code == 200 and by_text.json()["labels"] == 2


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"key": "nope", "embedding": [1.0] * DIM, "correct": True}, 404),
        ({"key": "k", "correct": True}, 422),  # neither text nor embedding
        ({"key": "k", "text": "hi", "embedding": [1.0] * DIM, "correct": True}, 422),
        ({"key": "k", "text": "hi"}, 422),  # no verdict
        ({"key": "k", "text": "hi", "correct": "maybe"}, 422),
        ({"key": "k", "text": "hi", "correct": True, "extra": 1}, 422),
        ({"key": "", "text": "hi", "correct": True}, 422),
        ({"key": "k", "embedding": [1.0] * (DIM + 1), "correct": True}, 422),
        ({"key": "k", "text": "x" * 201, "correct": True}, 413),
        ({"key": "plain", "text": "hi", "correct": True}, 422),  # matched by key only: no embedding
    ],
)
async def test_bad_feedback_gets_a_clear_4xx(
    raw: httpx.AsyncClient, body: dict[str, object], status: int
) -> None:
    vec = unit(RNG, DIM).tolist()
    await raw.put("/v1/entries/k", json={"value": {"text": "v"}, "model": "m", "embedding": vec})
    await raw.put("/v1/entries/plain", json={"value": {"text": "v"}, "model": "m"})
    response = await raw.post("/v1/feedback", json=body)
    assert response.status_code == status, response.text


async def test_a_lookup_by_key_and_text_embeds_only_when_the_key_is_not_in_memory() -> None:
    # The gateway sends both (the exact key of the request and its last message): an exact hit from
    # memory must not pay for an embedding; a key the node does not hold falls back to the text.
    embedder = WordEmbedder()
    app = create_app(make_cache(Clock()), settings(), embedder)
    async with AsyncTiersClient("http://tiers", transport=httpx.ASGITransport(app=app)) as c:
        await c.put("req:1", "Paris", model="m", embed_text="Capital of France?")
        embedder.calls.clear()
        hit = await c.lookup(key="req:1", text="Capital of France?", model="m")
        assert (hit.hit, hit.match, embedder.calls) == (True, "exact", [])
        other_model = await c.lookup(key="req:1", text="Capital of France?", model="m2")
        assert not other_model.hit and embedder.calls == [["Capital of France?"]]
        para = await c.lookup(key="req:2", text="Capital city of France", model="m")
        assert (para.hit, para.match, para.key) == (True, "semantic", "req:1")
        assert embedder.calls[-1] == ["Capital city of France"]


async def test_the_client_sees_an_explored_miss_and_labels_it() -> None:
    cache = make_cache(Clock())
    cache.placement.matcher = Matcher(delta=0.02, explore_rate=1.0)  # the shipped rule, exploring every time
    app = create_app(cache, settings(), WordEmbedder())
    async with AsyncTiersClient("http://tiers", transport=httpx.ASGITransport(app=app)) as c:
        await c.put("k", "the answer", model="m", embed_text="Reset a password")
        miss = await c.lookup(text="Reset my password please", model="m")
        assert (miss.hit, miss.miss_rule, miss.explore_key) == (False, "uncertain", "k")
        assert miss.explore_value == "the answer"
        label = await c.feedback("k", "Reset my password please", correct=True, explored=True)
        assert (label["key"], label["labels"], label["correct"]) == ("k", 1, True)


async def test_a_similarity_is_never_reported_above_one(client: AsyncTiersClient) -> None:
    # float32 unit vectors: v @ v reads 1.0000001 for about one vector in eight
    rng = np.random.default_rng(0)
    over = next(v for v in (unit(rng, DIM) for _ in range(500)) if float(v @ v) > 1.0)
    await client.put("one", "v", model="m", embedding=over)
    got = await client.lookup(embedding=over, model="m")
    assert got.hit and got.similarity is not None and got.similarity <= 1.0


async def test_a_label_for_the_entrys_own_text_teaches_the_threshold_nothing() -> None:
    cache = make_cache(Clock())
    cache.placement.matcher = Matcher(delta=0.02)
    app = create_app(cache, settings(), WordEmbedder())
    async with AsyncTiersClient("http://tiers", transport=httpx.ASGITransport(app=app)) as c:
        await c.put("k", "the answer", model="m", embed_text="Reset a password")
        same = await c.feedback("k", "reset a  PASSWORD", correct=True)
        assert (same["learned"], same["labels"]) == (False, 0)
        other = await c.feedback("k", "Reset my password please", correct=True)
        assert (other["learned"], other["labels"]) == (True, 1)
    assert cache.matcher.decision.learner.weighted_pool()[0].size == 1
