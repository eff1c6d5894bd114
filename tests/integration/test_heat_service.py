"""The heat service on real Kafka and Postgres: access events become heat.scores.v1 decisions within
the latency budget, and the learned model survives a restart."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from policies.learned.features import N_FEATURES
from schemas.events import CacheAccessed, HeatScored
from schemas.topics import qualified
from schemas.wire import decode
from services.heat.service import HeatService
from services.heat.settings import HeatSettings
from services.runtime.kafka import EventPublisher
from tests.integration.conftest import kafka_settings_for

pytestmark = pytest.mark.integration


def _settings(kafka, namespace, pg_settings, **overrides) -> HeatSettings:  # type: ignore[no-untyped-def]
    return HeatSettings(
        kafka=kafka_settings_for(kafka, namespace),
        postgres=pg_settings,
        group_id=f"heat-{namespace}",
        model_name=f"heat-{namespace}",
        **overrides,
    )


async def test_access_events_become_decisions_within_250_ms(kafka, namespace, topics_on, pg_settings) -> None:
    await topics_on(kafka)
    settings = _settings(kafka, namespace, pg_settings, capacity=1000)
    reader = AIOKafkaConsumer(
        qualified(HeatScored.topic, namespace),
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest",
    )
    await reader.start()
    publisher = EventPublisher(settings.kafka)
    await publisher.start()
    sent_at: dict[str, float] = {}
    all_sent = asyncio.Event()
    latency_ms: dict[str, float] = {}
    async with HeatService(settings) as service:
        runner = asyncio.create_task(service.run())

        async def read() -> None:
            while not all_sent.is_set() or len(latency_ms) < len(sent_at):
                batch = await reader.getmany(timeout_ms=200)
                now = time.monotonic()
                for records in batch.values():
                    for record in records:
                        scored = decode(record.value)
                        assert isinstance(scored, HeatScored)
                        if scored.key in sent_at and scored.key not in latency_ms:
                            latency_ms[scored.key] = (now - sent_at[scored.key]) * 1000

        reading = asyncio.create_task(read())
        # Warm-up: the clock starts once one decision has come back (topic leaders elected, the
        # service's group joined, the reader positioned), not after a fixed sleep.
        sent_at["warm-up"] = time.monotonic()
        await publisher.publish(CacheAccessed(key="warm-up", hit=False))
        for _ in range(300):
            if "warm-up" in latency_ms:
                break
            await asyncio.sleep(0.1)
        assert "warm-up" in latency_ms, "no decision for the warm-up event within 30 s"
        del sent_at["warm-up"], latency_ms["warm-up"]
        for i in range(200):
            key = f"prompt-{i}"
            sent_at[key] = time.monotonic()
            await publisher.publish(CacheAccessed(key=key, hit=False, trace_id=f"conv-{i % 5}"))
            await asyncio.sleep(0.01)
        all_sent.set()
        await asyncio.wait_for(reading, 30)
        health = await service.health()
        service.request_stop()
        await runner
    await publisher.stop()
    await reader.stop()

    assert set(latency_ms) == set(sent_at)
    p99 = float(np.percentile(list(latency_ms.values()), 99))
    print(f"event -> decision p50 {np.percentile(list(latency_ms.values()), 50):.0f} ms, p99 {p99:.0f} ms")
    assert p99 < 250
    assert health["healthy"] and health["tracked_entries"] == 201  # with the warm-up key


async def test_the_model_survives_a_restart(kafka, namespace, topics_on, pg_settings) -> None:
    await topics_on(kafka)
    settings = _settings(kafka, namespace, pg_settings, capacity=64, rescore_interval_ms=20)
    publisher = EventPublisher(settings.kafka)
    await publisher.start()
    rng = np.random.default_rng(3)
    keys = rng.zipf(1.3, size=4000) % 400
    probe = np.linspace(0, 1, 8 * N_FEATURES, dtype=np.float32).reshape(8, N_FEATURES)
    async with HeatService(settings) as first:
        runner = asyncio.create_task(first.run())
        t0 = 1_700_000_000_000
        for i, k in enumerate(keys):
            await publisher.publish(
                CacheAccessed(key=f"k{k}", hit=False, occurred_at_ms=t0 + i * 5), wait=False
            )
        await publisher.stop()
        await publisher.start()
        deadline = time.monotonic() + 60
        while first.engine.events_applied < len(keys) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # a few more re-score rounds to train
        first.request_stop()
        await runner
        steps = first.engine.policy.scorer.steps
        scores = first.engine.policy.scorer.score(probe)
    # Stopped: the last checkpoint was written on the way out.
    assert steps > 0, "the model trained on the events"
    async with HeatService(settings) as second:
        restored = second.engine.policy.scorer
        assert second.model_version is not None
        assert restored.steps == steps
        assert np.array_equal(restored.score(probe), scores)
    await publisher.stop()
