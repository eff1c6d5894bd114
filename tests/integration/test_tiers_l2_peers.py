"""L2 shared between tier nodes, end to end: two nodes in this process on the real Apache Kafka and
Postgres, each serving its L2 pool on its own block port; node B is given A's as a peer.

- A value put on A is served to B from A's L2 over TCP: its L3 row is deleted first (the value lives
  only in A's memory) and B's L3 circuit breaker records no call; the lookup says tier l2, remote, and
  A's address. B promotes it: the next lookup is B's own L1. Batch lookups go the same way.
- B survives A going away: lookups fall through to L3 (or miss) quickly, the failure is counted, the
  dead peer is skipped while it backs off, and B stays healthy.
- With an `api_token`, A's block port serves only peers that send the same token: a node with another
  token gets no remote hit (the refusal is counted as a peer error) and A serves it nothing.
"""

from __future__ import annotations

import contextlib
import uuid

import asyncpg
import httpx
import numpy as np
import pytest
from pydantic import SecretStr

from services.tiers.edge.client import AsyncTiersClient, LookupRequest
from tests.integration.nodes import running

pytestmark = pytest.mark.integration


async def test_node_b_reads_node_a_l2_and_survives_a_going_away(
    kafka, topics_on, node_settings, postgres
) -> None:
    await topics_on(kafka)
    run = uuid.uuid4().hex[:8]
    keys = {name: f"{name}-{run}" for name in ("only-a", "batch-1", "batch-2", "in-l3", "after")}
    kv = np.arange(3 * 1024, dtype=np.float16).reshape(3, 1024)  # 6 KB: three 2 KB blocks
    async with contextlib.AsyncExitStack() as a_stack:
        a = await a_stack.enter_async_context(running(node_settings("a", l2_peer_timeout_ms=200)))
        assert a.block_server is not None and a.cache is not None and a.cache.l2 is not None
        a_blocks = a.block_server.address
        b_settings = node_settings("b", l2_peers=f"{a_blocks},127.0.0.1:1", l2_peer_timeout_ms=200)
        async with (
            running(b_settings) as b,
            AsyncTiersClient(a.api_url) as ca,
            AsyncTiersClient(b.api_url) as cb,
        ):
            assert b.cache is not None and b.peers is not None
            assert b.peers.addresses == [a_blocks, "127.0.0.1:1"]  # the second is never up
            await ca.put(keys["only-a"], kv, model="llama", layer_range=(0, 3), token_range=(0, 1024))
            for name in ("batch-1", "batch-2", "in-l3"):
                await ca.put(keys[name], f"answer {name}", model="llama", semantic_tags={"n": name})
            # Leave the values only in A's memory: no L3 row for B to fall back on.
            conn = await asyncpg.connect(postgres.dsn)
            try:
                gone = [keys["only-a"], keys["batch-1"], keys["batch-2"]]
                await conn.execute("DELETE FROM cache_descriptors WHERE key = ANY($1::text[])", gone)
            finally:
                await conn.close()
            l3_calls = b.cache.breaker.stats().calls_in_window

            got = await cb.get(keys["only-a"])
            assert (got.hit, got.tier, got.remote) == (True, "l2", True)
            assert got.descriptor["key"] == keys["only-a"]
            np.testing.assert_array_equal(got.value, kv)
            assert b.cache.breaker.stats().calls_in_window == l3_calls, "B never asked L3"
            assert a.block_server.requests["FIND"] >= 1 and a.block_server.requests["READ"] >= 3
            assert a.cache.l2.stats().served_remote >= 1

            again = await cb.get(keys["only-a"])
            assert (again.tier, again.remote) == ("l2", False)  # promoted into B's L2 (KV lives in L2)
            assert b.cache.l2 is not None and keys["only-a"] in b.cache.l2

            batch = await cb.lookup_many(
                [LookupRequest(key=keys["batch-1"]), LookupRequest(key=keys["batch-2"], model="llama")]
            )
            assert [(r.tier, r.remote, r.value) for r in batch] == [
                ("l2", True, "answer batch-1"),
                ("l2", True, "answer batch-2"),
            ]
            assert batch[0].descriptor["semantic_tags"] == {"n": "batch-1"}
            assert b.cache.breaker.stats().calls_in_window == l3_calls

            async with httpx.AsyncClient(base_url=b.api_url) as http:
                stats = (await http.get("/v1/stats")).json()
                assert (await http.get("/healthz")).json()["l2_blocks"] == b.block_server.address  # type: ignore[union-attr]
            remote = stats["l2_remote"]
            assert remote["serving"] == b.block_server.address  # type: ignore[union-attr]
            assert remote["hits"] == 3 and stats["hits_by_tier"]["l2:exact:remote"] == 3
            by_peer = {p["address"]: p for p in remote["peers"]}
            assert by_peer[a_blocks]["hits"] == 3 and by_peer[a_blocks]["transport"] == "tcp"
            assert by_peer["127.0.0.1:1"]["errors"] == 1  # refused at once, then backing off
            health = await a.health()
            assert health["l2_blocks"]["address"] == a_blocks and health["healthy"]

            # --- A goes away -------------------------------------------------------------------
            await a_stack.aclose()
            # A dead peer costs one failed exchange, then it is skipped (how long that takes: bench/).
            from_l3 = await cb.get(keys["in-l3"])
            assert (from_l3.hit, from_l3.tier, from_l3.remote) == (True, "l3", False)
            assert by_peer_now(b)[a_blocks]["errors"] == 1
            assert not (await cb.get(keys["after"])).hit
            assert by_peer_now(b)[a_blocks]["skipped"] >= 1  # backing off: not even asked
            assert by_peer_now(b)[a_blocks]["errors"] == 1
            assert (await cb.get(keys["only-a"])).tier == "l2"  # what B promoted stays served
            health = await b.health()
            assert health["healthy"] and health["l2_blocks"]["peers"] == [a_blocks, "127.0.0.1:1"]


