"""Garbage on the L2 block port (a node's read-only `TcpBlockServer` over its L2 store, real loopback
sockets): random bytes, wrong magic, unknown ops, oversized length prefixes, truncated frames, a client
that stalls half way through a frame (slowloris) and one that never reads its answers. Each bad connection
is closed; the server lives on, and a good client's FIND + READ works during and after each."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

import numpy as np
import pytest

from services.tiers.entry import Entry, EntryMeta
from services.tiers.l2.block_pool import BlockPool
from services.tiers.l2.net.frames import FRAME_HEADER, MAGIC, Frame, Op, Status, encode_frame
from services.tiers.l2.net.transport import TcpBlockClient, TcpBlockServer
from services.tiers.l2.store import L2Store
from tests.integration.nodes import until

pytestmark = pytest.mark.integration

STALL_S = 0.3
RNG = np.random.default_rng(15)
ENTRY = Entry(
    EntryMeta(key="good", kind="kv_block", model="m"), RNG.integers(0, 256, 5000, np.uint8).tobytes()
)


def header(
    *,
    magic: bytes = MAGIC,
    op: int = Op.READ,
    status: int = 0,
    request_id: int = 1,
    block_id: int = 0,
    length: int = 0,
) -> bytes:
    return struct.pack("<4sBBHIQI", magic, op, status, 0, request_id, block_id, length)


GARBAGE: dict[str, bytes] = {
    **{
        f"random {n} bytes": RNG.integers(0, 256, n, np.uint8).tobytes()
        for n in (1, 23, 24, 25, 4096, 70_000)
    },
    "wrong magic": header(magic=b"HTTP"),
    "wrong version": header(magic=b"CMB2"),
    "http request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "unknown op": header(op=200),
    "unknown status": header(status=200),
    "oversized length": header(length=0xFFFFFFFF),
    "length past the limit": header(op=Op.FIND, length=4097),
    "truncated header": header()[:12],
    "truncated payload": header(op=Op.FIND, length=100) + b"k" * 50,
}
# Well-framed requests the server refuses: answered with an error status, the connection kept (the
# stream is still in step).
REFUSED: dict[str, tuple[bytes, Status]] = {
    "bad FIND key": (header(op=Op.FIND, length=2) + b"\xff\xfe", Status.BAD_REQUEST),
    "READ of a block that is not one": (header(block_id=2**63), Status.BLOCK_STATE),
    "ALLOCATE on a read-only port": (header(op=Op.ALLOCATE, length=4) + b"\x10\x00\x00\x00", Status.REFUSED),
    "HELLO without RDMA": (header(op=Op.HELLO, length=3) + b"abc", Status.UNSUPPORTED),
}


@pytest.fixture
async def port() -> AsyncIterator[tuple[TcpBlockServer, TcpBlockClient]]:
    pool = BlockPool(16, xp=np)
    store = L2Store(pool)
    assert store.put(ENTRY)
    server = TcpBlockServer(
        pool, directory=store, writable=False, max_frame_bytes=4096, stall_timeout_s=STALL_S
    )
    async with server, TcpBlockClient("127.0.0.1", server.port, timeout_s=5) as good:
        yield server, good


async def fetch_works(good: TcpBlockClient) -> None:
    located = await good.find("good")
    assert located is not None
    assert await good.gather([located.spans]) == [ENTRY.blob]


async def closed_by_server(reader: asyncio.StreamReader, within_s: float = 5.0) -> bytes:
    """Everything the server sent until it hung up (fails if it does not hang up)."""
    got = b""
    async with asyncio.timeout(within_s):
        while chunk := await reader.read(65536):
            got += chunk
    return got


@pytest.mark.parametrize("name", list(GARBAGE))
async def test_garbage_closes_that_connection_only(
    port: tuple[TcpBlockServer, TcpBlockClient], name: str
) -> None:
    server, good = port
    await fetch_works(good)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(GARBAGE[name])
    await writer.drain()
    if name.startswith("truncated"):
        writer.write_eof()  # the peer goes away mid-frame
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        answer = await closed_by_server(reader, within_s=STALL_S + 5)
    writer.close()
    if answer[:4] == MAGIC:  # what it said before hanging up is a well-formed frame
        assert len(answer) >= FRAME_HEADER.size
    await until(lambda: server.connections == 1, timeout_s=5)
    await fetch_works(good)


@pytest.mark.parametrize("name", list(REFUSED))
async def test_a_refused_request_is_answered_and_the_connection_kept(
    port: tuple[TcpBlockServer, TcpBlockClient], name: str
) -> None:
    server, good = port
    request, status = REFUSED[name]
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    for _ in range(2):  # answered, and the same connection answers again
        writer.write(request)
        raw = await asyncio.wait_for(reader.readexactly(FRAME_HEADER.size), 5)
        magic, _, got, _, request_id, _, length = FRAME_HEADER.unpack(raw)
        assert (magic, Status(got), request_id) == (MAGIC, status, 1)
        assert (await reader.readexactly(length)).decode()  # a reason
    await fetch_works(good)
    writer.close()


async def test_a_frame_stalled_half_way_is_hung_up_on_while_others_are_served(
    port: tuple[TcpBlockServer, TcpBlockClient],
) -> None:
    server, good = port
    stalled = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(20)]
    for i, (_, writer) in enumerate(stalled):
        frame = encode_frame(Frame(Op.FIND, Status.OK, 1, 0, b"good"))
        writer.write(frame[: 1 + i % (len(frame) - 1)])  # from one byte up to all but the last
    await until(lambda: server.connections == 21, timeout_s=5)
    await fetch_works(good)  # served while they stall
    for reader, _ in stalled:
        await closed_by_server(reader, within_s=STALL_S + 5)
    for _, writer in stalled:
        writer.close()
    await until(lambda: server.connections == 1, timeout_s=5)
    await fetch_works(good)


async def test_an_idle_connection_between_frames_is_kept(port: tuple[TcpBlockServer, TcpBlockClient]) -> None:
    _, good = port
    await fetch_works(good)
    await asyncio.sleep(STALL_S * 2)  # idle longer than the stall limit: a peer's pooled connection
    await fetch_works(good)


async def test_a_client_that_never_reads_is_hung_up_on(port: tuple[TcpBlockServer, TcpBlockClient]) -> None:
    server, good = port
    located = await good.find("good")
    assert located is not None
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    block = located.spans[0].block_id
    # Tens of MB of answers it never takes: the server's buffers fill, its drain stalls, it hangs up.
    request = b"".join(encode_frame(Frame(Op.READ, Status.OK, i + 1, block)) for i in range(1000))
    for _ in range(40):
        writer.transport.write(request)
    await until(lambda: server.connections == 1, timeout_s=30, step_s=0.05)
    await fetch_works(good)
    writer.transport.abort()
