"""The partition proxy (infra/tcp_proxy.py) over real sockets: it forwards, a cut is a black hole (bytes
sent either way go nowhere, the connection stays open), and after a heal the old connections are gone
and new ones forward again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from infra.paths import free_port
from infra.tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration


@pytest.fixture
async def echo() -> AsyncIterator[str]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()


async def roundtrip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes, timeout_s: float = 5
) -> bytes:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), timeout_s)


async def test_a_cut_is_a_black_hole_and_a_heal_starts_afresh(echo: str) -> None:
    with TcpProxy(free_port(), echo) as proxy:
        host, port = proxy.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        assert await roundtrip(reader, writer, b"ping") == b"ping"
        proxy.cut()
        with pytest.raises(TimeoutError):  # nothing comes back, nor does the connection fail
            await roundtrip(reader, writer, b"lost", timeout_s=0.5)
        cut_reader, cut_writer = await asyncio.open_connection(host, int(port))  # accepted, unanswered
        with pytest.raises(TimeoutError):
            await roundtrip(cut_reader, cut_writer, b"lost", timeout_s=0.5)
        await asyncio.to_thread(proxy.heal)
        assert await asyncio.wait_for(reader.read(), 5) == b"", "the connection open across the cut is closed"
        reader, writer = await asyncio.open_connection(host, int(port))
        assert await roundtrip(reader, writer, b"pong") == b"pong"
        writer.close()
