"""The vLLM KV-event bridge on real Kafka and Postgres, fed by a publisher written from vLLM's wire format
(tests/integration/vllm_publisher.py): events arrive in kv.events.v1 with their chains and the engine's id
and the heat service tracks the blocks; a batch missing on PUB is filled from the replay socket; bad
messages go to kv.events.dlq.v1 with the reason; a bridge killed mid-stream and started again loses
nothing and doubles nothing in effect (the heat service applies each block event once)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Self

import msgpack
import pytest
from aiokafka import AIOKafkaConsumer
from cachemesh_client.kvkeys import block_keys

from schemas.events import Event, KvBlockRemoved, KvBlockStored
from schemas.topics import dlq_name, qualified
from schemas.wire import DLQ_KIND, DLQ_REASON, decode
from services.bridge.service import BridgeService
from services.bridge.settings import BridgeSettings
from services.heat.service import HeatService
from services.heat.settings import HeatSettings
from tests.integration.conftest import kafka_settings_for
from tests.integration.nodes import serving, until
from tests.integration.vllm_publisher import VllmPublisher
from tests.vllm_events import Batch, Removed, Stored, encode, seq_bytes

pytestmark = pytest.mark.integration

BLOCKS_PER_BATCH = 4


def block(n: int) -> bytes:
    return hashlib.sha256(f"block-{n}".encode()).digest()


def run_batch(start: int, count: int, at_s: float = 1_700_000_000.0) -> bytes:
    """A batch storing blocks start..start+count-1 of one chain (the first one's parent: start-1); block
    n holds tokens 16n..16n+15."""
    hashes = [block(start + i) for i in range(count)]
    parent = block(start - 1) if start > 0 else None
    tokens = list(range(16 * start, 16 * (start + count)))
    return encode(Batch(at_s + start, [Stored(hashes, parent, tokens, 16)], 0))


# The content key of block n of that chain: what the bridge names it, whatever the engine's hash.
_KEYS = block_keys(list(range(16 * 400)), model="llama-3-8b", block_size=16)


def key(n: int) -> str:
    return _KEYS[n]


def chain_batch(b: int, at_s: float = 1_700_000_000.0) -> bytes:
    """Batch `b` stores blocks 4b..4b+3, continuing the chain that batch b-1 ended."""
    return run_batch(BLOCKS_PER_BATCH * b, BLOCKS_PER_BATCH, at_s)


class Tap:
    """Reads a topic from the start, beside the services (no consumer group)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = []
        self._reader = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        await self._reader.start()
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._reader.stop()

    async def _read(self) -> None:
        while True:
            for records in (await self._reader.getmany(timeout_ms=100)).values():
                self.records.extend((r.key, r.value, list(r.headers)) for r in records)

    def events(self) -> list[Event]:
        return [decode(value) for _, value, _ in self.records]


def _settings(kafka, namespace, pg_settings, pub: VllmPublisher, **kw) -> BridgeSettings:  # type: ignore[no-untyped-def]
    return BridgeSettings(
        kafka=kafka_settings_for(kafka, namespace),
        postgres=pg_settings,
        endpoint=pub.endpoint,
        replay_endpoint=pub.replay_endpoint,
        zmq_topic="kv-events",
        engine_id=f"vllm-{namespace}",
        model="llama-3-8b",
        **kw,
    )


@contextlib.asynccontextmanager
async def kv_tap(kafka, namespace) -> AsyncIterator[Tap]:  # type: ignore[no-untyped-def]
    async with Tap(kafka.bootstrap, qualified(KvBlockStored.topic, namespace)) as tap:
        yield tap


def _seen(service: HeatService) -> int:
    """Records the heat service's consumers have taken (applied, dropped as duplicates or dead-lettered)."""
    return sum(consumer.seen for consumer in service._consumers)


def stored_hashes(events: list[Event]) -> set[str]:
    return {e.block_hash for e in events if isinstance(e, KvBlockStored)}


async def test_events_arrive_with_chains_and_heat_tracks_the_blocks(
    kafka, namespace, topics_on, pg_settings
) -> None:
    await topics_on(kafka)
    heat_settings = HeatSettings(
        kafka=kafka_settings_for(kafka, namespace),
        postgres=pg_settings,
        group_id=f"heat-{namespace}",
        model_name=f"heat-{namespace}",
        capacity=1000,
    )
    paced, runs = 8, 3
    total = paced + runs * BLOCKS_PER_BATCH
    with VllmPublisher() as pub:
        settings = _settings(kafka, namespace, pg_settings, pub)
        async with kv_tap(kafka, namespace) as tap, serving(HeatService(heat_settings)) as heat:
            async with serving(BridgeService(settings)) as bridge:
                # One block per batch, published at once: records are keyed by block hash, so the
                # blocks of this chain sit on different partitions and reach heat in any order; heat
                # parks a child until its parent arrives (services/heat/engine.py).
                for n in range(paced):
                    pub.publish(run_batch(n, 1))
                for r in range(runs):  # then runs of four blocks, a chain within each batch too
                    pub.publish(run_batch(paced + r * BLOCKS_PER_BATCH, BLOCKS_PER_BATCH))
                pub.publish(encode(Batch(1_700_000_100.0, [Removed([block(total - 1)])], 0)))
                await until(lambda: len(tap.records) >= total + 1, timeout_s=30, step_s=0.02)
                health = await bridge.health()
            await until(lambda: heat.engine.events_applied >= total + 1, timeout_s=30, step_s=0.02)
            tracked = {key(n) for n in range(total - 1) if key(n) in heat.engine.policy}
            removed_still_tracked = key(total - 1) in heat.engine.policy

    assert tracked == {key(n) for n in range(total - 1)}, "heat holds every block of the chain"
    assert not removed_still_tracked
    events = tap.events()
    stored = [e for e in events if isinstance(e, KvBlockStored)]
    assert len(stored) == total and stored_hashes(events) == {key(n) for n in range(total)}
    parents = {e.block_hash: e.parent_block_hash for e in stored}
    for n in range(total):  # the prefix chain survives, within and across batches
        assert parents[key(n)] == (key(n - 1) if n else None)
    assert {e.node_id for e in stored} == {settings.engine_id}
    assert {(e.model, e.block_size_tokens, e.medium) for e in stored} == {("llama-3-8b", 16, "gpu")}
    (removed,) = [e for e in events if isinstance(e, KvBlockRemoved)]
    assert removed.block_hash == key(total - 1) and removed.node_id == settings.engine_id
    # Keyed by block hash (the catalogue's key for kv.events.v1).
    assert all(
        key == event.kafka_key().encode() for (key, _, _), event in zip(tap.records, events, strict=True)
    )
    assert health["healthy"] and health["engines"][0]["last_seq"] == paced + runs


async def test_a_batch_missing_on_pub_is_filled_from_the_replay_socket(
    kafka, namespace, topics_on, pg_settings
) -> None:
    await topics_on(kafka)
    with VllmPublisher() as pub:
        async with (
            kv_tap(kafka, namespace) as tap,
            serving(BridgeService(_settings(kafka, namespace, pg_settings, pub))) as bridge,
        ):
            for b in range(3):
                pub.publish(chain_batch(b))
            await until(lambda: len(tap.records) >= 3 * BLOCKS_PER_BATCH, timeout_s=30, step_s=0.02)
            pub.publish(chain_batch(3), drop_on_pub=True)  # seq 3 never reaches the SUB socket
            for b in range(4, 6):
                pub.publish(chain_batch(b))
            await until(lambda: len(tap.records) >= 6 * BLOCKS_PER_BATCH, timeout_s=30, step_s=0.02)
            # A later batch as a marker: once it is through, a copy of anything sent before it is too.
            pub.publish(chain_batch(6))
            marker = {key(n) for n in range(6 * BLOCKS_PER_BATCH, 7 * BLOCKS_PER_BATCH)}
            await until(lambda: marker <= stored_hashes(tap.events()), timeout_s=30, step_s=0.02)
            (engine,) = bridge.engines
    assert stored_hashes(tap.events()) == {key(n) for n in range(7 * BLOCKS_PER_BATCH)}
    assert len(tap.records) == 7 * BLOCKS_PER_BATCH  # nothing twice
    assert 3 in pub.replay_requests
    assert engine.tracker.lost == 0 and engine.counts.replayed >= 1


async def test_bad_messages_go_to_the_dead_letter_topic_and_the_bridge_goes_on(
    kafka, namespace, topics_on, pg_settings
) -> None:
    await topics_on(kafka)
    dlq = qualified(dlq_name(KvBlockStored.topic), namespace)
    with VllmPublisher() as pub:
        async with (
            kv_tap(kafka, namespace) as tap,
            Tap(kafka.bootstrap, dlq) as dead,
            serving(BridgeService(_settings(kafka, namespace, pg_settings, pub))) as bridge,
        ):
            pub.publish(chain_batch(0))
            await until(lambda: len(tap.records) >= BLOCKS_PER_BATCH, timeout_s=30, step_s=0.02)
            pub.send_frames([b"kv-events", seq_bytes(1)])  # two frames
            pub.publish(b"\xc1 not msgpack")  # seq 1
            pub.publish(msgpack.packb([1.0, [["Nope", [1]]]]))  # seq 2: unknown tag
            pub.publish(chain_batch(1))  # seq 3
            await until(lambda: len(dead.records) >= 3 and len(tap.records) >= 2 * BLOCKS_PER_BATCH, 30, 0.02)
            health = await bridge.health()
    kinds = [dict(h)[DLQ_KIND].decode() for _, _, h in dead.records]
    assert sorted(kinds) == ["bad_frames", "malformed_msgpack", "unknown_tag"]
    by_kind = {dict(h)[DLQ_KIND].decode(): (v, dict(h)) for _, v, h in dead.records}
    assert by_kind["malformed_msgpack"][0] == b"\xc1 not msgpack"  # the original bytes, untouched
    assert b"Nope" in by_kind["unknown_tag"][1][DLQ_REASON]
    assert health["healthy"] and health["engines"][0]["dead_lettered"] == 3
    assert stored_hashes(tap.events()) == {key(n) for n in range(2 * BLOCKS_PER_BATCH)}


async def test_a_killed_bridge_restarts_losing_nothing_and_doubling_nothing(
    kafka, namespace, topics_on, pg_settings
) -> None:
    await topics_on(kafka)
    heat_settings = HeatSettings(
        kafka=kafka_settings_for(kafka, namespace),
        postgres=pg_settings,
        group_id=f"heat-{namespace}",
        model_name=f"heat-{namespace}",
        capacity=10_000,
    )
    total = 60
    with VllmPublisher() as pub:
        settings = _settings(kafka, namespace, pg_settings, pub)
        async with kv_tap(kafka, namespace) as tap, serving(HeatService(heat_settings)) as heat:
            first = BridgeService(settings)
            await first.start()
            running = asyncio.create_task(first.run())
            for b in range(20):
                pub.publish(chain_batch(b))
            await until(lambda: first.engines[0].counts.forwarded >= 10, timeout_s=30, step_s=0.001)
            # Killed, not stopped: the run is cancelled wherever it is (between a produce and its save).
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            killed_at = first.engines[0].tracker.last_forwarded
            await first.stop()
            for b in range(20, 40):  # published while no bridge listens
                pub.publish(chain_batch(b))
            pub.flush()
            async with serving(BridgeService(settings)) as second:
                for b in range(40, total):
                    pub.publish(chain_batch(b))
                await until(
                    lambda: stored_hashes(tap.events()) >= {key(n) for n in range(total * 4)},
                    30,
                    0.05,
                )
                resumed = second.engines[0]
            want = total * BLOCKS_PER_BATCH
            await until(lambda: heat.engine.events_applied >= want, timeout_s=30, step_s=0.02)
            # Drained: heat has taken every record on the topic, re-sent copies included, before the
            # count is read (the tap reads the same topic to its end).
            await until(lambda: len(tap.records) >= want, timeout_s=30, step_s=0.02)
            await until(lambda: _seen(heat) >= len(tap.records), timeout_s=30, step_s=0.02)
            applied = heat.engine.events_applied

    ids = [e.event_id for e in tap.events()]
    assert len(set(ids)) == want, "every block event exactly once by id"
    assert applied == want, "the heat service applied each once, whatever was re-sent"
    assert resumed.tracker.lost == 0 and resumed.tracker.epoch == 0
    # The second bridge replayed the engine's buffer from the start: what it had forwarded up to the
    # saved position (the last batch forwarded, or the one before if the kill came between its produce
    # and its save) only taught it the chain's keys; what came after went on.
    assert pub.replay_requests[-1] == 0 and killed_at >= 9
    assert resumed.counts.replayed >= 20 and resumed.chains.orphans == 0


@pytest.mark.parametrize("first_epoch", ["heard live", "replayed on first start"])
async def test_an_engine_restart_starts_a_new_epoch(
    kafka, namespace, topics_on, pg_settings, first_epoch: str
) -> None:
    # "replayed on first start" is how the full suite once lost the second epoch: under load the
    # bridge's first-start replay took the first batches before SUB heard them, so nothing was heard
    # live, and the restarted engine's 0..2 were taken for those replayed batches again (duplicates).
    await topics_on(kafka)
    with VllmPublisher() as pub:
        if first_epoch == "replayed on first start":
            for b in range(3):
                pub.publish(chain_batch(b))
            pub.flush()
        async with (
            kv_tap(kafka, namespace) as tap,
            serving(BridgeService(_settings(kafka, namespace, pg_settings, pub))) as bridge,
        ):
            if first_epoch == "heard live":
                for b in range(3):
                    pub.publish(chain_batch(b))
            await until(lambda: len(tap.records) >= 3 * BLOCKS_PER_BATCH, timeout_s=30, step_s=0.02)
            (engine,) = bridge.engines
            assert engine.tracker.epoch == 0
            pub.restart_numbering()  # vLLM restarted: seq 0 again, the replay buffer empty
            for b in range(2):  # it computes the same prompt again (later): the same keys
                pub.publish(chain_batch(b, at_s=1_700_000_500.0))
            n = 3 * BLOCKS_PER_BATCH  # stored, removed when the restart is noticed, and stored again
            await until(lambda: len(tap.records) >= 2 * n + 2 * BLOCKS_PER_BATCH, timeout_s=30, step_s=0.02)
    events = tap.events()
    assert stored_hashes(events) == {key(n) for n in range(3 * BLOCKS_PER_BATCH)}
    removed = [e.block_hash for e in events if isinstance(e, KvBlockRemoved)]
    assert sorted(removed) == sorted(key(n) for n in range(3 * BLOCKS_PER_BATCH))
    stored = sorted(e.block_hash for e in events if isinstance(e, KvBlockStored))
    assert stored == sorted([key(n) for n in range(n)] + [key(n) for n in range(2 * BLOCKS_PER_BATCH)])
    # Seq 0..1 came twice, once per epoch: different event ids, so nothing downstream drops them.
    assert len({e.event_id for e in events}) == len(events) == 2 * n + 2 * BLOCKS_PER_BATCH
    assert engine.tracker.epoch == 1 and engine.tracker.last_forwarded == 1 and engine.counts.restarts == 1
    if first_epoch == "replayed on first start":
        assert engine.counts.duplicates == 0, "nothing of the first epoch came live, nothing was a copy"


async def test_what_the_replay_no_longer_holds_is_counted_lost(
    kafka, namespace, topics_on, pg_settings
) -> None:
    await topics_on(kafka)
    with VllmPublisher(buffer_steps=3) as pub:
        async with (
            kv_tap(kafka, namespace) as tap,
            serving(BridgeService(_settings(kafka, namespace, pg_settings, pub))) as bridge,
        ):
            pub.publish(chain_batch(0))
            await until(lambda: len(tap.records) >= BLOCKS_PER_BATCH, timeout_s=30, step_s=0.02)
            for b in (1, 2, 3):  # never heard; the buffer of three keeps 2, 3 (and then 4)
                pub.publish(chain_batch(b), drop_on_pub=True)
            pub.publish(chain_batch(4))
            await until(lambda: bridge.engines[0].counts.forwarded >= 4, timeout_s=30, step_s=0.02)
            health = await bridge.health()
    # Batch 1 is gone, so blocks 4..7 have no keys, and neither has any block chained after them:
    # batches 2..4 are orphans (counted, not guessed at).
    assert stored_hashes(tap.events()) == {key(n) for n in range(4)}
    (engine,) = health["engines"]
    assert engine["lost"] == 1 and engine["last_seq"] == 4 and health["healthy"]
    assert engine["orphan_blocks"] == 3 * BLOCKS_PER_BATCH
