"""The warmup service on real Kafka and Postgres: a pulse inside the band becomes a tier command and a
record that says why; outside the band it holds and says why; the FTL fits survive a restart."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from schemas.events import (
    AttentionHeatReported,
    CacheAccessed,
    DriftClustered,
    Event,
    HeatScored,
    ShardPlanned,
    WarmupDecided,
    WarmupMeasured,
    WarmupRequested,
    WindowComputed,
)
from schemas.topics import qualified
from schemas.wire import decode
from services.runtime.publisher import EventPublisher
from services.tiers.entry import EntryMeta, encode_text
from services.warmup.service import WarmupService
from services.warmup.settings import WarmupSettings
from tests.integration.conftest import kafka_settings_for
from tests.integration.nodes import running, until

pytestmark = pytest.mark.integration


def _settings(kafka, namespace, pg_settings, **overrides) -> WarmupSettings:  # type: ignore[no-untyped-def]
    return WarmupSettings(
        kafka=kafka_settings_for(kafka, namespace),
        postgres=pg_settings,
        group_id=f"warmup-{namespace}",
        model_name=f"ftl-{namespace}",
        metrics_port=0,
        **overrides,
    )


def window(shard: str, start_ms: int, qps: float, entropy: float = 3.0) -> WindowComputed:
    return WindowComputed(
        shard=shard,
        window="tumbling_1s",
        window_start_ms=start_ms,
        window_end_ms=start_ms + 1000,
        requests=int(qps),
        qps=qps,
        entropy_bits=entropy,
        hit_rate=0.5,
        miss_latency_ms_p95=40.0,
        occurred_at_ms=start_ms + 1000,
    )


def pulse(cluster: str, shard: str, keys: list[str], at_ms: int) -> DriftClustered:
    return DriftClustered(
        cluster_id=cluster,
        pattern="pulse",
        window_end_ms=at_ms,
        keys=keys,
        size=len(keys),
        duration_ms=3000,
        variance=0.6,
        service_spread=0.1,
        shard=shard,
        occurred_at_ms=at_ms,
    )


async def _collect(
    reader: AIOKafkaConsumer, enough: Callable[[list[Event]], bool], timeout_s: float
) -> list[Event]:
    seen: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while not enough(seen) and time.monotonic() < deadline:
        for records in (await reader.getmany(timeout_ms=200)).values():
            seen += [decode(r.value) for r in records]
    return seen


@contextlib.asynccontextmanager
async def wired(
    kafka, settings: WarmupSettings, *topics: str
) -> AsyncIterator[tuple[AIOKafkaConsumer, EventPublisher]]:  # type: ignore[no-untyped-def]
    """A reader of `topics` (from the start) and a publisher on the test's namespace, both closed after."""
    namespace = settings.kafka.topic_namespace
    reader = AIOKafkaConsumer(
        *(qualified(t, namespace) for t in topics),
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest",
    )
    await reader.start()
    publisher = EventPublisher(settings.kafka)
    await publisher.start()
    try:
        yield reader, publisher
    finally:
        await publisher.stop()
        await reader.stop()


async def test_a_pulse_in_the_band_is_warmed_and_one_outside_is_held(
    kafka, namespace, topics_on, pg_settings
):  # type: ignore[no-untyped-def]
    await topics_on(kafka)
    settings = _settings(kafka, namespace, pg_settings)
    async with wired(kafka, settings, WarmupRequested.topic, WarmupDecided.topic) as (reader, publisher):
        t0 = time.time_ns() // 1_000_000
        async with WarmupService(settings) as service:
            runner = asyncio.create_task(service.run())
            # Shard a: inside the band; shard b: 500 QPS, too hot to predict.
            await publisher.publish(window("a", t0 - 1000, 120))
            await publisher.publish(window("b", t0 - 1000, 500))
            # Windows and clusters travel on different topics: let the windows land first.
            await until(lambda: {"a", "b"} <= set(service.planner.windows), 60, 0.05)
            await publisher.publish(pulse("ca", "a", ["a1", "a2", "a3"], t0))
            await publisher.publish(pulse("cb", "b", ["b1"], t0))
            # The peak of shard a comes 1 s after the warmup start; the horizon closes at 10 s.
            for i in range(12):
                await publisher.publish(window("a", t0 + i * 1000, 180 if i == 1 else 90))

            def done(seen: list[Event]) -> bool:
                decided = {e.cluster_id for e in seen if isinstance(e, WarmupDecided)}
                return {"ca", "cb"} <= decided and any(isinstance(e, WarmupRequested) for e in seen)

            seen = await _collect(reader, done, 60)
            health = await service.health()
            service.request_stop()
            await runner

    [command] = [e for e in seen if isinstance(e, WarmupRequested)]
    assert command.keys == ["a1", "a2", "a3"] and command.node_id == "*" and command.tier == "l1"
    assert command.start_at_ms == t0 + 48  # 1.2 x the 40 ms dependency P95
    decided = {e.cluster_id: e for e in seen if isinstance(e, WarmupDecided)}
    assert decided["ca"].action == "warm" and decided["ca"].command_event_id == command.event_id
    assert "pulse" in decided["ca"].reason and "inside the band" in decided["ca"].reason
    assert decided["cb"].action == "hold" and "too hot to predict" in decided["cb"].reason
    assert health["healthy"] and health["commands"] == 1 and health["held"] == 1


