"""The heat service on real Kafka and Postgres: every access event becomes a heat.scores.v1 decision, and
the learned model survives a restart. The event -> decision latency is measured by bench/heat_latency.py."""

from __future__ import annotations

import asyncio
import re
import time

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from policies.learned.features import N_FEATURES
from schemas.events import CacheAccessed, HeatScored, HeatScoredBatch, KvBlockStored, record_events
from schemas.topics import qualified
from schemas.wire import decode
from services.heat.service import HeatService
from services.heat.settings import HeatSettings
from services.runtime.model_store import PostgresModelStore
from services.runtime.postgres import Database
from services.runtime.publisher import EventPublisher
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
    batches = 0
    async with HeatService(settings) as service:
        runner = asyncio.create_task(service.run())

        async def read() -> None:
            nonlocal batches
            while not sent <= decided:
                for records in (await reader.getmany(timeout_ms=200)).values():
                    for record in records:
                        got = decode(record.value)
                        assert isinstance(got, HeatScored | HeatScoredBatch)
                        batches += isinstance(got, HeatScoredBatch)
                        for scored in record_events(got):
                            assert isinstance(scored, HeatScored)
                            # Every decision on its key's partition, as a record of its own would be.
                            [home] = await publisher.partitions_of_keys(HeatScored, [scored.key])
                            assert home == record.partition
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
    assert batches > 0  # a round's decisions go out several to a record
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
        assert first.engine.policy.start_half_life(10.0)  # as if its chain guard had moved it
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
        # The chains' half-life comes back too: they will start at it.
        assert second.engine.policy.chain_half_life == 10.0
    await publisher.stop()


def _owned(health: dict, topic: str) -> set[int]:
    """The partitions of `topic` a service's (first) consumer holds, from its health report."""
    found = set()
    for tp in health["consumers"][0]["assigned"]:
        match = re.fullmatch(r"TopicPartition\(topic='(.*)', partition=(\d+)\)", tp)
        assert match is not None, tp
        if match[1] == topic:
            found.add(int(match[2]))
    return found


