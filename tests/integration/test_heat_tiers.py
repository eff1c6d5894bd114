"""Heat drives a tier node, end to end on real Kafka and Postgres: the node's lookups go out as
`cache.access.v1`, the heat service (tracking fewer entries than the node holds) decides which
entries to let go on `heat.scores.v1`, and the node drops exactly those from memory (L3 keeps them)."""

from __future__ import annotations

import asyncio

import pytest

from services.heat.service import HeatService
from services.heat.settings import HeatSettings
from services.tiers.entry import EntryMeta, encode_text
from tests.integration.conftest import kafka_settings_for
from tests.integration.nodes import running, until

pytestmark = pytest.mark.integration

HEAT_CAPACITY = 8
ENTRIES = 30


async def test_heat_decisions_from_access_events_are_applied_by_a_tier_node(
    kafka, namespace, topics_on, pg_settings, node_settings
) -> None:
    await topics_on(kafka)
    heat_settings = HeatSettings(
        kafka=kafka_settings_for(kafka, namespace),
        postgres=pg_settings,
        group_id=f"heat-{namespace}",
        model_name=f"heat-{namespace}",
        capacity=HEAT_CAPACITY,
        rescore_interval_ms=50,
    )
    keys = [f"{namespace}prompt-{i}" for i in range(ENTRIES)]
    async with HeatService(heat_settings) as heat, running(node_settings("node")) as node:
        heat_runner = asyncio.create_task(heat.run())
        await until(lambda: all(c.health()["assigned"] for c in heat._consumers), timeout_s=60, step_s=0.05)
        cache = node.cache
        assert cache is not None
        for i, key in enumerate(keys):
            await cache.put(
                EntryMeta(key=key, kind="prompt", model="m"), encode_text(f"answer {i}", model="m")
            )
        for key in keys:
            assert (await cache.get(key, model="m")).hit
        # Every key was heard, and the node let go of what heat evicted.
        await until(lambda: heat.engine.events_applied >= ENTRIES, timeout_s=30)
        await until(lambda: cache.counters.heat_evictions >= ENTRIES - HEAT_CAPACITY, timeout_s=30)
        in_memory = [k for k in keys if cache.get_local(k, model="m").hit]
        tracked = [k for k in keys if k in heat.engine.policy]
        # Memory holds what heat keeps, and nothing is lost: L3 still answers for the evicted.
        assert len(in_memory) <= HEAT_CAPACITY
        assert set(in_memory) <= set(tracked)
        evicted = next(k for k in keys if k not in in_memory)
        again = await cache.get(evicted, model="m")
        assert again.hit and again.tier == "l3"
        heat.request_stop()
        await heat_runner