async def test_the_mesh_token_guards_the_block_port(kafka, topics_on, node_settings, postgres) -> None:
    await topics_on(kafka)
    run = uuid.uuid4().hex[:8]
    key, mesh, other = f"guarded-{run}", f"mesh-{run}", f"other-{run}"
    async with running(node_settings("a", api_token=SecretStr(mesh))) as a:
        assert a.block_server is not None
        blocks = a.block_server.address
        async with (
            running(node_settings("b", api_token=SecretStr(mesh), l2_peers=blocks)) as b,
            running(node_settings("c", api_token=SecretStr(other), l2_peers=blocks)) as c,
            AsyncTiersClient(a.api_url, token=mesh) as ca,
            AsyncTiersClient(b.api_url, token=mesh) as cb,
            AsyncTiersClient(c.api_url, token=other) as cc,
        ):
            await ca.put(key, "only in A's memory", model="llama")
            conn = await asyncpg.connect(postgres.dsn)
            try:
                await conn.execute("DELETE FROM cache_descriptors WHERE key = $1", key)
            finally:
                await conn.close()
            finds = a.block_server.requests["FIND"]
            outsider = await cc.get(key)
            assert not outsider.hit
            assert by_peer_now(c)[blocks]["errors"] == 1
            assert a.block_server.requests["AUTH"] >= 1
            assert a.block_server.requests["FIND"] == finds, "the outsider never got past AUTH"
            member = await cb.get(key)
            assert (member.hit, member.tier, member.remote, member.value) == (
                True,
                "l2",
                True,
                "only in A's memory",
            )


def by_peer_now(node) -> dict[str, dict]:  # type: ignore[no-untyped-def, type-arg]
    return {p["address"]: p for p in node.cache.stats()["l2_remote"]["peers"]}
