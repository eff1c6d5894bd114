"""The KV-block prefix routes on real tier nodes (Kafka, Postgres L3, a peer's L2 over TCP): a slice of the
Mooncake dev trace replayed through node A's API, blocks put as the simulator's prefix replay inserts
them: for every request the longest prefix A reports equals the replay's prefix hit, and the batch fetch
returns the blocks byte for byte; node B, which reads A's L2 as a peer, finds the same chains and names
where each block is."""

from __future__ import annotations

import uuid

import pytest

from services.tiers.edge.client import AsyncTiersClient
from tests.integration.nodes import running
from tests.prefix_trace import MODEL, block_key, block_value, chains, replay_prefix_hits, requests

pytestmark = pytest.mark.integration


async def test_prefix_lookup_over_the_mooncake_chains(kafka, topics_on, node_settings) -> None:
    await topics_on(kafka)
    run = uuid.uuid4().hex[:8] + "/"
    trace = requests(3950, 30)  # 30 requests, 882 distinct blocks, 13 of them with a prefix hit
    expected = replay_prefix_hits(trace)
    async with running(node_settings("a", l2_pages=2048)) as a, AsyncTiersClient(a.api_url) as ca:
        assert a.block_server is not None
        stored: set[int] = set()
        reported = []
        for chain in chains(trace):
            keys = [block_key(b, run) for b in chain]
            got = await ca.prefix(keys, model=MODEL)
            reported.append(got.prefix_blocks)
            if got.prefix_blocks:
                fetched = await ca.fetch_blocks(keys[: got.prefix_blocks], model=MODEL)
                assert [f.value for f in fetched] == [block_value(b) for b in chain[: got.prefix_blocks]]
                assert {(b.node, b.remote) for b in got.blocks} == {(a.settings.node_id, False)}
            for b in chain:  # every block of the request resident afterwards, as in the replay
                if b not in stored:
                    await ca.put_blob(block_key(b, run), block_value(b))
                    stored.add(b)
        assert reported == expected
        assert sum(1 for n in expected if n) == 13

        # Another node, reading A's L2 as a peer and sharing L3: the whole of a chain, and where it is.
        longest = max(chains(trace), key=len)
        keys = [block_key(b, run) for b in longest]
        async with (
            running(node_settings("b", l2_peers=a.block_server.address)) as b,
            AsyncTiersClient(b.api_url) as cb,
        ):
            got = await cb.prefix(keys, model=MODEL, block_size_tokens=512)
            assert got.prefix_blocks == len(keys) and got.prefix_tokens == 512 * len(keys)
            where = {(blk.tier, blk.node, blk.remote) for blk in got.blocks}
            assert where <= {("l2", a.block_server.address, True), ("l3", b.settings.node_id, False)}
            fetched = await cb.fetch_blocks(keys, model=MODEL)
            assert [f.value for f in fetched] == [block_value(blk) for blk in longest]
