"""The proxy over several instances (no sockets: httpx's mock transports): an instance that cannot be
reached is left out and the request answered by the next; with none left the answer is a 502 in
OpenAI's shape; in-flight counts go back to zero either way; each answer names its instance."""

from __future__ import annotations

import json
from typing import Any

import httpx

from schemas.events import CacheAccessBatch, Event
from services.gateway.api import create_app
from services.gateway.engines import Engine, Engines
from services.gateway.proxy import Proxy
from services.gateway.routing import Instance
from services.gateway.settings import GatewaySettings
from services.gateway.tier_cache import TierCache
from services.gateway.upstream import Upstream
from services.runtime.breaker import FailureBreaker

ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
}


def engine(name: str, handler: Any) -> Engine:
    upstream = Upstream(
        httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url=f"http://{name}/v1"),
        FailureBreaker(consecutive=1, window=10, min_calls=10, cooldown_ms=60_000, clock=lambda: 0),
        timeout_s=5,
    )
    return Engine(name, name, upstream, Instance(name), f"http://{name}/metrics")


async def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


async def answers(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=ANSWER)


async def miss(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"hit": False})


async def ask(engines: Engines) -> httpx.Response:
    async def publish(event: Event, wait: bool) -> None:
        return None

    settings = GatewaySettings(kafka={"bootstrap": "unused:1"})  # type: ignore[arg-type]
    cache = TierCache(
        httpx.AsyncClient(transport=httpx.MockTransport(miss), base_url="http://tiers"),
        FailureBreaker(consecutive=5, window=10, min_calls=10, failure_ratio=1.0, clock=lambda: 0),
        lookup_timeout_s=5,
        store_timeout_s=5,
    )
    proxy = Proxy(settings, cache, engines, publish, clock_ms=lambda: 0)
    app = create_app(proxy, settings, lambda: {})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "temperature": 0.5}
        return await client.post("/v1/chat/completions", json=body)


async def test_an_unreachable_instance_is_left_out_and_the_next_answers() -> None:
    engines = Engines([engine("a", refused), engine("b", answers)], tokens=None, model=None, block_size=16)
    response = await ask(engines)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "hi"
    assert response.headers["x-cachemesh-instance"] == "b"
    assert [(e.state.in_flight, e.state.pending_blocks) for e in engines.engines] == [(0, 0.0), (0, 0.0)]
    assert not engines.engines[0].upstream.breaker.allow()  # a is out until its cooldown
    # the next request does not try a at all
    again = await ask(engines)
    assert again.headers["x-cachemesh-instance"] == "b" and engines.engines[0].upstream.calls == 1


async def test_an_instance_that_recovers_is_put_back_by_its_first_probe() -> None:
    """Choosing among instances looks at every breaker without taking a half-open one's probe: the
    request routed there is that probe, and its answer closes the breaker."""
    now = [0]
    calls = [0]

    async def flaky(request: httpx.Request) -> httpx.Response:
        calls[0] += 1
        if calls[0] == 1:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json=ANSWER)

    a, b = engine("a", flaky), engine("b", answers)
    a.upstream.breaker.clock = lambda: now[0]
    engines = Engines([a, b], tokens=None, model=None, block_size=16)
    assert (await ask(engines)).headers["x-cachemesh-instance"] == "b"
    assert a.upstream.breaker.state == "open"
    now[0] = 60_000  # the cooldown is over: a may be probed
    response = await ask(engines)
    assert response.status_code == 200 and response.headers["x-cachemesh-instance"] == "a"
    assert a.upstream.breaker.state == "closed" and a.upstream.breaker.rejected == 0


async def test_with_every_instance_unreachable_the_answer_is_a_502() -> None:
    engines = Engines([engine("a", refused), engine("b", refused)], tokens=None, model=None, block_size=16)
    response = await ask(engines)
    assert response.status_code == 502 and response.json()["error"]["type"] == "upstream_error"
    assert [e.upstream.calls for e in engines.engines] == [1, 1]
    assert [(e.state.in_flight, e.state.pending_blocks) for e in engines.engines] == [(0, 0.0), (0, 0.0)]


async def test_a_streamed_answer_times_its_first_token_and_sends_its_blocks_with_it() -> None:
    """The first piece's time and the usage's cached tokens go to the instance's FTL fit, and the
    conversation's blocks go out once it answered: a hit where the engine said it had them cached."""
    usage = {"prompt_tokens": 70, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 32}}
    chunks = [
        {"id": "s", "object": "text_completion", "choices": [{"index": 0, "text": "a"}]},
        {"id": "s", "object": "text_completion", "choices": [], "usage": usage},
    ]
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"

    class Pieces(httpx.AsyncByteStream):
        async def __aiter__(self) -> Any:
            for piece in sse.split("\n\n")[:-1]:
                yield (piece + "\n\n").encode()

    async def streams(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Pieces(), headers={"content-type": "text/event-stream"})

    events: list[Event] = []

    async def publish(event: Event, wait: bool) -> None:
        events.append(event)

    engines = Engines([engine("a", streams), engine("b", streams)], tokens=None, model="m", block_size=32)
    engines.tokens = type("Ids", (), {"of": staticmethod(lambda body: body["prompt"])})()
    settings = GatewaySettings(kafka={"bootstrap": "unused:1"})  # type: ignore[arg-type]
    cache = TierCache(
        httpx.AsyncClient(transport=httpx.MockTransport(miss), base_url="http://tiers"),
        FailureBreaker(consecutive=5, window=10, min_calls=10, failure_ratio=1.0, clock=lambda: 0),
        lookup_timeout_s=5,
        store_timeout_s=5,
    )
    proxy = Proxy(settings, cache, engines, publish, clock_ms=lambda: 0)
    app = create_app(proxy, settings, lambda: {})
    body = {"model": "m", "prompt": list(range(100, 170)), "stream": True, "temperature": 0.5}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
        response = await client.post(
            "/v1/completions", json=body, headers={"x-cachemesh-conversation-id": "c1"}
        )
        assert response.status_code == 200 and "[DONE]" in response.text
    await proxy.drain()
    chosen = engines.by_name(response.headers["x-cachemesh-instance"])
    assert chosen.ftl.n == 1 and chosen.ftl.sum_m == 1 - 32 / 70
    [batch] = [e for e in events if isinstance(e, CacheAccessBatch)]
    assert [a.hit for a in batch.events] == [True, False]  # 32 tokens cached: the first block
    assert all(a.latency_ms > 0 and a.trace_id == "c1" for a in batch.events)
