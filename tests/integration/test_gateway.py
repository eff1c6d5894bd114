"""The gateway end to end with the official `openai` client: a real tier node (L1 + Postgres L3, the
real all-MiniLM-L6-v2 and match guards), real Kafka, and an OpenAI-compatible upstream double that
counts its calls. Misses go upstream once, repeats and paraphrases come from the cache, traps do not,
streams work both ways, a conversation's end removes its entries, and upstream failures surface as
errors that are never cached."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import requests
from aiokafka import AIOKafkaConsumer

from infra.paths import free_port
from infra.standin import UpstreamDouble, answer_for, serving_upstream
from schemas.events import ConversationEnded, ConversationStarted
from schemas.topics import qualified
from schemas.wire import decode
from services.gateway.answers import answers_agree
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings
from services.tiers.service import TiersService
from tests.integration.conftest import kafka_settings_for
from tests.integration.fuzzing import fuzz
from tests.integration.nodes import running, serving, until
from tests.unit.tiers.minilm import NOT_RESET, PARAPHRASE, RESET

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOKEN = "gw-test-token"


@dataclass
class Mesh:
    node: TiersService
    gateway: GatewayService
    upstream: UpstreamDouble
    client: openai.AsyncOpenAI
    model: str

    @property
    def stored(self) -> int:
        assert self.gateway.proxy is not None
        return self.gateway.proxy.cache.counts["stored"]

    async def chat(self, text: str, **kw: Any) -> tuple[httpx.Headers, Any]:
        raw = await self.client.chat.completions.with_raw_response.create(
            model=self.model, messages=[{"role": "user", "content": text}], **kw
        )
        return raw.headers, raw.parse()

    async def chat_stream(self, text: str, **kw: Any) -> tuple[httpx.Headers, list[Any]]:
        raw = await self.client.chat.completions.with_raw_response.create(
            model=self.model, messages=[{"role": "user", "content": text}], stream=True, **kw
        )
        return raw.headers, [chunk async for chunk in raw.parse()]


@pytest.fixture
def gateway_mesh(kafka, namespace, topics_on, node_settings) -> Callable[..., Any]:  # type: ignore[no-untyped-def]
    @contextlib.asynccontextmanager
    async def make(
        tiers_url: str | None = None, node: dict[str, Any] | None = None, **overrides: Any
    ) -> AsyncIterator[Mesh]:
        await topics_on(kafka)
        node_cm = running(
            # The fixed rule (a paraphrase served from the first request) unless a test asks otherwise.
            node_settings(
                "gw",
                embedder_preload=True,
                l3_breaker_p99_ms=10_000.0,
                **{"match_rule": "fixed", **(node or {})},
            )
        )
        async with node_cm as node, serving_upstream() as upstream:
            # The model loads once per node; lookups are timed from then on.
            await until(lambda: node.embedder.state in ("ready", "failed"), timeout_s=120, step_s=0.05)
            assert node.embedder.state == "ready", node.embedder.error
            settings = GatewaySettings(
                **{
                    "node_id": f"gw-{namespace}",
                    "api_port": 0,
                    "metrics_port": 0,
                    "api_token": TOKEN,
                    "upstream_url": upstream.url,
                    "tiers_url": tiers_url or node.api_url,
                    # Generous: no lookup or write may time out on a loaded machine (one test shortens it).
                    "lookup_timeout_ms": 30_000,
                    "store_timeout_ms": 30_000,
                    "kafka": kafka_settings_for(kafka, namespace),
                    **overrides,
                }
            )
            async with (
                serving(GatewayService(settings)) as gateway,
                openai.AsyncOpenAI(
                    base_url=f"{gateway.api_url}/v1", api_key=TOKEN, max_retries=0, timeout=120
                ) as client,
            ):
                # A new model per test: the shared Postgres keeps earlier runs' entries.
                yield Mesh(node, gateway, upstream, client, f"stub-{uuid.uuid4().hex[:8]}")

    return make


async def test_miss_once_then_repeat_and_paraphrase_from_the_cache_but_not_the_traps(gateway_mesh) -> None:
    async with gateway_mesh() as mesh:
        headers, first = await mesh.chat(RESET)
        assert headers["x-cachemesh-cache"] == "miss"
        assert first.choices[0].message.content == answer_for(RESET)
        assert mesh.upstream.completions == 1
        await until(lambda: mesh.stored == 1, timeout_s=60)

        headers, again = await mesh.chat(RESET)
        assert (headers["x-cachemesh-cache"], headers["x-cachemesh-match"]) == ("hit", "exact")
        assert headers["x-cachemesh-key"] == first_key(mesh, RESET)
        assert again.choices[0].message.content == answer_for(RESET) and again.id != first.id
        headers, para = await mesh.chat(PARAPHRASE)
        assert (headers["x-cachemesh-cache"], headers["x-cachemesh-match"]) == ("hit", "semantic")
        assert float(headers["x-cachemesh-similarity"]) >= 0.92
        assert para.choices[0].message.content == answer_for(RESET)
        assert mesh.upstream.completions == 1  # neither went upstream

        headers, trap = await mesh.chat(NOT_RESET)  # 0.93 to RESET: the negation guard refuses it
        assert headers["x-cachemesh-cache"] == "miss"
        assert trap.choices[0].message.content == answer_for(NOT_RESET)
        assert mesh.upstream.completions == 2

        order42, order43 = (f"How many days do I have to return order {n}?" for n in (42, 43))
        await mesh.chat(order42)
        await until(lambda: mesh.stored == 3, timeout_s=60)
        headers, changed = await mesh.chat(order43)
        assert headers["x-cachemesh-cache"] == "miss"
        assert changed.choices[0].message.content == answer_for(order43)
        assert mesh.upstream.completions == 4

        # Sampling at temperature > 0 asks for a new answer; the opt-out header skips the cache.
        headers, _ = await mesh.chat(RESET, temperature=0.9)
        assert (headers["x-cachemesh-cache"], headers["x-cachemesh-bypass-reason"]) == (
            "bypass",
            "temperature>0",
        )
        headers, _ = await mesh.chat(RESET, extra_headers={"x-cachemesh-bypass": "1"})
        assert headers["x-cachemesh-cache"] == "bypass"
        assert mesh.upstream.completions == 6
        # Another tenant has its own namespace: nothing of this one's is served to it.
        headers, _ = await mesh.chat(RESET, extra_headers={"x-cachemesh-tenant": "other"})
        assert headers["x-cachemesh-cache"] == "miss"
        assert mesh.upstream.completions == 7

        models = await mesh.client.models.list()
        assert [m.id for m in models.data] == ["stub-model"]


def first_key(mesh: Mesh, text: str) -> str:
    from services.gateway.requests import normalise_chat

    return normalise_chat({"model": mesh.model, "messages": [{"role": "user", "content": text}]}).key


async def test_an_explored_miss_becomes_a_label_for_the_tier_node(gateway_mesh) -> None:
    # The node's learned decision (δ 2%) is cold: it serves nothing by similarity and explores every
    # grey-zone candidate here (budget 1.0). The gateway compares the model's answer with the candidate's
    # and reports whether they agree: a label without a human, in the node's pool.
    async with gateway_mesh(node={"match_rule": "learned", "match_explore_rate": 1.0}) as mesh:
        await mesh.chat(RESET)
        await until(lambda: mesh.stored == 1, timeout_s=60)
        headers, para = await mesh.chat(PARAPHRASE)
        assert headers["x-cachemesh-cache"] == "miss" and headers["x-cachemesh-miss"].startswith("uncertain")
        assert para.choices[0].message.content == answer_for(PARAPHRASE)
        assert mesh.gateway.proxy is not None
        counts = mesh.gateway.proxy.counts
        await until(lambda: counts["explore_agreed"] + counts["explore_disagreed"] == 1, timeout_s=60)
        # The node holds the gateway's verdict on the two answers as an exploration label.
        agree = answers_agree(answer_for(PARAPHRASE), answer_for(RESET))
        assert counts["explore_agreed" if agree else "explore_disagreed"] == 1
        learner = mesh.node.cache.matcher.decision.learner
        assert learner.pool_labels == [agree] and learner.pool_explored == [True]
        assert learner.pool_sims[0] >= 0.9


async def test_streaming_misses_are_relayed_and_stored_and_hits_stream_back(gateway_mesh) -> None:
    async with gateway_mesh(stream_chunk_chars=8) as mesh:
        headers, chunks = await mesh.chat_stream(RESET, stream_options={"include_usage": True})
        assert headers["x-cachemesh-cache"] == "miss"
        assert headers["content-type"].startswith("text/event-stream")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == answer_for(RESET)
        assert len(chunks) > 5 and chunks[-2].choices[0].finish_reason == "stop" and chunks[-1].usage
        await until(lambda: mesh.stored == 1, timeout_s=60)

        headers, cached = await mesh.chat_stream(PARAPHRASE, stream_options={"include_usage": True})
        assert (headers["x-cachemesh-cache"], headers["x-cachemesh-match"]) == ("hit", "semantic")
        pieces = [c.choices[0].delta.content for c in cached if c.choices and c.choices[0].delta.content]
        assert "".join(pieces) == answer_for(RESET)
        assert len(pieces) >= 5 and all(len(p) <= 8 for p in pieces)
        assert cached[-1].usage is not None and cached[-1].usage.total_tokens > 0
        # The streamed answer, stored whole, also serves a plain request.
        headers, whole = await mesh.chat(RESET)
        assert headers["x-cachemesh-cache"] == "hit"
        assert whole.choices[0].message.content == answer_for(RESET)
        assert mesh.upstream.completions == 1

        # /v1/completions, streamed both ways.
        prompt = "Write the word hello"
        first = [
            c
            async for c in await mesh.client.completions.create(model=mesh.model, prompt=prompt, stream=True)
        ]
        assert "".join(c.choices[0].text for c in first) == answer_for(prompt)
        await until(lambda: mesh.stored == 2, timeout_s=60)
        raw = await mesh.client.completions.with_raw_response.create(
            model=mesh.model, prompt=prompt, stream=True
        )
        assert raw.headers["x-cachemesh-cache"] == "hit"
        again = [c async for c in raw.parse()]
        assert "".join(c.choices[0].text for c in again) == answer_for(prompt)
        assert mesh.upstream.completions == 2

        # A stream the upstream breaks off is relayed as far as it got, and never stored.
        mesh.upstream.break_stream = True
        with contextlib.suppress(openai.APIError, httpx.HTTPError):
            await mesh.chat_stream("Tell me about broken streams")
        mesh.upstream.break_stream = False
        # A later answer is stored (a store of the broken one, queued before it, would be done by then),
        # and the broken prompt asked again goes upstream: nothing was kept for it.
        await mesh.chat("A marker after the broken stream")
        await until(lambda: mesh.stored == 3, timeout_s=60)
        headers, _ = await mesh.chat("Tell me about broken streams")
        assert headers["x-cachemesh-cache"] == "miss"
        assert mesh.gateway.proxy is not None


class LifecycleTap:
    def __init__(self, bootstrap: str, namespace: str) -> None:
        self.events: list[Any] = []
        self._reader = AIOKafkaConsumer(
            qualified(ConversationEnded.topic, namespace),
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
        )
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LifecycleTap:
        await self._reader.start()
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._reader.stop()

    async def _read(self) -> None:
        async for record in self._reader:
            self.events.append(decode(record.value))

    def seen(self, kind: type, trace_id: str) -> bool:
        return any(isinstance(e, kind) and e.trace_id == trace_id for e in self.events)


async def test_a_conversation_end_removes_its_entries(gateway_mesh, kafka, namespace) -> None:
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    async with gateway_mesh(conversation_idle_ms=0) as mesh, LifecycleTap(kafka.bootstrap, namespace) as tap:
        in_conversation = {"x-cachemesh-conversation-id": conversation}
        await mesh.chat(RESET, extra_headers=in_conversation)
        await mesh.chat("What is the capital of France?")  # outside any conversation
        await until(lambda: mesh.stored == 2, timeout_s=60)
        headers, _ = await mesh.chat(RESET, extra_headers=in_conversation)
        assert headers["x-cachemesh-cache"] == "hit"
        await until(lambda: tap.seen(ConversationStarted, conversation), timeout_s=30)

        async with httpx.AsyncClient(
            base_url=mesh.gateway.api_url, headers={"authorization": f"Bearer {TOKEN}"}
        ) as http:
            ended = await http.delete(f"/v1/cachemesh/conversations/{conversation}")
        assert ended.status_code == 202 and ended.json() == {
            "conversation_id": conversation,
            "ended": True,
            "tracked": True,
        }
        await until(lambda: tap.seen(ConversationEnded, conversation), timeout_s=30)
        assert mesh.node.cache is not None
        # Counted once its entries are gone from L1 and L3.
        await until(lambda: mesh.node.cache.counters.context_dropped >= 1, timeout_s=60)  # type: ignore[union-attr]
        assert first_key(mesh, RESET) not in mesh.node.cache.l1
        calls = mesh.upstream.completions
        headers, _ = await mesh.chat(RESET, extra_headers=in_conversation)
        assert headers["x-cachemesh-cache"] == "miss" and mesh.upstream.completions == calls + 1
        headers, _ = await mesh.chat("What is the capital of France?")
        assert headers["x-cachemesh-cache"] == "hit"  # not bound to the conversation: it stays


async def test_an_idle_conversation_ends_by_itself(gateway_mesh, kafka, namespace) -> None:
    conversation = f"idle-{uuid.uuid4().hex[:8]}"
    async with (
        gateway_mesh(conversation_idle_ms=300, idle_sweep_interval_ms=50) as mesh,
        LifecycleTap(kafka.bootstrap, namespace) as tap,
    ):
        await mesh.chat(RESET, extra_headers={"x-cachemesh-conversation-id": conversation})
        await until(lambda: mesh.stored == 1, timeout_s=60)
        await until(lambda: tap.seen(ConversationEnded, conversation), timeout_s=30)
        await until(lambda: mesh.node.cache.counters.context_dropped >= 1, timeout_s=60)  # type: ignore[union-attr]
        headers, _ = await mesh.chat(RESET)
        assert headers["x-cachemesh-cache"] == "miss"


async def test_upstream_failures_surface_as_errors_and_are_never_cached(gateway_mesh) -> None:
    async with gateway_mesh(
        upstream_timeout_ms=500, breaker_consecutive=3, breaker_cooldown_ms=60_000
    ) as mesh:
        mesh.upstream.fail_status = 500
        with pytest.raises(openai.InternalServerError) as failed:
            await mesh.chat(RESET)
        assert failed.value.status_code == 500 and "upstream failure 500" in str(failed.value)
        assert failed.value.response.headers["x-cachemesh-cache"] == "miss"
        mesh.upstream.fail_status = None

        mesh.upstream.delay_s = 2.0
        with pytest.raises(openai.APIStatusError) as timed_out:
            await mesh.chat(RESET)
        assert timed_out.value.status_code == 504 and "did not answer" in str(timed_out.value)
        with pytest.raises(openai.APIStatusError) as timed_out_stream:
            await mesh.chat_stream(RESET)
        assert timed_out_stream.value.status_code == 504
        mesh.upstream.delay_s = 0.0
        assert mesh.stored == 0

        # Three failures in a row opened the breaker: the next miss is refused without a call.
        calls = mesh.upstream.completions
        with pytest.raises(openai.APIStatusError) as refused:
            await mesh.chat("Anything at all?")
        assert refused.value.status_code == 503 and "breaker open" in str(refused.value)
        assert refused.value.response.headers["retry-after"]
        assert mesh.upstream.completions == calls
        assert mesh.gateway.proxy is not None and mesh.gateway.proxy.upstream.breaker.state == "open"
        health = await mesh.gateway.health()
        assert health["status"] == "degraded" and health["healthy"]
        assert any("breaker open (3 failures in a row)" in r for r in health["degraded"])


async def test_health_says_degraded_while_the_upstream_is_unreachable_and_healthy_once_it_answers(
    gateway_mesh,
) -> None:
    """What a client gets, on both health pages (the service's /healthz and the API's): with nothing on
    the upstream's port the gateway is up but `degraded`, naming the upstream and that only cache hits
    are served; once a server answers there, `healthy` again."""
    dead_port = free_port()
    async with gateway_mesh(upstream_url=f"http://127.0.0.1:{dead_port}/v1", probe_interval_ms=100) as mesh:
        assert mesh.gateway.metrics_server is not None
        pages = [
            f"http://127.0.0.1:{mesh.gateway.metrics_server.port}/healthz",
            f"{mesh.gateway.api_url}/healthz",
        ]

        async def reports() -> list[dict[str, Any]]:
            async with httpx.AsyncClient() as http:
                return [(await http.get(page)).json() for page in pages]

        async def all_say(status: str) -> None:
            started = time.perf_counter()
            while not all(r["status"] == status for r in await reports()):
                assert time.perf_counter() - started < 30, f"not {status} within 30 s: {await reports()}"
                await asyncio.sleep(0.05)

        await all_say("degraded")
        for report in await reports():
            assert report["healthy"] is True  # up: it still answers hits
            assert any(r.startswith("upstream unreachable for") for r in report["degraded"])
            assert "no upstream answers: only cache hits are served" in report["degraded"]
        with pytest.raises(openai.APIStatusError) as failed:
            await mesh.chat(RESET)
        assert failed.value.status_code == 502  # what degraded said: a miss cannot be answered

        async with serving_upstream(port=dead_port):
            await all_say("healthy")
            assert all(r["degraded"] == [] for r in await reports())
            headers, _ = await mesh.chat(RESET)
            assert headers["x-cachemesh-cache"] == "miss"


async def test_a_recovered_upstream_answers_and_the_failed_answer_was_not_stored(gateway_mesh) -> None:
    async with gateway_mesh() as mesh:
        mesh.upstream.fail_status = 503
        with pytest.raises(openai.APIStatusError):
            await mesh.chat(RESET)
        mesh.upstream.fail_status = None
        headers, good = await mesh.chat(RESET)
        assert headers["x-cachemesh-cache"] == "miss"  # nothing of the failure was kept
        assert good.choices[0].message.content == answer_for(RESET)
        assert mesh.upstream.completions == 2


async def test_feedback_auth_and_bounds(gateway_mesh) -> None:
    async with gateway_mesh(max_request_bytes=4096) as mesh:
        await mesh.chat(RESET)
        await until(lambda: mesh.stored == 1, timeout_s=60)
        _, para = await mesh.chat(PARAPHRASE)
        _, exact = await mesh.chat(RESET)
        auth = {"authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=mesh.gateway.api_url, headers=auth, timeout=60) as http:
            wrong_match = await http.post(
                "/v1/cachemesh/feedback", json={"response_id": para.id, "correct": False}
            )
            assert wrong_match.status_code == 200, wrong_match.text
            body = wrong_match.json()
            assert body["evicted"] is False and body["tier_feedback"]["labels"] == 1
            assert body["tier_feedback"]["similarity"] > 0.9

            wrong_answer = await http.post("/v1/cachemesh/feedback", json={"response_id": exact.id})
            assert wrong_answer.status_code == 200 and wrong_answer.json()["evicted"] is True
            unknown = await http.post("/v1/cachemesh/feedback", json={"response_id": "nope"})
            assert unknown.status_code == 404

            big = await http.post(
                "/v1/chat/completions",
                json={"model": mesh.model, "messages": [{"role": "user", "content": "x" * 5000}]},
            )
            assert big.status_code == 413 and "limit" in big.json()["error"]["message"]
            bad = await http.post("/v1/chat/completions", content=b"{not json")
            assert bad.status_code == 400
            no_token = await http.post("/v1/chat/completions", json={}, headers={"authorization": ""})
            assert no_token.status_code == 401
        headers, _ = await mesh.chat(RESET)
        assert headers["x-cachemesh-cache"] == "miss"  # the wrong answer was evicted
        with pytest.raises(openai.BadRequestError, match="messages"):
            await mesh.client.chat.completions.create(model=mesh.model, messages=[])
        wrong = openai.AsyncOpenAI(base_url=f"{mesh.gateway.api_url}/v1", api_key="wrong", max_retries=0)
        async with wrong:
            with pytest.raises(openai.AuthenticationError):
                await wrong.models.list()


async def test_a_cache_that_does_not_answer_holds_a_miss_up_only_for_the_lookup_timeout(gateway_mesh) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts connections, never answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        async with gateway_mesh(tiers_url=url, lookup_timeout_ms=30) as mesh:
            await mesh.chat("warm the connection pool")
            headers, answer = await mesh.chat(
                RESET
            )  # the silent cache never answers: only the timeout ends it
            assert headers["x-cachemesh-lookup"] == "timeout"
            assert float(headers["x-cachemesh-lookup-ms"]) >= 30  # how long: bench/gateway.py measures
            assert answer.choices[0].message.content == answer_for(RESET)
    finally:
        silent.close()


async def test_hedging_a_silent_cache_costs_a_miss_only_the_hedge(gateway_mesh) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        async with gateway_mesh(tiers_url=url, lookup_timeout_ms=20_000, hedge_after_ms=5) as mesh:
            headers, answer = await mesh.chat(RESET)
            # hedged: the upstream was asked after 5 ms, not after the 20 s lookup timeout
            assert (headers["x-cachemesh-cache"], headers["x-cachemesh-lookup"]) == ("miss", "hedged")
            assert answer.choices[0].message.content == answer_for(RESET)
    finally:
        silent.close()


async def test_a_hedged_hit_still_wins_over_a_slow_upstream(gateway_mesh) -> None:
    async with gateway_mesh(hedge_after_ms=0) as mesh:
        await mesh.chat(RESET)
        await until(lambda: mesh.stored == 1, timeout_s=60)
        mesh.upstream.delay_s = 5.0  # the cache answers long before this: the hit wins the race
        headers, hit = await mesh.chat(PARAPHRASE)
        assert headers["x-cachemesh-cache"] == "hit"
        assert hit.choices[0].message.content == answer_for(RESET)
        assert mesh.gateway.proxy is not None and mesh.gateway.proxy.counts["hedged"] == 2
        assert mesh.gateway.proxy.upstream.breaker.state == "closed"


def _gateway_problem(case: Any, response: requests.Response) -> str | None:
    """No 5xx, and a rejection is a 4xx with a reason (OpenAI's `error.message`, or FastAPI's `detail`)."""
    status = response.status_code
    where = f"{case.method} {case.formatted_path} -> {status}"
    if status >= 500:
        return f"{where}: server error {response.text[:300]!r}"
    if status >= 400:
        try:
            body = response.json()
        except ValueError:
            return f"{where}: rejection without a JSON body {response.text[:200]!r}"
        error = body.get("error") if isinstance(body, dict) else None
        reason = error.get("message") if isinstance(error, dict) else body.get("detail")
        if not reason:
            return f"{where}: rejection without a reason {response.text[:200]!r}"
    return None


async def test_gateway_fuzz_every_route_from_its_openapi_without_a_server_error(gateway_mesh) -> None:
    """Every route of the gateway's own OpenAPI document (request bodies: services/gateway/openapi.py),
    schema-valid and schema-breaking bodies alike, through to a real tier node and the upstream."""
    async with gateway_mesh() as mesh:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        sent, problems = await asyncio.to_thread(fuzz, mesh.gateway.api_url, auth, _gateway_problem, 30.0)
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{mesh.gateway.api_url}/healthz")).status_code == 200
    assert sent > 50
    assert not problems, "\n".join(sorted(set(problems))[:40])
