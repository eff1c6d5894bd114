"""The gateway's request path over in-memory transports (no sockets): the tier node and the upstream are
httpx MockTransports, the gateway's app runs through httpx's ASGI transport. What the gateway sends each
side, and what it answers, for hits, misses, failures, hedging, feedback and conversations."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from schemas.events import ConversationEnded, ConversationStarted, Event
from services.gateway.answers import decode_answer, encode_answer
from services.gateway.api import create_app
from services.gateway.engines import Engine, Engines
from services.gateway.proxy import Proxy
from services.gateway.routing import Instance
from services.gateway.settings import GatewaySettings
from services.gateway.sse import SseParser
from services.gateway.tier_cache import TierCache
from services.gateway.upstream import Upstream
from services.runtime.breaker import FailureBreaker

TOKEN = "t0k"
ANSWER = {
    "id": "up-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Use the reset link."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5},
}
Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


@dataclass
class World:
    tier_requests: list[httpx.Request] = field(default_factory=list)
    upstream_requests: list[httpx.Request] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    lookup: dict[str, Any] = field(default_factory=lambda: {"hit": False})
    upstream: Handler | None = None
    lookup_hangs: bool = False
    proxy: Proxy | None = None

    def puts(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.tier_requests if r.method == "PUT"]


def _hit(text: str = encode_answer(ANSWER), match: str = "semantic") -> dict[str, Any]:
    return {
        "hit": True,
        "key": "gw:chat:abc",
        "match": match,
        "similarity": 0.97,
        "tier": "l1",
        "value": {"text": text},
    }


@pytest.fixture
async def gateway() -> AsyncIterator[Callable[..., Any]]:
    clients: list[httpx.AsyncClient] = []

    async def make(**overrides: Any) -> tuple[httpx.AsyncClient, World]:
        world = World()
        forever = asyncio.Event()

        async def tiers(request: httpx.Request) -> httpx.Response:
            world.tier_requests.append(request)
            if request.url.path == "/v1/lookup":
                if world.lookup_hangs:
                    await forever.wait()
                return httpx.Response(200, json=world.lookup)
            if request.method == "PUT":
                return httpx.Response(201, json={"key": "k"})
            if request.url.path == "/v1/feedback":
                return httpx.Response(200, json={"labels": 1, "similarity": 0.97})
            return httpx.Response(200, json={"deleted": True})

        async def upstream(request: httpx.Request) -> httpx.Response:
            world.upstream_requests.append(request)
            if world.upstream is not None:
                return await world.upstream(request)
            return httpx.Response(200, json=ANSWER)

        async def publish(event: Event, wait: bool) -> None:
            world.events.append(event)

        settings = GatewaySettings(
            **{
                "api_token": TOKEN,
                "lookup_timeout_ms": 5_000,
                "kafka": {"bootstrap": "unused:1"},
                **overrides,
            }
        )
        breaker = FailureBreaker(consecutive=3, window=10, min_calls=10, cooldown_ms=60_000, clock=lambda: 0)
        cache = TierCache(
            httpx.AsyncClient(transport=httpx.MockTransport(tiers), base_url="http://tiers"),
            FailureBreaker(consecutive=5, window=10, min_calls=10, failure_ratio=1.0, clock=lambda: 0),
            lookup_timeout_s=settings.lookup_timeout_ms / 1000,
            store_timeout_s=5,
            invalidate_threshold=settings.invalidate_threshold,
        )
        up = Upstream(
            httpx.AsyncClient(transport=httpx.MockTransport(upstream), base_url="http://up/v1"),
            breaker,
            timeout_s=5,
        )
        engines = Engines(
            [Engine("upstream", "upstream", up, Instance("upstream"), "http://up/metrics")],
            tokens=None,
            model=None,
            block_size=16,
        )
        world.proxy = Proxy(settings, cache, engines, publish, clock_ms=lambda: 0)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(create_app(world.proxy, settings, lambda: {})),
            base_url="http://gw",
            headers={"authorization": f"Bearer {TOKEN}"},
        )
        clients.extend([client, cache.http, up.http])
        return client, world

    yield make
    for c in clients:
        await c.aclose()


def chat(text: str = "How do I reset my password?", **kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **kw}


async def test_a_miss_is_forwarded_relayed_and_stored_with_its_descriptor(gateway) -> None:
    client, world = await gateway()
    r = await client.post("/v1/chat/completions", json=chat(), headers={"x-cachemesh-conversation-id": "c1"})
    assert r.status_code == 200 and r.json() == ANSWER
    assert r.headers["x-cachemesh-cache"] == "miss" and r.headers["x-cachemesh-key"].startswith("gw:chat:")
    lookup = json.loads(world.tier_requests[0].content)
    assert lookup["text"] == "How do I reset my password?" and lookup["trace_id"] == "c1"
    assert lookup["model"].startswith("m#") and lookup["key"] == r.headers["x-cachemesh-key"]
    assert json.loads(world.upstream_requests[0].content) == chat()  # passed on as it came
    await world.proxy.drain()  # type: ignore[union-attr]
    (put,) = world.puts()
    assert put["model"] == lookup["model"] and put["embed_text"] == lookup["text"] and put["trace_id"] == "c1"
    assert put["semantic_tags"] == {"source": "gateway", "route": "chat", "model": "m"}
    assert put["invalidate_threshold"] == 1.0 and put["ttl_hint_ms"] > 0
    stored = decode_answer(put["value"]["text"])
    assert stored is not None and stored["choices"] == ANSWER["choices"]
    assert [type(e) for e in world.events] == [ConversationStarted]
    assert "x-cachemesh-miss" not in r.headers  # the node did not say why: nothing to relay


async def test_a_miss_says_which_rule_refused_the_nearest_answer(gateway) -> None:
    client, world = await gateway()
    world.lookup = {"hit": False, "similarity": 0.9331, "miss_rule": "guard:instruction", "miss_reason": "-"}
    r = await client.post("/v1/chat/completions", json=chat())
    assert r.headers["x-cachemesh-cache"] == "miss"
    assert r.headers["x-cachemesh-miss"] == "guard:instruction; similarity 0.9331"


def _with_content(content: str) -> dict[str, Any]:
    choice = {**ANSWER["choices"][0], "message": {"role": "assistant", "content": content}}
    return {**ANSWER, "choices": [choice]}


@pytest.mark.parametrize(
    ("cached", "agreed"), [("Use the reset link!", True), ("Call the help desk on 555.", False)]
)
async def test_an_explored_miss_becomes_a_label_for_the_node(gateway, cached: str, agreed: bool) -> None:
    # The node explores its candidate: the model answers, the gateway compares the answers and tells the
    # node whether they agree (a label without a human), besides storing the fresh answer.
    client, world = await gateway()
    world.lookup = {
        "hit": False,
        "similarity": 0.93,
        "miss_rule": "uncertain",
        "explore_key": "gw:chat:near",
        "explore_value": {"text": encode_answer(_with_content(cached))},
    }
    r = await client.post("/v1/chat/completions", json=chat())
    assert (
        r.status_code == 200 and r.json() == ANSWER and r.headers["x-cachemesh-miss"].startswith("uncertain")
    )
    await world.proxy.drain()  # type: ignore[union-attr]
    (label,) = [json.loads(q.content) for q in world.tier_requests if q.url.path == "/v1/feedback"]
    assert label == {
        "key": "gw:chat:near",
        "text": "How do I reset my password?",
        "correct": agreed,
        "explored": True,
    }
    assert world.proxy.counts["explore_agreed" if agreed else "explore_disagreed"] == 1  # type: ignore[union-attr]
    assert len(world.puts()) == 1


async def test_exploration_labels_can_be_switched_off(gateway) -> None:
    client, world = await gateway(label_explorations=False)
    world.lookup = {"hit": False, "explore_key": "k", "explore_value": {"text": encode_answer(ANSWER)}}
    await client.post("/v1/chat/completions", json=chat())
    await world.proxy.drain()  # type: ignore[union-attr]
    assert not [q for q in world.tier_requests if q.url.path == "/v1/feedback"]


async def test_a_hit_is_answered_by_the_gateway_json_and_sse(gateway) -> None:
    client, world = await gateway(stream_chunk_chars=4)
    world.lookup = _hit()
    r = await client.post("/v1/chat/completions", json=chat())
    assert r.status_code == 200 and not world.upstream_requests
    assert (r.headers["x-cachemesh-cache"], r.headers["x-cachemesh-match"]) == ("hit", "semantic")
    assert (r.headers["x-cachemesh-similarity"], r.headers["x-cachemesh-key"]) == ("0.9700", "gw:chat:abc")
    body = r.json()
    assert body["id"].startswith("chatcmpl-cm") and body["choices"] == ANSWER["choices"]

    r = await client.post("/v1/chat/completions", json=chat(stream=True))
    assert r.headers["content-type"].startswith("text/event-stream")
    events = SseParser().feed(r.content)
    assert events[-1] == "[DONE]" and len(events) > 5
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == "Use the reset link."
    assert not world.upstream_requests and not world.puts()


async def test_a_value_that_is_not_a_gateway_answer_is_a_miss(gateway) -> None:
    client, world = await gateway()
    world.lookup = _hit(text="written by someone else")
    r = await client.post("/v1/chat/completions", json=chat())
    assert r.headers["x-cachemesh-cache"] == "miss" and len(world.upstream_requests) == 1


async def test_streamed_miss_relayed_then_stored_whole(gateway) -> None:
    client, world = await gateway()
    chunks = [
        {"id": "s", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [c]}
        for c in (
            {"index": 0, "delta": {"role": "assistant", "content": "Use "}, "finish_reason": None},
            {"index": 0, "delta": {"content": "the link."}, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": "stop"},
        )
    ]
    sse = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"

    async def pieces() -> AsyncIterator[bytes]:
        for i in range(0, len(sse), 50):  # cut anywhere, as a network would
            yield sse[i : i + 50]

    async def streamed(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=pieces(), headers={"content-type": "text/event-stream"})

    world.upstream = streamed
    r = await client.post("/v1/chat/completions", json=chat(stream=True))
    assert r.content == sse and r.headers["x-cachemesh-cache"] == "miss"
    await world.proxy.drain()  # type: ignore[union-attr]
    (put,) = world.puts()
    stored = decode_answer(put["value"]["text"])
    assert stored is not None and stored["choices"][0]["message"]["content"] == "Use the link."


@pytest.mark.parametrize(
    ("params", "headers", "reason"),
    [
        ({"temperature": 0.8}, {}, "temperature>0"),
        ({"n": 2}, {}, "n>1"),
        ({}, {"x-cachemesh-bypass": "1"}, "x-cachemesh-bypass"),
    ],
)
async def test_bypass_neither_looks_up_nor_stores(gateway, params, headers, reason) -> None:
    client, world = await gateway()
    r = await client.post("/v1/chat/completions", json=chat(**params), headers=headers)
    assert (r.headers["x-cachemesh-cache"], r.headers["x-cachemesh-bypass-reason"]) == ("bypass", reason)
    await world.proxy.drain()  # type: ignore[union-attr]
    assert not world.tier_requests and len(world.upstream_requests) == 1


async def test_no_cache_skips_the_lookup_but_stores_the_fresh_answer(gateway) -> None:
    client, world = await gateway()
    r = await client.post("/v1/chat/completions", json=chat(), headers={"cache-control": "no-cache"})
    assert r.headers["x-cachemesh-cache"] == "bypass"
    await world.proxy.drain()  # type: ignore[union-attr]
    assert [req.method for req in world.tier_requests] == ["PUT"]


async def test_upstream_errors_are_relayed_and_never_stored(gateway) -> None:
    client, world = await gateway()

    async def failing(_: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": {"message": "boom"}})

    world.upstream = failing
    r = await client.post("/v1/chat/completions", json=chat())
    assert r.status_code == 500 and r.json() == {"error": {"message": "boom"}}
    r = await client.post("/v1/chat/completions", json=chat(stream=True))
    assert r.status_code == 500 and r.json() == {"error": {"message": "boom"}}

    async def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    world.upstream = unreachable
    r = await client.post("/v1/chat/completions", json=chat())
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unreachable"
    # Three failures in a row: the breaker is open, the next miss is refused without a call.
    calls = len(world.upstream_requests)
    r = await client.post("/v1/chat/completions", json=chat())
    assert r.status_code == 503 and r.headers["retry-after"] and len(world.upstream_requests) == calls
    world.lookup = _hit()
    assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200  # hits still served
    await world.proxy.drain()  # type: ignore[union-attr]
    assert not world.puts()


async def test_a_hanging_lookup_holds_a_miss_only_for_its_timeout(gateway) -> None:
    client, world = await gateway(lookup_timeout_ms=20)
    world.lookup_hangs = True
    r = await client.post("/v1/chat/completions", json=chat())
    assert r.status_code == 200 and r.headers["x-cachemesh-lookup"] == "timeout"
    assert 20 <= float(r.headers["x-cachemesh-lookup-ms"]) < 1_000


async def test_hedged_the_upstream_answers_while_the_lookup_hangs(gateway) -> None:
    client, world = await gateway(hedge_after_ms=0, lookup_timeout_ms=60_000)
    world.lookup_hangs = True
    r = await client.post("/v1/chat/completions", json=chat())
    assert r.status_code == 200 and r.headers["x-cachemesh-lookup"] == "hedged"
    assert world.proxy is not None and world.proxy.counts["hedge_won_by_upstream"] == 1


async def test_hedged_a_hit_cancels_the_upstream_call(gateway) -> None:
    client, world = await gateway(hedge_after_ms=0)
    world.lookup = _hit()
    forever = asyncio.Event()

    async def slow(_: httpx.Request) -> httpx.Response:
        await forever.wait()
        raise AssertionError("never answers")

    world.upstream = slow
    r = await client.post("/v1/chat/completions", json=chat())
    assert r.headers["x-cachemesh-cache"] == "hit"
    assert world.proxy is not None and world.proxy.upstream.breaker.state == "closed"


@pytest.mark.parametrize(
    ("content", "status", "fragment"),
    [
        (b"{nope", 400, "valid JSON"),
        (json.dumps({"model": "m"}).encode(), 400, "messages"),
        (json.dumps(chat("x" * 5000)).encode(), 413, "limit"),
    ],
)
async def test_bad_input(gateway, content: bytes, status: int, fragment: str) -> None:
    client, _ = await gateway(max_request_bytes=4096)
    r = await client.post("/v1/chat/completions", content=content)
    assert r.status_code == status and fragment in r.json()["error"]["message"]


async def test_bad_headers_and_auth(gateway) -> None:
    client, _ = await gateway()
    r = await client.post("/v1/chat/completions", json=chat(), headers={"x-cachemesh-tenant": "a b"})
    assert r.status_code == 400
    r = await client.post("/v1/chat/completions", json=chat(), headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert (await client.get("/healthz", headers={"authorization": ""})).status_code == 200


async def test_feedback_by_response_id(gateway) -> None:
    client, world = await gateway()
    world.lookup = _hit(match="semantic")
    semantic = (await client.post("/v1/chat/completions", json=chat("How can I reset my password?"))).json()
    world.lookup = _hit(match="exact")
    exact = (await client.post("/v1/chat/completions", json=chat())).json()
    r = await client.post("/v1/cachemesh/feedback", json={"response_id": semantic["id"], "correct": False})
    assert r.json() == {
        "key": "gw:chat:abc",
        "correct": False,
        "evicted": False,
        "tier_feedback": {"labels": 1, "similarity": 0.97},
    }
    sent = json.loads(world.tier_requests[-1].content)
    assert sent == {
        "key": "gw:chat:abc",
        "text": "How can I reset my password?",
        "correct": False,
        "explored": False,
    }
    r = await client.post("/v1/cachemesh/feedback", json={"response_id": exact["id"]})
    assert r.json()["evicted"] is True and world.tier_requests[-1].method == "DELETE"
    assert (await client.post("/v1/cachemesh/feedback", json={"response_id": "x"})).status_code == 404
    assert (await client.post("/v1/cachemesh/feedback", json={"correct": "no"})).status_code == 400


async def test_conversation_end_is_published_before_the_answer(gateway) -> None:
    client, world = await gateway()
    await client.post("/v1/chat/completions", json=chat(), headers={"x-cachemesh-conversation-id": "c9"})
    await client.post("/v1/chat/completions", json=chat(), headers={"x-cachemesh-conversation-id": "c9"})
    r = await client.delete("/v1/cachemesh/conversations/c9")
    assert r.status_code == 202 and r.json()["tracked"] is True
    await world.proxy.drain()  # type: ignore[union-attr]
    assert [(type(e), e.trace_id) for e in world.events] == [
        (ConversationStarted, "c9"),
        (ConversationEnded, "c9"),
    ]  # type: ignore[attr-defined]


async def test_models_pass_through(gateway) -> None:
    client, world = await gateway()

    async def models(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})

    world.upstream = models
    r = await client.get("/v1/models")
    assert r.json()["data"] == [{"id": "m"}] and world.upstream_requests[0].url.path == "/v1/models"


async def test_bad_bodies_get_a_400_with_the_reason_never_a_500(gateway) -> None:
    client, world = await gateway()
    deep = b'{"model": "m", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    for raw, reason in (
        (deep, "nests deeper"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
            "Infinity",
        ),
        (b'{"model": "m", "messages": [{"role": "user", "content": 123}]}', "content"),
    ):
        r = await client.post(
            "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
        assert r.status_code == 400 and reason in r.json()["error"]["message"]
    for body, reason in (
        ({"response_id": {"a": 1}}, "response_id must be a string"),
        ({"key": "k", "text": 5}, "text must be a string"),
        ({"key": "k", "evict": "yes"}, "evict must be true or false"),
    ):
        r = await client.post("/v1/cachemesh/feedback", json=body)
        assert r.status_code == 400 and reason in r.json()["error"]["message"]
    r = await client.post("/v1/cachemesh/feedback", content=b"[" * 5000 + b"]" * 5000)
    assert r.status_code == 400
    assert not world.upstream_requests  # nothing bad was passed on