async def test_delta_t_is_published_and_the_ftl_fit_survives_a_restart(
    kafka, namespace, topics_on, pg_settings
):  # type: ignore[no-untyped-def]
    await topics_on(kafka)
    settings = _settings(kafka, namespace, pg_settings)
    async with wired(kafka, settings, WarmupMeasured.topic) as (reader, publisher):
        t0 = time.time_ns() // 1_000_000
        async with WarmupService(settings) as first:
            runner = asyncio.create_task(first.run())
            await publisher.publish(window("a", t0 - 1000, 120))
            await until(lambda: "a" in first.planner.windows, 60, 0.05)
            await publisher.publish(pulse("ca", "a", ["a1"], t0))
            for i in range(12):
                await publisher.publish(window("a", t0 + i * 1000, 190 if i == 2 else 80), wait=False)
            # (m, FTL) pairs: 200 accesses per batch at miss rates 0.1 and 0.5, hits 100 ms, misses 700 ms.
            for m_rate in (0.1, 0.5, 0.1, 0.5):
                for i in range(200):
                    hit = i >= 200 * m_rate
                    await publisher.publish(
                        CacheAccessed(key=f"k{i}", hit=hit, model="7b", latency_ms=100.0 if hit else 700.0),
                        wait=False,
                    )
            measured = await _collect(reader, lambda s: any(isinstance(e, WarmupMeasured) for e in s), 60)
            await until(lambda: first.events_applied >= 814, 60, 0.05)
            fit = first.planner.ftl.fits["7b"].params()
            first.request_stop()
            await runner
        [m] = [e for e in measured if isinstance(e, WarmupMeasured)]
        assert m.shard == "a" and m.delta_t_ms >= 0
        assert m.t_peak_ms == t0 + 2000
        assert fit == pytest.approx((100.0, 600.0))
        async with WarmupService(settings) as second:
            assert second.model_version is not None
            assert second.planner.ftl.fits["7b"].params() == pytest.approx(fit)


async def test_head_heat_becomes_a_shard_plan_and_rising_heat_warms_semantic_neighbours(  # type: ignore[no-untyped-def]
    kafka, namespace, topics_on, pg_settings, node_settings
) -> None:
    await topics_on(kafka)
    settings = _settings(kafka, namespace, pg_settings, semantic_neighbours=2)
    async with wired(kafka, settings, ShardPlanned.topic, WarmupRequested.topic) as (reader, publisher):
        rng = np.random.default_rng()
        base = rng.normal(size=384).astype(np.float32)
        keys = [f"{namespace}{name}" for name in ("hot", "near-1", "near-2", "far")]
        t0 = time.time_ns() // 1_000_000
        async with running(node_settings("writer")) as writer, WarmupService(settings) as service:
            runner = asyncio.create_task(service.run())
            await until(lambda: all(c.health()["assigned"] for c in service._consumers), 60, 0.05)
            assert writer.cache is not None
            for key, noise in zip(keys, (0.0, 0.1, 0.2, 5.0), strict=True):
                vec = base + noise * rng.normal(size=384).astype(np.float32)
                await writer.cache.put(
                    EntryMeta(key=key, kind="prompt", model="m", embedding=vec), encode_text(key, model="m")
                )
            await publisher.publish(window("*", t0 - 1000, 120))
            await until(lambda: "*" in service.planner.windows, 60, 0.05)
            # Head 2 swings, heads 0 and 1 hold still: a plan with head 2 hot.
            for step in range(8):
                heat = [0.5, 0.5 + 0.01 * (step % 2), float(step % 2)]
                await publisher.publish(
                    AttentionHeatReported(block_hash="b", model="m", step=step, head_heat=heat)
                )
            await publisher.publish(HeatScored(key=keys[0], score=0.1, decision="keep", occurred_at_ms=t0))
            await until(lambda: service.events_applied >= 10, 60, 0.05)
            await publisher.publish(
                HeatScored(key=keys[0], score=0.8, decision="keep", occurred_at_ms=t0 + 100)
            )

            def done(seen: list[Event]) -> bool:
                return any(isinstance(e, ShardPlanned) for e in seen) and any(
                    isinstance(e, WarmupRequested) and e.reason and "neighbours" in e.reason for e in seen
                )

            seen = await _collect(reader, done, 60)
            service.request_stop()
            await runner
    plans = [e for e in seen if isinstance(e, ShardPlanned)]
    assert plans[-1].model == "m" and plans[-1].classes[2] == "hot" and plans[-1].classes[0] == "cold"
    [neighbours] = [
        e for e in seen if isinstance(e, WarmupRequested) and e.reason and "neighbours" in e.reason
    ]
    assert neighbours.keys == keys[1:3], "the two nearest by embedding, not the far one nor the key itself"