async def _until(condition, what: str, timeout_s: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_two_heat_services_split_the_keys_and_a_rebalance_moves_them(
    kafka, namespace, topics_on, pg_settings
) -> None:
    """Two instances in one group: each key is tracked by the owner of its partition only; when the
    second joins, the first forgets the keys of the partitions it gave up and nothing is applied twice;
    when the second leaves, the first takes them all back."""
    await topics_on(kafka)
    topic = qualified(CacheAccessed.topic, namespace)
    common = {"capacity": 10_000, "rescore_interval_ms": 50}
    a_settings = _settings(kafka, namespace, pg_settings, instance="a", **common)
    b_settings = _settings(kafka, namespace, pg_settings, instance="b", **common)
    publisher = EventPublisher(a_settings.kafka)
    await publisher.start()
    keys = [f"key-{i}" for i in range(240)]
    partition = dict(
        zip(keys, await publisher.partitions_of([CacheAccessed(key=k, hit=False) for k in keys]), strict=True)
    )
    assert len(set(partition.values())) == 6
    clock = iter(range(1_700_000_000_000, 1_800_000_000_000, 10))

    async def wave() -> None:
        events = [CacheAccessed(key=k, hit=False, occurred_at_ms=next(clock)) for k in keys]
        await publisher.publish_many(events)

    def tracked(service: HeatService) -> set[str]:
        return {k for k in keys if k in service.engine.policy}

    async with HeatService(a_settings) as a:
        a_run = asyncio.create_task(a.run())

        async def a_has_all() -> bool:
            return len(_owned(await a.health(), topic)) == 6

        await _until(a_has_all, "the first instance to hold every partition")
        await wave()

        async def a_applied(n: int) -> bool:
            return a.engine.events_applied >= n

        await _until(lambda: a_applied(len(keys)), "the first wave")
        assert tracked(a) == set(keys)

        async with HeatService(b_settings) as b:
            b_run = asyncio.create_task(b.run())

            async def split() -> bool:
                mine, theirs = _owned(await a.health(), topic), _owned(await b.health(), topic)
                settled = mine and theirs and mine | theirs == set(range(6)) and not mine & theirs
                return bool(settled) and tracked(a) == {k for k in keys if partition[k] in mine}

            await _until(split, "the partitions to split and the first instance to forget the moved keys")
            mine, theirs = _owned(await a.health(), topic), _owned(await b.health(), topic)
            assert a.engine.forgotten == sum(partition[k] in theirs for k in keys)
            assert b.engine.events_applied == 0  # everything before the split was committed by the first
            await wave()

            async def second_wave() -> bool:
                return a.engine.events_applied + b.engine.events_applied >= 2 * len(keys)

            await _until(second_wave, "the second wave")
            assert a.engine.events_applied + b.engine.events_applied == 2 * len(keys)  # none twice
            assert tracked(a) == {k for k in keys if partition[k] in mine}
            assert tracked(b) == {k for k in keys if partition[k] in theirs}

            # Prefix chains: a chain's blocks sit on both instances' partitions; each block is tracked
            # by the owner of its own, none waits for (or is rejected for) a parent held by the other.
            kv_topic = qualified(KvBlockStored.topic, namespace)
            blocks = [
                KvBlockStored(
                    block_hash=f"blk-{c}-{d}",
                    parent_block_hash=None if d == 0 else f"blk-{c}-{d - 1}",
                    occurred_at_ms=next(clock),
                )
                for c in range(20)
                for d in range(4)
            ]
            kv_partition = dict(
                zip([b.block_hash for b in blocks], await publisher.partitions_of(blocks), strict=True)
            )
            await publisher.publish_many(blocks)
            a_kv, b_kv = _owned(await a.health(), kv_topic), _owned(await b.health(), kv_topic)
            assert a_kv and b_kv and a_kv | b_kv == set(range(6))

            async def blocks_in() -> bool:
                return all(h in a.engine.policy or h in b.engine.policy for h in kv_partition)

            await _until(blocks_in, "every block to be tracked by one of them")
            assert {h for h in kv_partition if h in a.engine.policy} == {
                h for h, p in kv_partition.items() if p in a_kv
            }
            assert {h for h in kv_partition if h in b.engine.policy} == {
                h for h, p in kv_partition.items() if p in b_kv
            }
            assert a.engine.orphans_parked == b.engine.orphans_parked == 0
            # A block whose parent is held here hands the policy to the compiled chain core.
            assert any(getattr(s.engine.policy, "core", None) is not None for s in (a, b))
            b.request_stop()
            await b_run

        await _until(a_has_all, "the first instance to take every partition back")
        before = a.engine.events_applied
        await wave()
        await _until(lambda: a_applied(before + len(keys)), "the third wave")
        assert a.engine.events_applied == before + len(keys)
        assert tracked(a) == set(keys)
        a.request_stop()
        await a_run
    await publisher.stop()


async def test_instances_checkpoint_under_their_own_names_and_a_new_one_starts_from_theirs(
    kafka, namespace, topics_on, pg_settings
) -> None:
    await topics_on(kafka)
    a_settings = _settings(kafka, namespace, pg_settings, capacity=64, rescore_interval_ms=20, instance="a")
    publisher = EventPublisher(a_settings.kafka)
    await publisher.start()
    keys = np.random.default_rng(5).zipf(1.3, size=3000) % 300
    async with HeatService(a_settings) as a:
        runner = asyncio.create_task(a.run())
        t0 = 1_700_000_000_000
        await publisher.publish_many(
            [CacheAccessed(key=f"k{k}", hit=False, occurred_at_ms=t0 + i * 5) for i, k in enumerate(keys)]
        )

        async def trained() -> bool:
            return a.engine.scored_events == len(keys) and a.engine.policy.scorer.steps > 0

        await _until(trained, "the first instance to train on every event")
        a.request_stop()
        await runner
        steps = a.engine.policy.scorer.steps
    await publisher.stop()

    db = Database(pg_settings)
    await db.start()
    try:
        store = PostgresModelStore(db)
        assert await store.latest(f"{a_settings.model_name}@a") is not None
        assert await store.latest(a_settings.model_name) is None  # not the shared name
    finally:
        await db.stop()
    c_settings = _settings(kafka, namespace, pg_settings, capacity=64, instance="c")
    async with HeatService(c_settings) as c:
        assert c.engine.policy.scorer.steps == steps  # started from what "a" learnt
        assert c.model_version is None  # no version of its own yet
        assert not c.model_changed()
