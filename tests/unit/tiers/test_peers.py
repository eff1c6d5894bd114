"""Reading other nodes' L2 (peers.py) over the in-process block channel: hits come back byte for byte
with their descriptors, blocks changed between FIND and READ read as stale misses, and a failing peer
is a counted miss that is skipped until its retry time (injected clock; no sockets, no sleeps)."""

from __future__ import annotations

import numpy as np
import pytest

from services.tiers.entry import Entry, EntryMeta
from services.tiers.l2.block_pool import BlockPool
from services.tiers.l2.net.frames import RdmaUnavailable
from services.tiers.l2.net.peers import L2Peers
from services.tiers.l2.net.rdma import rdma_available
from services.tiers.l2.net.transport import BlockTransport, LocalBlockClient, TcpBlockClient
from services.tiers.l2.store import L2Store
from services.tiers.settings import parse_peer, parse_peers
from tests.unit.tiers.fakes import Clock


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("127.0.0.1:8701", ("127.0.0.1", 8701)),
        (" node-b.cache:9 ", ("node-b.cache", 9)),
        ("[::1]:8701", ("::1", 8701)),
    ],
)
def test_parse_peer(text: str, parsed: tuple[str, int]) -> None:
    assert parse_peer(text) == parsed


@pytest.mark.parametrize("text", ["host", ":80", "host:", "host:0", "host:70000", "host:http"])
def test_bad_peers_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="peer"):
        parse_peer(text)


def test_parse_peers_normalises_and_drops_duplicates() -> None:
    assert parse_peers("a:1, b:2,,a:1,[::1]:3") == ("a:1", "b:2", "[::1]:3")
    assert parse_peers(["a:1"]) == ("a:1",)


class Node:
    """Another node's L2, reachable through the in-process channel (or not, when `down`)."""

    def __init__(self) -> None:
        self.pool = BlockPool(4, xp=np)
        self.store = L2Store(self.pool, dim=4)
        self.down = False
        self.clients: list[LocalBlockClient] = []

    def put(self, key: str, size: int, **meta: object) -> Entry:
        blob = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
        entry = Entry(EntryMeta(key=key, kind="kv_block", model="m", **meta), blob)  # type: ignore[arg-type]
        assert self.store.put(entry)
        return entry

    async def connect(self) -> BlockTransport:
        if self.down:
            raise ConnectionRefusedError("connection refused")
        client = LocalBlockClient(self.pool, directory=self.store, writable=False)
        self.clients.append(client)
        return client


def peers_of(nodes: dict[str, Node], clock: Clock) -> L2Peers:
    async def connect(host: str, port: int) -> BlockTransport:
        return await nodes[f"{host}:{port}"].connect()

    return L2Peers(
        list(nodes), timeout_s=1.0, retry_after_ms=2000, clock=lambda: clock.ms / 1000, connect=connect
    )


async def test_a_peer_serves_what_its_l2_holds() -> None:
    a, b = Node(), Node()
    clock = Clock()
    peers = peers_of({"a:1": a, "b:2": b}, clock)
    emb = np.array([0, 1, 0, 0], dtype=np.float32)
    on_a = a.put("x", 5000, embedding=emb, trace_id="conv")
    on_b = b.put("y", 10)
    b.put("x", 7)  # both hold x: the first configured peer serves it
    got = await peers.fetch_many(["x", "y", "z"])
    assert set(got) == {"x", "y"}
    assert got["x"].peer == "a:1" and got["x"].entry.blob == on_a.blob
    assert got["x"].entry.meta.trace_id == "conv"
    np.testing.assert_array_equal(got["x"].entry.meta.embedding, emb)
    assert got["y"].entry.blob == on_b.blob and got["y"].peer == "b:2"
    assert await peers.fetch("z") is None
    stats = peers.stats()
    assert stats["peer_totals"]["hits"] == 3 and stats["peer_totals"]["misses"] == 5  # per peer and key
    assert len(a.clients) == 1, "one connection per peer, reused"
    assert a.clients[0].requests["FIND"] == 4 and a.clients[0].requests["READ"] == 3


async def test_blocks_changed_between_find_and_read_are_stale_misses() -> None:
    a = Node()
    peers = peers_of({"a:1": a}, Clock())
    a.put("x", 300)
    loc = a.store.locate("x")
    assert loc is not None
    a.pool.buffer[loc.spans[0].block_id * 256] ^= 0xFF  # rewritten in place: the crc32 no longer matches
    assert await peers.fetch("x") is None
    assert peers.stats()["peers"][0]["stale"] == 1


async def test_a_failing_peer_is_a_miss_then_skipped_until_its_retry_time() -> None:
    a, b = Node(), Node()
    clock = Clock()
    peers = peers_of({"a:1": a, "b:2": b}, clock)
    b.put("x", 10)
    a.down = True
    assert (await peers.fetch("x")).peer == "b:2"  # type: ignore[union-attr]
    row = peers.stats()["peers"][0]
    assert row["errors"] == 1 and row["state"] == "backing_off" and "refused" in row["last_error"]
    await peers.fetch("x")
    assert peers.stats()["peers"][0]["skipped"] == 1  # not asked again while backing off
    a.down = False
    a.put("only-a", 20)
    clock.advance(2001)
    assert (await peers.fetch("only-a")).peer == "a:1"  # type: ignore[union-attr]
    assert peers.stats()["peers"][0]["state"] == "connected"


async def test_a_peer_that_breaks_mid_exchange_is_dropped_and_reconnected() -> None:
    a = Node()
    clock = Clock()
    peers = peers_of({"a:1": a}, clock)
    a.put("x", 10)
    assert await peers.fetch("x") is not None

    async def broken(keys: object) -> object:
        raise ConnectionResetError("reset by peer")

    a.clients[0].find_many = broken  # type: ignore[assignment, method-assign]
    assert await peers.fetch("x") is None
    assert peers.stats()["peers"][0]["errors"] == 1
    clock.advance(2001)
    assert await peers.fetch("x") is not None and len(a.clients) == 2
    await peers.close()


@pytest.mark.skipif(rdma_available(), reason="an RDMA device exists here")
async def test_without_a_device_auto_reads_over_tcp_and_rdma_refuses() -> None:
    auto = await L2Peers(["h:1"], transport="auto")._open("h", 1)
    assert isinstance(auto, TcpBlockClient) and not auto.connected  # nothing dialled yet
    with pytest.raises(RdmaUnavailable):
        await L2Peers(["h:1"], transport="rdma")._open("h", 1)
