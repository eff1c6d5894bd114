"""The transport's pure parts: frame codec and request handling (no sockets here)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from services.tiers.block_pool import BlockPool
from services.tiers.transport import (
    FRAME_HEADER,
    MAGIC,
    Frame,
    FrameTooLarge,
    Op,
    ProtocolError,
    RdmaBlockTransport,
    RdmaUnavailable,
    Status,
    decode_frame_header,
    encode_frame,
    handle_request,
    rdma_available,
)


def test_frame_round_trip() -> None:
    frame = Frame(Op.WRITE, Status.OK, 7, 2**40, b"payload")
    raw = encode_frame(frame)
    assert len(raw) == FRAME_HEADER.size + 7
    assert decode_frame_header(raw[: FRAME_HEADER.size], 1024) == (Op.WRITE, Status.OK, 7, 2**40, 7)


@pytest.mark.parametrize(
    ("raw", "error", "message"),
    [
        (b"short", ProtocolError, "header"),
        (FRAME_HEADER.pack(b"HTTP", 1, 0, 0, 1, 0, 0), ProtocolError, "magic"),
        (FRAME_HEADER.pack(MAGIC, 99, 0, 0, 1, 0, 0), ProtocolError, "99"),
        (FRAME_HEADER.pack(MAGIC, 1, 42, 0, 1, 0, 0), ProtocolError, "42"),
        (FRAME_HEADER.pack(MAGIC, 2, 0, 0, 1, 0, 1025), FrameTooLarge, "1025"),
    ],
)
def test_bad_headers_are_rejected(raw: bytes, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        decode_frame_header(raw, 1024)


def call(pool: BlockPool, op: Op, block: int = 0, payload: bytes = b"") -> Frame:
    resp = handle_request(pool, Frame(op, Status.OK, 5, block, payload))
    assert resp.request_id == 5 and resp.op is op
    return resp


def test_request_handling_covers_the_block_lifecycle() -> None:
    pool = BlockPool(2, xp=np)
    alloc = call(pool, Op.ALLOCATE, payload=struct.pack("<I", 300))
    assert alloc.status is Status.OK
    block = alloc.block_id
    assert call(pool, Op.WRITE, block, b"kv" * 150).status is Status.OK
    assert call(pool, Op.READ, block).payload == b"kv" * 150
    assert call(pool, Op.ACQUIRE, block).status is Status.OK
    busy = call(pool, Op.FREE, block)
    assert busy.status is Status.BLOCK_STATE and b"reference" in busy.payload
    assert call(pool, Op.RELEASE, block).status is Status.OK
    assert call(pool, Op.FREE, block).status is Status.OK
    assert call(pool, Op.READ, block).status is Status.BLOCK_STATE


@pytest.mark.parametrize(
    ("op", "payload", "status"),
    [
        (Op.ALLOCATE, b"\x01", Status.BAD_REQUEST),  # size must be a u32
        (Op.ALLOCATE, struct.pack("<I", 4096), Status.BAD_REQUEST),  # over the largest block
        (Op.READ, b"", Status.BLOCK_STATE),
        (Op.RELEASE, b"", Status.BLOCK_STATE),
    ],
)
def test_request_errors_map_to_statuses(op: Op, payload: bytes, status: Status) -> None:
    resp = call(BlockPool(1, xp=np), op, 0, payload)
    assert resp.status is status and resp.payload


def test_exhausted_pool_says_so() -> None:
    pool = BlockPool(1, xp=np)
    for _ in range(8):
        call(pool, Op.ALLOCATE, payload=struct.pack("<I", 2048))
    assert call(pool, Op.ALLOCATE, payload=struct.pack("<I", 2048)).status is Status.EXHAUSTED


@pytest.mark.skipif(rdma_available(), reason="an RDMA device exists here")
def test_rdma_without_a_device_fails_clearly() -> None:
    assert not rdma_available()
    with pytest.raises(RdmaUnavailable, match=r"pyverbs|RDMA device"):
        RdmaBlockTransport()


@pytest.mark.rdma
@pytest.mark.skipif(not rdma_available(), reason="needs an RDMA device (pyverbs)")
async def test_rdma_transport_opens_the_device() -> None:
    transport = RdmaBlockTransport()
    try:
        with pytest.raises(RdmaUnavailable, match="not implemented"):
            await transport.read(0)
    finally:
        await transport.close()
