"""cachemesh as vLLM's KV tier, on real engines (client/cachemesh_client/vllm.py): a second engine answers a
prompt whose prefix only the first computed, loading the blocks from the tier node, with greedy output
identical to a cold run; an engine reloads its own prefix after `reset_prefix_cache`; and a node that is
down, one that never answers, a block of another shape, and blocks the node cannot send all end in a
recomputation: the request succeeds, the output is the cold one, the error is counted. Blocks are
tagged with the weights: an engine serving other weights under the same name never loads them."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import numpy as np
import pytest
from cachemesh_client.kvkeys import block_keys

from infra.paths import LOOPBACK, free_port
from infra.vllm_env import TINY_REVISED
from infra.vllm_server import BLOCK_SIZE, VllmServer, connector_config
from services.runtime.topics import ensure_topics
from services.tiers import codec
from services.tiers.service import TiersService
from services.tiers.settings import TiersSettings
from tests.integration.conftest import kafka_settings_for
from tests.integration.nodes import running

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
# The nodes here share the test's event loop (and two cores with the engines): more than the 300 ms a
# dedicated node is given, so that a lookup is not given up on while another node writes.
LOOKUP_MS = 3_000


def node_settings_for(kafka, pg_settings, namespace: str, node: str, **kw: object) -> TiersSettings:  # type: ignore[no-untyped-def]
    base: dict[str, object] = {
        "node_id": f"{node}-{namespace}",
        "api_port": 0,
        "block_port": 0,
        "metrics_port": 0,
        "embedder_preload": False,
        "l2_pages": 1024,
        "kafka": kafka_settings_for(kafka, namespace),
        "postgres": pg_settings,
    }
    return TiersSettings(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def module_namespace() -> str:
    return f"t{uuid.uuid4().hex[:10]}."


@pytest.fixture(scope="module")
async def node(kafka, postgres, module_namespace) -> AsyncIterator[TiersService]:  # type: ignore[no-untyped-def]
    from tests.integration.conftest import PostgresSettings, SecretStr

    pg = PostgresSettings(database_url=SecretStr(postgres.dsn), pg_retry_deadline_s=60)
    await ensure_topics(kafka.bootstrap, module_namespace)
    async with running(node_settings_for(kafka, pg, module_namespace, "kv")) as service:
        service.pg_settings = pg  # type: ignore[attr-defined]
        yield service


@pytest.fixture(scope="module")
async def engines(node: TiersService) -> AsyncIterator[tuple[VllmServer, VllmServer]]:
    config = connector_config(node.api_url, model="cachemesh-tiny", lookup_timeout_ms=LOOKUP_MS)
    a, b = VllmServer(kv_blocks=128, connector=config), VllmServer(kv_blocks=128, connector=config)
    try:
        # Started from a thread: the node shares this event loop and must go on answering (and
        # heartbeating to Kafka) meanwhile. One at a time: two starting at once on two cores is slow.
        for server in (a, b):
            await asyncio.to_thread(server.start)
        yield a, b
    finally:
        for server in (a, b):
            await asyncio.to_thread(server.stop)


def prompt(rng: random.Random, blocks: int, extra: int = 9) -> list[int]:
    return [rng.randrange(10, 2000) for _ in range(blocks * BLOCK_SIZE + extra)]


async def complete(engine: VllmServer, tokens: list[int]) -> str:
    body = await asyncio.to_thread(engine.complete, tokens, max_tokens=12)
    return str(body["choices"][0]["text"])


async def held(node: TiersService, tokens: list[int]) -> int:
    keys = block_keys(tokens, model="cachemesh-tiny", block_size=BLOCK_SIZE)
    async with httpx.AsyncClient(base_url=node.api_url) as client:
        response = await client.post("/v1/prefix", json={"keys": keys})
    return int(response.json()["prefix_blocks"])


async def saved(node: TiersService, tokens: list[int]) -> None:
    """Until the node holds every full block of `tokens` (saves are sent in the background)."""
    want = len(tokens) // BLOCK_SIZE
    for _ in range(600):
        if await held(node, tokens) >= want:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the node holds {await held(node, tokens)} of {want} blocks")


def metric(engine: VllmServer, name: str) -> float:
    return engine.metrics().get(name, 0.0)


async def test_a_second_engine_loads_the_prefix_the_first_computed(node, engines) -> None:
    a, b = engines
    rng = random.Random(11)
    p = prompt(rng, 6)
    cold = await complete(a, p)  # nothing cached anywhere: computed, then saved
    await saved(node, p)
    before = await asyncio.to_thread(metric, b, EXTERNAL_HITS)
    loaded = await complete(b, p)
    after = await asyncio.to_thread(metric, b, EXTERNAL_HITS)
    assert loaded == cold, "greedy output with loaded KV equals the cold output"
    assert after - before == 6 * BLOCK_SIZE
    await counted(b, "vllm:cachemesh_blocks_from_segment_total", 6)  # b and the node share a host
    # The tier node held them in L2 (the block pool, a shared segment b copied them out of).
    stats = node.cache.stats()
    assert stats["l2"]["entries"] >= 6
    assert node.cache.l2 is not None and node.cache.l2.pool.segment is not None
    # A prompt that shares only its first four blocks with p: b (its own prefix cache emptied) loads
    # those four and computes the fifth; a, which has them in its own prefix cache, agrees.
    q = p[: 4 * BLOCK_SIZE] + prompt(rng, 1)
    await asyncio.to_thread(b.reset_prefix_cache)
    before = await asyncio.to_thread(metric, b, EXTERNAL_HITS)
    loaded_q = await complete(b, q)
    assert await asyncio.to_thread(metric, b, EXTERNAL_HITS) - before == 4 * BLOCK_SIZE
    assert loaded_q == await complete(a, q)


async def test_after_a_reset_an_engine_reloads_its_own_prefix(node, engines) -> None:
    a, _ = engines
    rng = random.Random(12)
    p = prompt(rng, 5)
    cold = await complete(a, p)
    await saved(node, p)
    await asyncio.to_thread(a.reset_prefix_cache)
    before = await asyncio.to_thread(metric, a, EXTERNAL_HITS)
    assert await complete(a, p) == cold
    assert await asyncio.to_thread(metric, a, EXTERNAL_HITS) - before == 5 * BLOCK_SIZE


@contextlib.contextmanager
def black_hole() -> Iterator[str]:
    """A TCP port that accepts connections and never answers (a node that stopped responding)."""
    server = socket.create_server((LOOPBACK, 0))
    held_open: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held_open.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held_open:
            conn.close()
        server.close()


@pytest.mark.parametrize("fault", ["down", "not answering"])
async def test_a_node_that_is_down_or_silent_means_computing_without_it(node, engines, fault: str) -> None:
    a, _ = engines
    rng = random.Random(13 if fault == "down" else 14)
    p = prompt(rng, 4)
    cold = await complete(a, p)
    with contextlib.ExitStack() as stack:
        url = f"http://{LOOPBACK}:{free_port()}" if fault == "down" else stack.enter_context(black_hole())
        lonely = VllmServer(kv_blocks=64, connector=connector_config(url, model="cachemesh-tiny"))
        await asyncio.to_thread(lonely.start)
        stack.callback(lonely.stop)
        outputs = [await complete(lonely, p) for _ in range(3)]
        hits = await asyncio.to_thread(metric, lonely, EXTERNAL_HITS)
    assert outputs == [cold] * 3 and hits == 0


async def counted(engine: VllmServer, name: str, at_least: float) -> float:
    """Until the engine's metric `name` reaches `at_least` (connector stats arrive with a step's output)."""
    for _ in range(300):
        value = await asyncio.to_thread(metric, engine, name)
        if value >= at_least:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name} stayed below {at_least}")


async def test_a_block_of_another_shape_is_a_load_error_and_recomputed(node, engines) -> None:
    a, b = engines
    rng = random.Random(15)
    p = prompt(rng, 3)
    cold = await complete(a, p)
    await saved(node, p)
    keys = block_keys(p, model="cachemesh-tiny", block_size=BLOCK_SIZE)
    # Block 1 replaced by a value of the right model and size but the wrong place in the prompt and
    # other bytes: the node holds "it", the connector must refuse it.
    async with httpx.AsyncClient(base_url=node.api_url) as client:
        header, array = codec.decode((await client.get(f"/v1/values/{keys[1]}")).content)
        forged = codec.encode(
            np.ascontiguousarray(array[::-1]),
            kind="kv_block",
            model=header.model,
            layer_range=header.layer_range,
            token_range=(0, BLOCK_SIZE),
            dtype=header.dtype,
        )
        response = await client.put(
            f"/v1/values/{keys[1]}", content=forged, headers={"Content-Type": codec_media()}
        )
        assert response.status_code == 201
    errors = await asyncio.to_thread(metric, b, "vllm:cachemesh_load_errors_total")
    assert await complete(b, p) == cold
    await counted(b, "vllm:cachemesh_load_errors_total", errors + 1)


def codec_media() -> str:
    from cachemesh_client import VALUE_MEDIA_TYPE

    return VALUE_MEDIA_TYPE


async def test_blocks_the_node_cannot_send_are_recomputed(kafka, node, engines, module_namespace) -> None:
    a, _ = engines
    rng = random.Random(16)
    q = prompt(rng, 3)
    cold = await complete(a, q)
    await saved(node, q)
    # A node sharing L3 whose responses are too small for one block: it reports the prefix held and
    # cannot send it.
    # Its pool is private (no shared segment to copy from): the blocks must come over HTTP.
    tight = node_settings_for(
        kafka,
        node.pg_settings,  # type: ignore[attr-defined]
        module_namespace,
        "tight",
        max_request_bytes=4096,
        l2_shared_memory=False,
    )
    async with running(tight) as narrow:
        lone = VllmServer(
            kv_blocks=64,
            connector=connector_config(narrow.api_url, model="cachemesh-tiny", lookup_timeout_ms=LOOKUP_MS),
        )
        await asyncio.to_thread(lone.start)
        try:
            assert await held(narrow, q) == 3
            assert await complete(lone, q) == cold
            await counted(lone, "vllm:cachemesh_load_errors_total", 1)
        finally:
            await asyncio.to_thread(lone.stop)


async def test_other_weights_under_the_same_name_never_load_the_old_blocks(node, engines) -> None:
    a, _ = engines
    rng = random.Random(17)
    p = prompt(rng, 3)
    cold_a = await complete(a, p)
    await saved(node, p)
    old = await block_tags(node, p)
    assert len(old) == 1 and next(iter(old)).startswith("cachemesh-tiny#")
    # The same served name and block keys, other weights (a new revision deployed under the old name).
    config = connector_config(node.api_url, model="cachemesh-tiny", lookup_timeout_ms=LOOKUP_MS)
    revised = VllmServer(TINY_REVISED, kv_blocks=64, connector=config)
    await asyncio.to_thread(revised.start)
    try:
        before = await asyncio.to_thread(metric, revised, EXTERNAL_HITS)
        cold_revised = await complete(revised, p)  # the old weights' blocks are not its blocks
        assert await asyncio.to_thread(metric, revised, EXTERNAL_HITS) == before
        assert cold_revised != cold_a, "other weights answer otherwise (or this test shows nothing)"
        # Its own blocks replace the old ones as they are saved; it then loads its own ...
        await until_retagged(node, p, old)
        await asyncio.to_thread(revised.reset_prefix_cache)
        assert await complete(revised, p) == cold_revised
        assert await asyncio.to_thread(metric, revised, EXTERNAL_HITS) - before == 3 * BLOCK_SIZE
    finally:
        await asyncio.to_thread(revised.stop)
    # ... and the old weights find nothing of theirs left to load.
    await asyncio.to_thread(a.reset_prefix_cache)
    before = await asyncio.to_thread(metric, a, EXTERNAL_HITS)
    assert await complete(a, p) == cold_a
    assert await asyncio.to_thread(metric, a, EXTERNAL_HITS) == before


async def block_tags(node: TiersService, tokens: list[int]) -> set[str]:
    """The model tags (name#weights) of the node's blocks of `tokens`."""
    keys = block_keys(tokens, model="cachemesh-tiny", block_size=BLOCK_SIZE)
    async with httpx.AsyncClient(base_url=node.api_url) as client:
        return {codec.decode((await client.get(f"/v1/values/{k}")).content)[0].model for k in keys}


async def until_retagged(node: TiersService, tokens: list[int], old: set[str]) -> None:
    """Until every block of `tokens` on the node is of other weights than `old`."""
    for _ in range(600):
        tags = await block_tags(node, tokens)
        if len(tags) == 1 and not tags & old:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the node's blocks are tagged {tags}, were {old}")
