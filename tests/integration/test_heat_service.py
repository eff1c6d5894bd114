"""The heat service on real Kafka and Postgres: every access event becomes a heat.scores.v1 decision, and
the learned model survives a restart. The event -> decision latency is measured by bench/heat_latency.py."""

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


async def test_every_access_event_becomes_a_heat_decision(kafka, namespace, topics_on, pg_settings) -> None:
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
    sent = {"warm-up"} | {f"prompt-{i}" for i in range(200)}
    decided: set[str] = set()
    async with HeatService(settings) as service:
        runner = asyncio.create_task(service.run())

        async def read() -> None:
            while not sent <= decided:
                for records in (await reader.getmany(timeout_ms=200)).values():
                    for record in records:
                        scored = decode(record.value)
                        assert isinstance(scored, HeatScored)
                        decided.add(scored.key)

        reading = asyncio.create_task(read())
        await publisher.publish(CacheAccessed(key="warm-up", hit=False))
        for i in range(200):
            await publisher.publish(CacheAccessed(key=f"prompt-{i}", hit=False, trace_id=f"conv-{i % 5}"))
        # Generous: this checks that the decisions come, not how fast (bench/heat_latency.py measures that).
        await asyncio.wait_for(reading, 60)
        health = await service.health()
        service.request_stop()
        await runner
    await publisher.stop()
    await reader.stop()

    assert sent <= decided
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
        # A few more re-score rounds after the last event, counted, not slept: the first one scores
        # (and trains on) the last events, the idle ones after it do nothing.
        rounds = first.engine.rounds + 5
        while first.engine.rounds < rounds and time.monotonic() < deadline + 30:
            await asyncio.sleep(0.02)
        assert first.engine.rounds >= rounds, "the service stopped re-scoring"
        assert first.engine.scored_events == len(keys), "the last events were never re-scored"
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
