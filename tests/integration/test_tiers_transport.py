"""The TCP block transport over real loopback sockets, against a numpy-backed pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from services.tiers.block_pool import BlockPool
from services.tiers.codec import decode, encode
from services.tiers.transport import (
    FRAME_HEADER,
    ConnectionClosed,
    RemoteError,
    Status,
    TcpBlockClient,
    TcpBlockServer,
    decode_frame_header,
)

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
