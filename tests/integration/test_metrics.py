"""`/metrics` on every service, on real Kafka and Postgres: after a few puts and lookups the tier node
shows its lookups by tier and match kind, hit rate and latency with non-zero counts (on its API port
too), and heat, warmup, invalidation and the gateway each show their own series."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infra.standin import serving_upstream
from schemas.topics import qualified
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings
from services.heat.service import HeatService
from services.heat.settings import HeatSettings
from services.invalidation.service import InvalidationService
from services.invalidation.settings import InvalidationSettings
from services.runtime.service import Service
from services.warmup.service import WarmupService
from services.warmup.settings import WarmupSettings
from tests.integration.conftest import kafka_settings_for
from tests.integration.nodes import running, serving, until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

DIM = 384


def value(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there are none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def has(text: str, name: str, **labels: str) -> bool:
    return any(
        s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        for family in text_string_to_metric_families(text)
        for s in family.samples
    )


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 60.0) -> None:
    """Until `check()` (a scrape) holds, asking again every 50 ms; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s")
        await asyncio.sleep(0.05)


async def scrape(http: httpx.AsyncClient, service: Service) -> str:
    assert service.metrics_server is not None
    response = await http.get(f"http://127.0.0.1:{service.metrics_server.port}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


async def test_every_service_serves_its_series(
    kafka, namespace, topics_on, node_settings, pg_settings
) -> None:
    await topics_on(kafka)
    common = {"kafka": kafka_settings_for(kafka, namespace), "metrics_port": 0}
    async with contextlib.AsyncExitStack() as stack:
        node = await stack.enter_async_context(running(node_settings("metrics", match_rule="fixed")))
        heat = await stack.enter_async_context(
            serving(
                HeatService(
                    HeatSettings(
                        **common,
                        postgres=pg_settings,
                        group_id=f"heat-{namespace}",
                        model_name=f"h-{namespace}",
                    )
                )
            )
        )
        warmup = await stack.enter_async_context(
            serving(
                WarmupService(
                    WarmupSettings(
                        **common,
                        postgres=pg_settings,
                        group_id=f"warmup-{namespace}",
                        model_name=f"f-{namespace}",
                    )
                )
            )
        )
        invalidation = await stack.enter_async_context(
            serving(
                InvalidationService(
                    InvalidationSettings(**common, postgres=pg_settings, group_id=f"invalidation-{namespace}")
                )
            )
        )
        upstream = await stack.enter_async_context(serving_upstream())
        gateway = await stack.enter_async_context(
            serving(
                GatewayService(
                    GatewaySettings(
                        **common,
                        node_id=f"gw-{namespace}",
                        api_port=0,
                        upstream_url=upstream.url,
                        tiers_url=node.api_url,
                        max_semantic_chars=1,  # exact keys only: no embedding model to load
                        lookup_timeout_ms=30_000,
                        store_timeout_ms=30_000,
                    )
                )
            )
        )
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=60))

        # A little traffic: a put, an exact hit, a semantic hit, a miss; one gateway miss, then its hit.
        rng = np.random.default_rng(5)
        vec = rng.standard_normal(DIM).astype(np.float32)
        vec /= np.linalg.norm(vec)
        model = f"m-{namespace}"
        put = await http.put(
            f"{node.api_url}/v1/entries/q-{namespace}",
            json={"value": {"text": "Paris"}, "model": model, "embedding": vec.tolist()},
        )
        assert put.status_code == 201, put.text
        lookups = [
            {"key": f"q-{namespace}", "model": model},
            {"embedding": (vec + 0.01 * rng.standard_normal(DIM)).tolist(), "model": model},
            {"key": f"absent-{namespace}", "model": model},
        ]
        hits = [(await http.post(f"{node.api_url}/v1/lookup", json=body)).json()["hit"] for body in lookups]
        assert hits == [True, True, False]
        chat = {"model": model, "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        first = await http.post(f"{gateway.api_url}/v1/chat/completions", json=chat)
        assert first.status_code == 200 and first.headers["x-cachemesh-cache"] == "miss", first.text
        assert gateway.proxy is not None
        await until(lambda: gateway.proxy.cache.counts.get("stored", 0) >= 1, timeout_s=60)  # type: ignore[union-attr]
        again = await http.post(f"{gateway.api_url}/v1/chat/completions", json=chat)
        assert again.headers["x-cachemesh-cache"] == "hit"

        node_id = node.settings.node_id
        for text in (await scrape(http, node), (await http.get(f"{node.api_url}/metrics")).text):
            results = "cachemesh_tiers_lookup_results_total"
            assert value(text, results, node=node_id, tier="l1", match="exact") >= 2  # with the gateway's hit
            assert value(text, results, node=node_id, tier="l1", match="semantic") == 1
            assert value(text, results, node=node_id, tier="none", match="miss") >= 2
            assert value(text, "cachemesh_tiers_lookups_total", node=node_id) >= 5
            assert 0 < value(text, "cachemesh_tiers_hit_rate", node=node_id) < 1
            assert value(text, "cachemesh_tiers_lookup_ms_count", node=node_id, route="/v1/lookup") >= 5
            assert value(text, "cachemesh_tiers_l3_ms_count", node=node_id, outcome="ok") >= 1
            assert "cachemesh_tiers_queue_depth" in text
            assert value(text, "cachemesh_tiers_entries", node=node_id, tier="l1") >= 2

        # Heat hears the node's access events: its consumer counts the records (the node sends its
        # accesses in batch records, so fewer records than lookups), heat applies every access; its lag
        # is a series too.
        access, heat_group = qualified("cache.access.v1", namespace), f"heat-{namespace}"

        async def heat_applied() -> bool:
            text = await scrape(http, heat)
            records = value(text, "cachemesh_events_consumed_total", topic=access, group=heat_group)
            return records >= 1 and heat.engine.events_applied >= 3

        await eventually(heat_applied)
        heat_text = await scrape(http, heat)
        assert "cachemesh_heat_tracked_entries" in heat_text
        assert has(heat_text, "cachemesh_consumer_lag", topic=access, group=heat_group)

        assert "cachemesh_warmup_delta_t_ms_bucket" in await scrape(http, warmup)
        assert "cachemesh_invalidation_redelivered_total" in await scrape(http, invalidation)
        gw_text = await scrape(http, gateway)
        assert value(gw_text, "cachemesh_gateway_requests_total", outcome="miss") >= 1
        assert value(gw_text, "cachemesh_gateway_requests_total", outcome="hit") >= 1
        assert value(gw_text, "cachemesh_gateway_lookup_ms_count", outcome="hit") >= 1
        assert value(gw_text, "cachemesh_gateway_request_ms_count", route="chat") >= 2
