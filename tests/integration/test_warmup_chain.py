"""Warmup end to end on real Kafka and Postgres: traffic with a planted pulse, paced in real time ->
the streams worker's windows and drift clusters -> the warmup service's decision -> `tier.commands.v1`
-> a tier node loads the pulse's keys from L3 into L1 before the pulse peaks, and reports it; Δt is
measured >= 0; a redelivered command has no second effect."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from infra.generator import DEFAULT_SERVICES
from schemas.events import (
    CacheAccessed,
    Event,
    WarmupApplied,
    WarmupDecided,
    WarmupRequested,
)
from schemas.topics import qualified
from schemas.wire import decode
from services.runtime.publisher import EventPublisher
from services.tiers.entry import EntryMeta, encode_text
from services.warmup.service import WarmupService
from services.warmup.settings import WarmupSettings
from tests.integration.conftest import kafka_settings_for
from tests.integration.nodes import running, until
from tests.integration.test_streams import Worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PULSE_KEYS = 4
PEAK_AT_MS = 12_000  # the pulse ramps up 2/s -> 5/s -> 10/s per key; the peak starts here
UNTIL_MS = 17_000


def traffic(t0: int, prefix: str) -> list[CacheAccessed]:
    """Eight steady keys (96 QPS, 3 bits) and a four-key pulse from one service that ramps up from 6 s:
    QPS 104 -> 116 -> 136 and entropy 3.3 -> 3.6 bits, inside the band throughout."""
    out = []
    for n, t in enumerate(range(0, UNTIL_MS, 1000 // 12)):
        for k in range(8):
            service = DEFAULT_SERVICES[(n + k) % len(DEFAULT_SERVICES)]
            out.append(
                CacheAccessed(
                    key=f"{prefix}bg:{k}", hit=True, tier="l1", latency_ms=1.0, shard="s0", call_depth=1,
                    model="m", service=service, occurred_at_ms=t0 + t + k,
                )
            )  # fmt: skip
    for start, end, rate in [(6_000, 9_000, 2), (9_000, PEAK_AT_MS, 5), (PEAK_AT_MS, 14_000, 10)]:
        for t in range(start, end, 1000 // rate):
            for k in range(PULSE_KEYS):
                out.append(
                    CacheAccessed(
                        key=f"{prefix}pulse:{k}", hit=False, tier="l1", latency_ms=4.0, shard="s0",
                        call_depth=6, model="m", service="svc-pulse", occurred_at_ms=t0 + t + k,
                    )
                )  # fmt: skip
    return sorted(out, key=lambda e: e.occurred_at_ms)


async def test_a_planted_pulse_is_warmed_into_a_node_before_its_peak(  # type: ignore[no-untyped-def]
    kafka, namespace, topics_on, pg_settings, node_settings, tmp_path: Path
) -> None:
    await topics_on(kafka)
    worker = Worker(kafka, namespace, tmp_path / "data", tmp_path / "worker.log")
    warmup_settings = WarmupSettings(
        kafka=kafka_settings_for(kafka, namespace),
        postgres=pg_settings,
        group_id=f"warmup-{namespace}",
        model_name=f"ftl-{namespace}",
        metrics_port=0,
        peak_horizon_ms=4_000,
    )
    records = AIOKafkaConsumer(
        qualified(WarmupDecided.topic, namespace),
        qualified(WarmupRequested.topic, namespace),
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest",
    )
    await records.start()
    seen: list[Event] = []

    async def read() -> None:
        while True:
            for batch in (await records.getmany(timeout_ms=200)).values():
                seen.extend(decode(r.value) for r in batch)

    reading = asyncio.create_task(read())
    publisher = EventPublisher(kafka_settings_for(kafka, namespace))
    await publisher.start()
    pulse_keys = [f"{namespace}pulse:{k}" for k in range(PULSE_KEYS)]
    try:
        await worker.wait_healthy()
        async with (
            running(node_settings("writer")) as writer,
            running(node_settings("a")) as node,
            WarmupService(warmup_settings) as warmup,
        ):
            warmup_task = asyncio.create_task(warmup.run())
            await until(lambda: all(c.health()["assigned"] for c in warmup._consumers), 60, 0.05)
            assert writer.cache is not None and node.cache is not None
            for key in pulse_keys:  # in L3 (and the writer's memory), not in node a's
                await writer.cache.put(
                    EntryMeta(key=key, kind="prompt", model="m"), encode_text(key, model="m")
                )
            assert not any(node.cache.get_local(k, model="m").hit for k in pulse_keys)

            t0 = time.time_ns() // 1_000_000 + 500
            held_at_ms: int | None = None
            for event in traffic(t0, namespace):
                now = time.time_ns() // 1_000_000
                if event.occurred_at_ms > now:
                    await asyncio.sleep((event.occurred_at_ms - now) / 1000)
                await publisher.publish(event, wait=False)
                if held_at_ms is None and all(node.cache.get_local(k, model="m").hit for k in pulse_keys):
                    held_at_ms = time.time_ns() // 1_000_000 - t0
            await until(lambda: len(warmup.measured) > 0, 30, 0.05)
            commands = [e for e in seen if isinstance(e, WarmupRequested) and set(pulse_keys) & set(e.keys)]
            decisions = [e for e in seen if isinstance(e, WarmupDecided)]
            assert commands, f"no warmup command for the pulse; decisions: {decisions}"
            # Redelivered: the node does nothing the second time.
            warmed, applied = node.cache.counters.warmed, node.cache.counters.commands
            await publisher.publish(commands[0])
            marker = WarmupRequested(keys=[f"{namespace}bg:0"], node_id=node.settings.node_id)
            await publisher.publish(marker)
            await until(lambda: node.cache.counters.commands > applied, 30, 0.05)
            assert node.cache.counters.commands == applied + 1, "only the marker counted"
            assert node.cache.counters.warmed == warmed
            measured = list(warmup.measured)
            warmup.request_stop()
            await warmup_task
    finally:
        reading.cancel()
        await records.stop()
        await publisher.stop()
        worker.process.stop(20)

    assert held_at_ms is not None, "node a never held the pulse's keys"
    assert held_at_ms < PEAK_AT_MS, f"held at {held_at_ms} ms, after the peak at {PEAK_AT_MS} ms"
    decided = [e for e in seen if isinstance(e, WarmupDecided) and e.action == "warm" and e.source == "drift"]
    assert decided and "pulse" in decided[0].reason and "inside the band" in decided[0].reason
    assert measured and all(m.delta_t_ms >= 0 for m in measured), measured
    applied = [e for e in seen if isinstance(e, WarmupApplied) and e.command_event_id == commands[0].event_id]
    mine = [e for e in applied if e.node_id == node.settings.node_id]
    assert len(mine) == 1 and mine[0].loaded == PULSE_KEYS and mine[0].from_l3 == PULSE_KEYS
