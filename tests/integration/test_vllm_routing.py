"""The gateway routing over two real vLLM instances (services/gateway/engines.py, routing.py), with the
`openai` client: the block keys the gateway computes from a chat request (the model's own tokenizer and
chat template) are the ones the bridge learns from the engine's KV events; a prompt that extends one
an instance computed goes to that instance (by prefix), a conversation stays on its instance, chat and
completions stream with usage through it, and when an instance dies (mid-stream, even) the next
requests go to the other and none fails."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest

from infra.vllm_server import BLOCK_SIZE, VllmServer
from schemas.events import KvBlockStored
from services.bridge.service import BridgeService
from services.bridge.settings import BridgeSettings, PublisherConfig
from services.dashboard.service import DashboardService
from services.dashboard.settings import DashboardSettings
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings, UpstreamConfig
from services.runtime.topics import ensure_topics
from services.warmup.service import WarmupService
from services.warmup.settings import WarmupSettings
from tests.integration.conftest import kafka_settings_for
from tests.integration.nodes import running, serving, until
from tests.integration.test_bridge_service import Tap
from tests.integration.test_dashboard_browser import CHROMIUM, _chromium
from tests.integration.test_vllm_connector import node_settings_for

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(600)]

MODEL = "cachemesh-tiny"
WORDS = "the cache holds every block of a prompt an engine computed before and loads it again".split()


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[VllmServer, VllmServer]]:
    a, b = VllmServer(kv_blocks=256), VllmServer(kv_blocks=256)
    with contextlib.ExitStack() as stack:
        for server in (a, b):
            server.start()
            stack.callback(server.stop)
        yield a, b


@contextlib.asynccontextmanager
async def mesh(  # type: ignore[no-untyped-def]
    kafka, postgres, pg_settings, a: VllmServer, b: VllmServer
) -> AsyncIterator[tuple[GatewayService, openai.AsyncOpenAI, Tap, str]]:
    namespace = f"t{uuid.uuid4().hex[:10]}."
    await ensure_topics(kafka.bootstrap, namespace)
    ids = {"a": f"vllm-a-{namespace}", "b": f"vllm-b-{namespace}"}
    bridge = BridgeSettings(
        kafka=kafka_settings_for(kafka, namespace),
        postgres=pg_settings,
        publishers=[
            PublisherConfig(
                engine_id=ids[name],
                endpoint=server.events_endpoint,
                replay_endpoint=server.replay_endpoint,
                topic="kv-events",
                model=MODEL,
            )
            for name, server in (("a", a), ("b", b))
        ],
        replay_history_on_first_start=False,
    )
    async with (
        running(node_settings_for(kafka, pg_settings, namespace, "gw-node")) as node,
        Tap(kafka.bootstrap, f"{namespace}{KvBlockStored.topic}") as tap,
        serving(BridgeService(bridge)),
    ):
        settings = GatewaySettings(
            node_id=f"gw-{namespace}",
            api_port=0,
            metrics_port=0,
            upstreams=[
                UpstreamConfig(name="a", url=f"{a.url}/v1", engine_id=ids["a"]),
                UpstreamConfig(name="b", url=f"{b.url}/v1", engine_id=ids["b"]),
            ],
            routing_tokenizer_dir=str(a.model_dir),
            routing_model=MODEL,
            routing_block_size=BLOCK_SIZE,
            tiers_url=node.api_url,
            lookup_timeout_ms=10_000,
            queue_poll_ms=200,
            breaker_consecutive=1,
            breaker_cooldown_ms=60_000,
            kafka=kafka_settings_for(kafka, namespace),
        )
        async with serving(GatewayService(settings)) as gateway:
            client = openai.AsyncOpenAI(base_url=f"{gateway.api_url}/v1", api_key="unused", max_retries=0)
            try:
                yield gateway, client, tap, namespace
            finally:
                await client.close()


async def reset(server: VllmServer) -> None:
    """The engine drops every block it caches; the clear is published on its next step."""
    await asyncio.to_thread(server.reset_prefix_cache)
    async with httpx.AsyncClient(timeout=60) as http:
        body = {"model": MODEL, "prompt": [7, 8, 9], "max_tokens": 1}
        (await http.post(f"{server.url}/v1/completions", json=body)).raise_for_status()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def chat(client: openai.AsyncOpenAI, text: str, **kw: Any) -> tuple[httpx.Headers, Any]:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": text}],
        max_tokens=4,
        temperature=0.7,  # not cacheable by the gateway's default policy: every request is routed
        **kw,
    )
    return raw.headers, raw.parse()


async def test_warmup_prefills_a_conversation_on_its_instance_before_its_next_turn(
    kafka, postgres, pg_settings, engines
) -> None:
    """The instance serving a conversation loses its blocks between two turns (its prefix cache reset:
    vLLM reports them removed); the warmup service sees the conversation's blocks (from the gateway) and
    the removals (from the bridge), and once the pause is long enough tells the gateway, which prefills
    the conversation's prompt on that instance: the blocks are back before the next turn, and that turn
    counts the warm as used."""
    a, b = engines
    rng = random.Random(5)
    async with mesh(kafka, postgres, pg_settings, a, b) as (gateway, client, _, namespace):
        assert gateway.engines is not None
        warmup = WarmupSettings(
            kafka=kafka_settings_for(kafka, namespace),
            postgres=pg_settings,
            group_id=f"warmup-{namespace}",
            model_name=f"ftl-{namespace}",
            metrics_port=0,
            warm_engines=True,
            turn_idle_ms=300,
        )
        async with serving(WarmupService(warmup)) as service:
            # The engines report removals (until the planner has seen one, it warms every block of a
            # conversation blindly, once per turn): a reset of a prompt's blocks shows it.
            text = words(rng, 60)
            headers, _ = await chat(client, text)
            where = gateway.engines.by_name(headers["x-cachemesh-instance"])
            _, keys = gateway.engines._keys({"messages": [{"role": "user", "content": text}]}, MODEL)
            await until(lambda: where.state.prefix(keys) == len(keys), timeout_s=60, step_s=0.05)
            await reset(a if where.name == "a" else b)
            await until(lambda: service.planner.conversations.removals_seen, timeout_s=60, step_s=0.05)

            conv = {"x-cachemesh-conversation-id": f"conv-{uuid.uuid4().hex[:6]}"}
            text = words(rng, 150)
            headers, _ = await chat(client, text, extra_headers=conv)
            where = gateway.engines.by_name(headers["x-cachemesh-instance"])
            server = a if where.name == "a" else b
            _, keys = gateway.engines._keys({"messages": [{"role": "user", "content": text}]}, MODEL)
            await until(lambda: where.state.prefix(keys) == len(keys), timeout_s=60, step_s=0.05)
            warms = gateway.engines.warmer.counts
            assert warms.sent == 0
            await reset(server)
            # Removed (the bridge's removals reach the gateway), then warmed back by the prefill.
            await until(lambda: warms.sent >= 1, timeout_s=60, step_s=0.05)
            await until(lambda: where.state.prefix(keys) == len(keys), timeout_s=60, step_s=0.05)
            assert service.planner.stats()["commands"] >= 1
            headers, _ = await chat(client, text + " " + words(rng, 10), extra_headers=conv)
            assert headers["x-cachemesh-instance"] == where.name
            assert warms.used == 1 and warms.wasted == 0 and warms.prefill_tokens >= len(keys) * BLOCK_SIZE
            assert gateway.stats()["routing"]["warms"]["precision"] == 1.0
            assert where.ftl.n >= 1  # the prefill was timed: one token, its time is the prefill's


async def test_routing_by_prefix_conversation_and_failover(
    kafka, postgres, pg_settings, engines, tmp_path
) -> None:
    a, b = engines
    rng = random.Random(21)
    async with mesh(kafka, postgres, pg_settings, a, b) as (gateway, client, tap, namespace):
        assert gateway.engines is not None
        # 1. The gateway's keys for a chat request are the engine's (its tokenizer and chat template).
        first = words(rng, 120)
        headers, _ = await chat(client, first)
        where = headers["x-cachemesh-instance"]
        body = {"model": MODEL, "messages": [{"role": "user", "content": first}]}
        _, keys = gateway.engines._keys(body, MODEL)
        assert len(keys) >= 3
        await until(
            lambda: set(keys) <= {e.block_hash for e in tap.events() if isinstance(e, KvBlockStored)},
            timeout_s=60,
            step_s=0.05,
        )
        owner = gateway.engines.by_name(where)
        await until(lambda: owner.state.prefix(keys) == len(keys), timeout_s=60, step_s=0.05)

        # 2. A longer prompt starting with it goes where its prefix is, whatever the load tie says.
        for _ in range(3):
            headers, _ = await chat(client, first + " " + words(rng, 40))
            assert headers["x-cachemesh-instance"] == where
            assert headers["x-cachemesh-route"] == "prefix"
            assert int(headers["x-cachemesh-route-predicted-blocks"]) >= len(keys)

        # 2b. The dashboard shows both instances and these decisions: the blocks predicted beside
        #     those the engine reported cached (usage.prompt_tokens_details), in a real Chromium.
        assert CHROMIUM is not None, "make setup installs Debian's chromium"
        assert gateway.metrics_server is not None
        dash = DashboardService(
            DashboardSettings(
                kafka=kafka_settings_for(kafka, namespace),
                gateway_health_urls=[f"http://127.0.0.1:{gateway.metrics_server.port}/healthz"],
                state_file=tmp_path / "no-state.json",
                poll_interval_ms=200,
                http_port=0,
            )
        )
        async with serving(dash):
            board = dash.board

            def prefix_rows() -> list[dict[str, Any]]:
                rows = [r for r in board.routes if r["reason"] == "prefix"]
                return [r for r in rows if r["realised_blocks"] is not None]

            await until(
                lambda: len(board.instances) == 2 and len(prefix_rows()) >= 3, timeout_s=30, step_s=0.05
            )
            for row in prefix_rows():
                assert row["realised_blocks"] >= len(keys) and row["predicted_blocks"] >= len(keys)
            base = f"http://127.0.0.1:{dash.page_server.port}/dashboard/"  # type: ignore[union-attr]
            dom = await _chromium("--virtual-time-budget=3000", "--dump-dom", base)
        assert 'id="table-instances" data-rows="2"' in dom
        assert re.search(r'id="table-routes" data-rows="([3-9]|\d\d)"', dom), "routing rows not drawn"

        # 3. A conversation stays on its instance (nothing cached anywhere: affinity decides).
        conv = {"x-cachemesh-conversation-id": f"conv-{uuid.uuid4().hex[:6]}"}
        seen = set()
        for _ in range(3):
            headers, _ = await chat(client, words(rng, 30), extra_headers=conv)
            seen.add(headers["x-cachemesh-instance"])
        assert len(seen) == 1

        # 4. Chat and completions stream through with usage.
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": words(rng, 20)}],
            max_tokens=4,
            temperature=0.7,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
        completion = await client.completions.create(
            model=MODEL, prompt=words(rng, 20), max_tokens=4, temperature=0.7, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        pieces = [c async for c in completion]
        assert pieces[-1].usage is not None and pieces[-1].usage.completion_tokens == 4
        # Each stream's first-token time went to its instance's FTL fit, with the share it computed.
        timed = [e.ftl for e in gateway.engines.engines]
        assert sum(f.n for f in timed) >= 1.9 and all(0 <= f.sum_m <= f.n for f in timed)

        # 5. The instance holding the prefix dies mid-stream: that stream may break off, the next
        #    requests (the same prefix too) go to the other, and none fails.
        victim = a if where == "a" else b
        long_stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": first + " " + words(rng, 10)}],
            max_tokens=200,
            temperature=0.7,
            stream=True,
        )
        got_one = False
        with contextlib.suppress(openai.APIError, httpx.HTTPError):
            async for _chunk in long_stream:
                if not got_one:
                    got_one = True
                    await asyncio.to_thread(victim.kill)
        assert got_one
        other = "b" if where == "a" else "a"
        for _ in range(4):
            headers, answer = await chat(client, first + " " + words(rng, 20))
            assert headers["x-cachemesh-instance"] == other and answer.choices[0].message.content is not None
        # The dead instance was left out either by its breaker (the broken stream was its one failure
        # allowed) or, when the stream had ended before the kill, by a reroute from the first request.
        counts = gateway.stats()["requests"]
        assert counts["rerouted"] >= 1 or gateway.engines.by_name(where).upstream.breaker.state != "closed"
