"""The block transport over real loopback sockets, against a numpy-backed pool: the TCP ops, FIND against
an L2 store on a read-only server, peers that time out, the RDMA handshake through the real server (data
over the in-memory fabric), and, where a device exists, RDMA with pyverbs end to end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from services.tiers.codec import decode, encode
from services.tiers.entry import Entry, EntryMeta
from services.tiers.l2.block_pool import BlockPool
from services.tiers.l2.net.frames import (
    FRAME_HEADER,
    ConnectionClosed,
    RemoteError,
    Status,
    decode_frame_header,
)
from services.tiers.l2.net.peers import L2Peers
from services.tiers.l2.net.rdma import PyverbsExporter, RdmaBlockTransport, rdma_available
from services.tiers.l2.net.transport import TcpBlockClient, TcpBlockServer
from services.tiers.l2.store import L2Store
from tests.integration.nodes import until
from tests.unit.tiers.fakes import MemoryEndpoint, MemoryExporter, MemoryFabric

pytestmark = pytest.mark.integration


@pytest.fixture
async def server() -> AsyncIterator[TcpBlockServer]:
    async with TcpBlockServer(BlockPool(8, xp=np), max_frame_bytes=4096) as srv:
        yield srv


async def test_allocate_write_read_free(server: TcpBlockServer) -> None:
    async with TcpBlockClient("127.0.0.1", server.port) as client:
        block = await client.allocate(5)
        await client.write(block, b"hello")
        assert await client.read(block) == b"hello"
        assert server.pool.read_bytes(block) == b"hello"
        await client.acquire(block)
        with pytest.raises(RemoteError, match="reference") as exc:
            await client.free(block)
        assert exc.value.status is Status.BLOCK_STATE
        await client.release(block)
        await client.free(block)
        with pytest.raises(RemoteError) as exc:
            await client.read(block)
        assert exc.value.status is Status.BLOCK_STATE


async def test_read_many_pipelines_in_order(server: TcpBlockServer) -> None:
    async with TcpBlockClient("127.0.0.1", server.port) as client:
        blocks = [await client.allocate(100 * (i + 1)) for i in range(6)]
        for i, b in enumerate(blocks):
            await client.write(b, bytes([i]) * 100 * (i + 1))
        got = await client.read_many(blocks)
        assert got == [bytes([i]) * 100 * (i + 1) for i in range(6)]


async def test_a_kv_value_travels_through_the_codec(server: TcpBlockServer) -> None:
    kv = np.arange(2 * 4 * 16, dtype=np.float16).reshape(2, 4, 16)
    value = encode(kv, kind="kv_block", model="llama-7b", layer_range=(0, 1), token_range=(0, 16))
    async with TcpBlockClient("127.0.0.1", server.port) as client:
        block = await client.allocate(len(value))
        await client.write(block, value)
        header, out = decode(await client.read(block))
    assert header.token_range == (0, 16)
    np.testing.assert_array_equal(out, kv)


async def test_concurrent_clients_do_not_interfere(server: TcpBlockServer) -> None:
    async def worker(i: int) -> bytes:
        async with TcpBlockClient("127.0.0.1", server.port) as client:
            block = await client.allocate(64)
            await client.write(block, bytes([i]) * 64)
            await asyncio.sleep(0)
            return await client.read(block)

    results = await asyncio.gather(*(worker(i) for i in range(8)))
    assert results == [bytes([i]) * 64 for i in range(8)]


async def test_concurrent_calls_on_one_client_are_serialised(server: TcpBlockServer) -> None:
    async with TcpBlockClient("127.0.0.1", server.port) as client:
        blocks = await asyncio.gather(*(client.allocate(10) for _ in range(10)))
        assert len(set(blocks)) == 10


async def test_oversize_frame_is_refused_and_the_client_recovers(server: TcpBlockServer) -> None:
    async with TcpBlockClient("127.0.0.1", server.port, max_frame_bytes=1 << 20) as client:
        block = await client.allocate(2048)
        with pytest.raises(RemoteError) as exc:
            await client.write(block, b"x" * 5000)  # over the server's 4096 byte frame limit
        assert exc.value.status is Status.FRAME_TOO_LARGE
        # The server hung up on the desynchronised stream; the next call reconnects.
        await client.write(block, b"ok")
        assert (await client.read(block))[:2] == b"ok"


async def test_client_checks_its_own_frame_limit(server: TcpBlockServer) -> None:
    async with TcpBlockClient("127.0.0.1", server.port, max_frame_bytes=16) as client:
        with pytest.raises(Exception, match="exceeds the limit"):
            await client.write(0, b"x" * 17)


async def test_pool_exhaustion_is_reported(server: TcpBlockServer) -> None:
    async with TcpBlockClient("127.0.0.1", server.port) as client:
        for _ in range(8 * 8):
            await client.allocate(2048)
        with pytest.raises(RemoteError) as exc:
            await client.allocate(2048)
        assert exc.value.status is Status.EXHAUSTED


async def test_garbage_gets_an_error_frame_then_eof(server: TcpBlockServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    raw = await asyncio.wait_for(reader.readexactly(FRAME_HEADER.size), 5)
    _, status, _, _, length = decode_frame_header(raw, 4096)
    assert status is Status.BAD_REQUEST
    assert b"magic" in await reader.readexactly(length)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await writer.wait_closed()


async def test_server_stop_closes_clients() -> None:
    srv = TcpBlockServer(BlockPool(1, xp=np))
    await srv.start()
    client = TcpBlockClient("127.0.0.1", srv.port, timeout_s=2)
    await client.connect()
    await client.allocate(10)
    await srv.stop()
    with pytest.raises((ConnectionClosed, ConnectionError, OSError)):
        await client.allocate(10)
    await client.close()


def kv_entry(key: str, size: int) -> Entry:
    blob = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    return Entry(EntryMeta(key=key, kind="kv_block", model="m"), blob)


async def test_find_and_gather_on_a_read_only_server() -> None:
    pool = BlockPool(8, xp=np)
    store = L2Store(pool)
    entries = [kv_entry(f"k{i}", 100 + 3000 * i) for i in range(5)]
    for e in entries:
        store.put(e)
    async with (
        TcpBlockServer(pool, directory=store, writable=False) as server,
        TcpBlockClient("127.0.0.1", server.port) as client,
    ):
        found = await client.find_many([e.key for e in entries] + ["absent"])
        assert found[-1] is None
        blobs = await client.gather([loc.spans for loc in found[:-1]])  # type: ignore[union-attr]
        assert blobs == [e.blob for e in entries]
        with pytest.raises(RemoteError) as exc:
            await client.write(found[0].spans[0].block_id, b"overwrite")  # type: ignore[union-attr]
        assert exc.value.status is Status.REFUSED
        assert server.requests["FIND"] == 6 and server.requests["WRITE"] == 1
    assert store.get("k0") is not None and store.get("k0").blob == entries[0].blob  # type: ignore[union-attr]


async def test_more_requests_than_one_pipeline_chunk() -> None:
    pool = BlockPool(8, xp=np)
    store = L2Store(pool)
    keys = [f"k{i}" for i in range(300)]
    for k in keys[:200]:
        store.put(kv_entry(k, 20))
    async with (
        TcpBlockServer(pool, directory=store) as server,
        TcpBlockClient("127.0.0.1", server.port) as client,
    ):
        found = await client.find_many(keys)
        assert sum(f is not None for f in found) == 200


async def test_a_block_server_with_a_token_serves_only_connections_that_sent_it() -> None:
    pool = BlockPool(8, xp=np)
    async with TcpBlockServer(pool, token=b"mesh-secret") as server:
        async with TcpBlockClient("127.0.0.1", server.port, token=b"mesh-secret") as client:
            block = await client.allocate(5)
            await client.write(block, b"hello")
            assert await client.read(block) == b"hello"
        anonymous = TcpBlockClient("127.0.0.1", server.port)
        with pytest.raises(RemoteError) as exc:
            await anonymous.read(block)
        assert exc.value.status is Status.UNAUTHORIZED
        await anonymous.close()
        wrong = TcpBlockClient("127.0.0.1", server.port, token=b"guess")
        with pytest.raises(RemoteError) as exc:
            await wrong.connect()
        assert exc.value.status is Status.UNAUTHORIZED and not wrong.connected
        await until(lambda: server.connections == 0)
        assert server.requests["READ"] == 2  # the refused READ was counted, not served
        assert pool.read_bytes(block) == b"hello"


async def test_peers_read_a_token_server_only_with_the_token() -> None:
    pool = BlockPool(8, xp=np)
    store = L2Store(pool)
    entry = kv_entry("k", 300)
    store.put(entry)
    async with TcpBlockServer(pool, directory=store, writable=False, token=b"mesh-secret") as server:
        address = f"127.0.0.1:{server.port}"
        outsider = L2Peers([address], timeout_s=1.0, retry_after_ms=60_000)
        assert await outsider.fetch_many(["k"]) == {}
        await outsider.close()
        member = L2Peers([address], timeout_s=1.0, token=b"mesh-secret")
        hits = await member.fetch_many(["k"])
        assert hits["k"].entry.blob == entry.blob
        await member.close()


async def test_a_peer_that_accepts_but_never_answers_times_out_fast_and_is_skipped() -> None:
    accepted = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read()  # swallow requests, answer nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        peers = L2Peers([f"127.0.0.1:{port}"], timeout_s=0.05, retry_after_ms=60_000)
        async with asyncio.timeout(5):  # generous: the 0.05 s timeout fired rather than a hang
            assert await peers.fetch_many(["k"]) == {}
        row = peers.stats()["peers"][0]
        assert row["timeouts"] == 1 and row["state"] == "backing_off"
        connections = len(accepted)
        assert await peers.fetch("k") is None
        assert peers.stats()["peers"][0]["skipped"] == 1
        assert len(accepted) == connections, "a peer backing off is not even dialled"
        await peers.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_rdma_handshake_travels_the_real_tcp_channel_and_ends_with_the_connection() -> None:
    pool = BlockPool(4, xp=np)
    store = L2Store(pool)
    entry = kv_entry("k", 5000)
    store.put(entry)
    fabric = MemoryFabric()
    exporter = MemoryExporter(fabric, pool)
    async with TcpBlockServer(pool, directory=store, writable=False, rdma=exporter) as server:
        transport = RdmaBlockTransport(TcpBlockClient("127.0.0.1", server.port), MemoryEndpoint(fabric))
        loc = await transport.find("k")
        assert loc is not None
        assert await transport.gather([loc.spans]) == [entry.blob]
        assert server.requests["HELLO"] == 1 and server.requests["READ"] == 0
        assert len(fabric.sessions) == 1
        await transport.close()
        await until(lambda: not fabric.sessions, timeout_s=5)  # the server tore its queue pair down


@pytest.mark.rdma
@pytest.mark.skipif(not rdma_available(), reason="needs an RDMA device (pyverbs)")
async def test_rdma_with_pyverbs_reads_and_writes_a_served_pool() -> None:
    pool = BlockPool(8, xp=np)
    store = L2Store(pool)
    entry = kv_entry("kv", 6000)
    store.put(entry)
    exporter = PyverbsExporter(pool, writable=True)
    try:
        async with TcpBlockServer(pool, directory=store, rdma=exporter) as server:
            transport = RdmaBlockTransport.over_tcp("127.0.0.1", server.port)
            try:
                loc = await transport.find("kv")
                assert loc is not None
                assert await transport.gather([loc.spans]) == [entry.blob]
                block = await transport.allocate(1000)
                await transport.write(block, b"r" * 1000)
                assert pool.read_bytes(block) == b"r" * 1000
                assert await transport.read(block) == b"r" * 1000
                assert server.requests["READ"] == 0 and server.requests["WRITE"] == 0
            finally:
                await transport.close()
    finally:
        exporter.close()
