"""The KV-event bridge on a real vLLM (infra/vllm_server.py): the chains cachemesh learns are the blocks
the engine stored (content keys from the token ids and the model, parents, block size); evictions and
`reset_prefix_cache` arrive as removals; a batch lost on the live socket is filled from the engine's
replay socket; a bridge restarted mid-stream, and an engine restarted under the bridge, are survived.
(Malformed frames, which a real engine does not send, are in test_bridge_service.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Iterator

import pytest
from cachemesh_client.kvkeys import block_keys

from infra.vllm_server import BLOCK_SIZE, VllmServer
from schemas.events import KvBlockRemoved, KvBlockStored
from services.bridge.service import BridgeService
from services.bridge.settings import BridgeSettings
from services.bridge.zmq_source import ZmqSource
from tests.integration.conftest import kafka_settings_for
from tests.integration.nodes import serving, until
from tests.integration.test_bridge_service import Tap, kv_tap

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

KV_BLOCKS = 48  # a small pool, so a few prompts evict older blocks


@pytest.fixture(scope="module")
def engine() -> Iterator[VllmServer]:
    server = VllmServer(kv_blocks=KV_BLOCKS)
    server.start()
    yield server
    server.stop()


def prompt(rng: random.Random, blocks: int, extra: int = 5) -> list[int]:
    """Token ids no other test sends (ids 10..2000 of the tiny model's 2048)."""
    return [rng.randrange(10, 2000) for _ in range(blocks * BLOCK_SIZE + extra)]


def bridge_settings(kafka, namespace, pg_settings, engine: VllmServer) -> BridgeSettings:  # type: ignore[no-untyped-def]
    return BridgeSettings(
        kafka=kafka_settings_for(kafka, namespace),
        postgres=pg_settings,
        endpoint=engine.events_endpoint,
        replay_endpoint=engine.replay_endpoint,
        zmq_topic="kv-events",
        engine_id=f"vllm-{namespace}",
        model=engine.model,
    )


@contextlib.asynccontextmanager
async def bridged(
    kafka, namespace, topics_on, pg_settings, engine
) -> AsyncIterator[tuple[Tap, BridgeService]]:  # type: ignore[no-untyped-def]
    await topics_on(kafka)
    async with (
        kv_tap(kafka, namespace) as tap,
        serving(BridgeService(bridge_settings(kafka, namespace, pg_settings, engine))) as bridge,
    ):
        yield tap, bridge


def stored(tap: Tap) -> dict[str, KvBlockStored]:
    return {e.block_hash: e for e in tap.events() if isinstance(e, KvBlockStored)}


def removed(tap: Tap) -> set[str]:
    return {e.block_hash for e in tap.events() if isinstance(e, KvBlockRemoved)}


async def complete(engine: VllmServer, tokens: list[int], max_tokens: int = 2) -> dict[str, object]:
    return await asyncio.to_thread(engine.complete, tokens, max_tokens=max_tokens)


async def test_the_chains_learned_are_the_blocks_the_engine_stored(
    kafka, namespace, topics_on, pg_settings, engine
) -> None:
    rng = random.Random(1)
    a = prompt(rng, 3)
    b = a[: 2 * BLOCK_SIZE] + prompt(rng, 2)  # shares a's first two blocks
    async with bridged(kafka, namespace, topics_on, pg_settings, engine) as (tap, bridge):
        await complete(engine, a)
        await complete(engine, b)
        want_a = block_keys(a, model=engine.model, block_size=BLOCK_SIZE)
        want_b = block_keys(b, model=engine.model, block_size=BLOCK_SIZE)
        await until(lambda: set(want_a + want_b) <= set(stored(tap)), timeout_s=60, step_s=0.05)
        health = await bridge.health()
    got = stored(tap)
    for chain in (want_a, want_b):
        for i, key in enumerate(chain):
            event = got[key]
            assert event.parent_block_hash == (chain[i - 1] if i else None)
            assert event.block_size_tokens == BLOCK_SIZE and event.model == engine.model
            assert event.node_id == f"vllm-{namespace}"
    # b's shared blocks were the engine's prefix-cache hits: stored once, not again.
    keys = [e.block_hash for e in tap.events() if isinstance(e, KvBlockStored)]
    assert keys.count(want_a[0]) == 1 and len(want_b) == 4
    assert health["healthy"] and health["engines"][0]["orphan_blocks"] == 0


async def test_evictions_and_a_prefix_cache_reset_arrive_as_removals(
    kafka, namespace, topics_on, pg_settings, engine
) -> None:
    rng = random.Random(2)
    first = prompt(rng, 4)
    async with bridged(kafka, namespace, topics_on, pg_settings, engine) as (tap, _):
        await complete(engine, first)
        first_keys = block_keys(first, model=engine.model, block_size=BLOCK_SIZE)
        await until(lambda: set(first_keys) <= set(stored(tap)), timeout_s=60, step_s=0.05)
        # Enough other prompts to need every block of the pool: the oldest cached ones are evicted.
        for _ in range(KV_BLOCKS // 4 + 2):
            await complete(engine, prompt(rng, 4))
        await until(lambda: set(first_keys) <= removed(tap), timeout_s=60, step_s=0.05)
        # Then the engine drops everything: what it still held is removed.
        last = prompt(rng, 2)
        await complete(engine, last)
        last_keys = block_keys(last, model=engine.model, block_size=BLOCK_SIZE)
        await until(lambda: set(last_keys) <= set(stored(tap)), timeout_s=60, step_s=0.05)
        await asyncio.to_thread(engine.reset_prefix_cache)
        await complete(engine, [7, 8, 9])  # the clear is published on the next engine step
        await until(lambda: set(last_keys) <= removed(tap), timeout_s=60, step_s=0.05)
        # Every block the engine still held goes, not only the last prompt's: their removals land on
        # the topic's other partitions, which the tap may read a moment later (CI read 4 still live).
        await until(lambda: live(tap) == 0, timeout_s=60, step_s=0.05)


def live(tap: Tap) -> int:
    """Blocks stored and not removed since, as the topic tells it."""
    net: dict[str, int] = {}
    for e in tap.events():
        if isinstance(e, KvBlockStored | KvBlockRemoved):
            net[e.block_hash] = net.get(e.block_hash, 0) + (1 if isinstance(e, KvBlockStored) else -1)
    return sum(1 for v in net.values() if v > 0)


class LossySource(ZmqSource):
    """The bridge's real ZMQ source, losing the next live message on request (as a slow SUB past its
    high-water mark would): the gap must be noticed by its number and filled from the replay socket."""

    drop_next = False

    async def receive(self) -> list[bytes]:
        frames = await super().receive()
        if LossySource.drop_next:
            LossySource.drop_next = False
            frames = await super().receive()
        return frames


async def test_a_lost_batch_is_noticed_by_number_and_filled_from_the_replay(
    kafka, namespace, topics_on, pg_settings, engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("services.bridge.service.ZmqSource", LossySource)
    rng = random.Random(3)
    prompts = [prompt(rng, 2) for _ in range(3)]
    async with bridged(kafka, namespace, topics_on, pg_settings, engine) as (tap, bridge):
        (source,) = [e.source for e in bridge.engines]
        assert isinstance(source, LossySource)
        await complete(engine, prompts[0])
        k0 = block_keys(prompts[0], model=engine.model, block_size=BLOCK_SIZE)
        await until(lambda: set(k0) <= set(stored(tap)), timeout_s=60, step_s=0.05)
        LossySource.drop_next = True
        for p in prompts[1:]:
            await complete(engine, p)
        want = {k for p in prompts for k in block_keys(p, model=engine.model, block_size=BLOCK_SIZE)}
        await until(lambda: want <= set(stored(tap)), timeout_s=60, step_s=0.05)
        (state,) = (await bridge.health())["engines"]
    assert not LossySource.drop_next, "a message was dropped"
    assert state["replays"] >= 2 and state["replayed"] >= 1 and state["lost"] == 0


async def test_a_restarted_bridge_and_a_restarted_engine_are_survived(
    kafka, namespace, topics_on, pg_settings, engine
) -> None:
    rng = random.Random(4)
    base = prompt(rng, 2)
    longer = base[: 2 * BLOCK_SIZE] + prompt(rng, 1)  # extends base's chain
    again = prompt(rng, 2)
    settings = bridge_settings(kafka, namespace, pg_settings, engine)
    await topics_on(kafka)
    async with kv_tap(kafka, namespace) as tap:
        async with serving(BridgeService(settings)):
            await complete(engine, base)
            base_keys = block_keys(base, model=engine.model, block_size=BLOCK_SIZE)
            await until(lambda: set(base_keys) <= set(stored(tap)), timeout_s=60, step_s=0.05)
        # While no bridge listens, the engine extends the chain; the next bridge resumes from its saved
        # position and keys the new block from the parent it learns again from the replay.
        await complete(engine, longer)
        async with serving(BridgeService(settings)) as second:
            longer_keys = block_keys(longer, model=engine.model, block_size=BLOCK_SIZE)
            await until(lambda: set(longer_keys) <= set(stored(tap)), timeout_s=60, step_s=0.05)
            assert stored(tap)[longer_keys[2]].parent_block_hash == base_keys[1]
            # The engine restarts (a new process, numbering from 0, an empty cache).
            await asyncio.to_thread(engine.restart)
            await complete(engine, again)
            again_keys = block_keys(again, model=engine.model, block_size=BLOCK_SIZE)
            await until(lambda: set(again_keys) <= set(stored(tap)), timeout_s=120, step_s=0.05)
            await until(lambda: set(base_keys + longer_keys) <= removed(tap), timeout_s=60, step_s=0.05)
            (state,) = (await second.health())["engines"]
    assert state["restarts"] == 1 and state["epoch"] == 1 and state["orphan_blocks"] == 0
