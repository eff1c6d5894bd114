"""The tier node's series: lookups by tier and match kind, hit rate, queue depths and the latency
histograms, as a scrape of the API's `/metrics` shows them."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.tiers.edge.api import create_app
from services.tiers.edge.client import AsyncTiersClient
from services.tiers.metrics import TIERS, LatencyMs
from tests.unit.tiers.fakes import Clock, at_cosine, unit
from tests.unit.tiers.test_api import DIM, make_cache, settings


@pytest.mark.parametrize(
    ("values", "cumulative"),
    [
        ([], [0, 0, 0, 0]),
        ([1.0], [1, 1, 1, 1]),  # a value on a bound is in its bucket (le)
        ([0.5, 1.5, 3.0], [1, 2, 3, 3]),
        ([7.0, 9.0], [0, 0, 1, 2]),  # over every bound: +Inf only
    ],
)
def test_latency_buckets_are_cumulative_le(values: list[float], cumulative: list[int]) -> None:
    hist = LatencyMs((1.0, 2.0, 8.0))
    for v in values:
        hist.observe(v)
    assert [count for _, count in hist.buckets()] == cumulative
    assert [le for le, _ in hist.buckets()] == ["1.0", "2.0", "8.0", "+Inf"]
    assert hist.sum == pytest.approx(sum(values))


def samples(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def test_api_metrics_show_lookups_by_tier_and_match_hit_rate_queues_and_latency() -> None:
    cache = make_cache(Clock())
    node = cache.node_id
    TIERS.watch(node, cache)
    try:
        app = create_app(cache, settings(node_id=node))
        rng = np.random.default_rng(3)
        vec = unit(rng, DIM)
        async with AsyncTiersClient("http://tiers", transport=httpx.ASGITransport(app=app)) as client:
            await client.put("q1", "Paris", model="m", embedding=vec)
            assert (await client.lookup(key="q1", model="m")).hit
            assert (await client.lookup(embedding=at_cosine(rng, vec, 0.99), model="m")).hit
            assert not (await client.lookup(key="absent", model="m")).hit
            text = (await client._http.get("/metrics")).text
    finally:
        TIERS.forget(node)
    assert samples(text, "cachemesh_tiers_lookup_results_total", node=node, tier="l1", match="exact") == 1
    assert samples(text, "cachemesh_tiers_lookup_results_total", node=node, tier="l1", match="semantic") == 1
    assert samples(text, "cachemesh_tiers_lookup_results_total", node=node, tier="none", match="miss") == 1
    assert samples(text, "cachemesh_tiers_lookups_total", node=node) == 3
    assert samples(text, "cachemesh_tiers_hit_rate", node=node) == pytest.approx(2 / 3)
    assert samples(text, "cachemesh_tiers_puts_total", node=node) == 1
    assert samples(text, "cachemesh_tiers_lookup_ms_count", node=node, route="/v1/lookup") >= 3
    assert samples(text, "cachemesh_tiers_lookup_ms_bucket", node=node, route="/v1/lookup", le="+Inf") >= 3
    queued = samples(text, "cachemesh_tiers_queue_depth", node=node, queue="access_events")
    assert queued == len(cache.outbox._access) > 0
    assert samples(text, "cachemesh_tiers_entries", node=node, tier="l1") == 1
    assert samples(text, "cachemesh_tiers_l3_ms_count", node=node, outcome="ok") >= 1  # the exact misses
    # The whole registry, not the node's series alone: the API port is a complete scrape target.
    assert "python_gc_objects_collected_total" in text
