"""The transport's pure parts: frame codec, request handling (FIND, INFO, COMMIT, read-only serving),
the FIND answer codec, and the framed client ops over the in-process channel (no sockets here)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from services.tiers.entry import Entry, EntryMeta
from services.tiers.l2.block_pool import BlockPool, BlockState
from services.tiers.l2.blocks import BlockSpan, Located
from services.tiers.l2.net.frames import (
    FRAME_HEADER,
    MAGIC,
    Frame,
    FrameTooLarge,
    Op,
    ProtocolError,
    RemoteError,
    Status,
    decode_frame_header,
    decode_located,
    encode_frame,
    encode_located,
)
from services.tiers.l2.net.handler import answer, authenticate, handle_request
from services.tiers.l2.net.transport import LocalBlockClient
from services.tiers.l2.store import L2Store


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


def stored(store: L2Store, key: str, size: int, **meta: object) -> Entry:
    blob = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    entry = Entry(EntryMeta(key=key, kind="kv_block", model="m", **meta), blob)  # type: ignore[arg-type]
    assert store.put(entry)
    return entry


def test_find_answers_with_the_spans_and_the_descriptor() -> None:
    pool = BlockPool(2, xp=np)
    store = L2Store(pool, dim=4)
    emb = np.array([1, 0, 0, 0], dtype=np.float32)
    entry = stored(store, "model:x:1", 3000, embedding=emb, trace_id="t", semantic_tags={"a": "b"})
    resp = handle_request(pool, Frame(Op.FIND, Status.OK, 9, 0, b"model:x:1"), directory=store)
    assert resp.status is Status.OK and resp.request_id == 9
    loc = decode_located(resp.payload)
    assert loc.nbytes == 3000 and [s.length for s in loc.spans] == [2048, 952]
    assert b"".join(pool.read_bytes(s.block_id)[: s.length] for s in loc.spans) == entry.blob
    assert loc.meta.trace_id == "t" and loc.meta.semantic_tags == {"a": "b"}
    np.testing.assert_array_equal(loc.meta.embedding, emb)
    assert store.stats().served_remote == 1


@pytest.mark.parametrize(
    ("payload", "directory", "status"),
    [
        (b"absent", True, Status.NOT_FOUND),
        (b"", True, Status.BAD_REQUEST),
        (b"\xff\xfe", True, Status.BAD_REQUEST),
        (b"k" * 513, True, Status.BAD_REQUEST),
        (b"k", False, Status.UNSUPPORTED),
    ],
)
def test_find_errors(payload: bytes, directory: bool, status: Status) -> None:
    pool = BlockPool(1, xp=np)
    store = L2Store(pool) if directory else None
    resp = handle_request(pool, Frame(Op.FIND, Status.OK, 1, 0, payload), directory=store)
    assert resp.status is status and resp.payload


def test_located_round_trip_and_malformed_answers() -> None:
    meta = EntryMeta(key="k", kind="prompt", model="m", ttl_hint_ms=5, context_dependency_ids=("c",))
    loc = Located(meta, (BlockSpan(3, 2048), BlockSpan(11, 5)), 2053, 0xABCDEF)
    raw = encode_located(loc)
    assert decode_located(raw) == loc
    for bad, why in [
        (raw[:10], "shorter than its header"),
        (raw[:-3], "shorter than it claims"),
        (struct.pack("<IIII", 2054, 0, 2, 0) + raw[16:], "spans hold"),
        (struct.pack("<IIII", 1, 0, 100_000, 0), "claims"),
        (raw + b"\x00", "float32"),
        (raw.replace(b'"prompt"', b'"banana"'), "malformed"),
    ]:
        with pytest.raises(ProtocolError, match=why):
            decode_located(bad)


def test_info_and_commit() -> None:
    pool = BlockPool(1, xp=np)
    block = call(pool, Op.ALLOCATE, payload=struct.pack("<I", 100)).block_id
    info = call(pool, Op.INFO, block)
    assert struct.unpack("<IIBxxxi", info.payload) == (256, 100, BlockState.ALLOCATED, 0)
    assert call(pool, Op.COMMIT, block, struct.pack("<II", 0, 200)).status is Status.OK
    assert pool.info(block).length == 200
    assert call(pool, Op.COMMIT, block, struct.pack("<II", 100, 200)).status is Status.BAD_REQUEST
    assert call(pool, Op.COMMIT, block, b"\x00").status is Status.BAD_REQUEST
    assert call(pool, Op.INFO, block + 1).status is Status.BLOCK_STATE


@pytest.mark.parametrize("op", [Op.WRITE, Op.ALLOCATE, Op.FREE, Op.ACQUIRE, Op.RELEASE, Op.COMMIT])
def test_a_read_only_server_refuses_every_change(op: Op) -> None:
    pool = BlockPool(1, xp=np)
    store = L2Store(pool)
    stored(store, "k", 10)
    resp = handle_request(pool, Frame(op, Status.OK, 1, 0, b"xx"), directory=store, writable=False)
    assert resp.status is Status.REFUSED and b"read-only" in resp.payload
    assert handle_request(pool, Frame(Op.READ, Status.OK, 1, 0), writable=False).status is Status.OK
    assert store.get("k") is not None


def test_hello_without_rdma_is_unsupported() -> None:
    pool = BlockPool(1, xp=np)
    resp = answer(pool, Frame(Op.HELLO, Status.OK, 3, 0, b"hi"), sessions=[])
    assert resp.status is Status.UNSUPPORTED and b"TCP" in resp.payload
    assert handle_request(pool, Frame(Op.HELLO, Status.OK, 3, 0)).status is Status.UNSUPPORTED


async def test_framed_client_ops_over_the_in_process_channel() -> None:
    pool = BlockPool(2, xp=np)
    store = L2Store(pool)
    a, b = stored(store, "a", 5000), stored(store, "b", 10)
    client = LocalBlockClient(pool, directory=store, writable=False)
    found = await client.find_many(["a", "nope", "b"])
    assert found[1] is None and found[0] is not None and found[2] is not None
    assert await client.gather([found[0].spans, found[2].spans]) == [a.blob, b.blob]
    extents = await client.extents([s.block_id for s in found[0].spans])
    assert [e.length for e in extents] == [2048, 2048, 904]
    # Blocks freed between FIND and READ come back as None (the reader counts it stale), not an error.
    store.remove("a")
    assert await client.gather([found[0].spans, found[2].spans]) == [None, b.blob]
    with pytest.raises(RemoteError) as err:
        await client.allocate(10)
    assert err.value.status is Status.REFUSED
    assert client.requests["FIND"] == 3


def test_auth_accepts_the_token_only_and_never_echoes_it() -> None:
    req = Frame(Op.AUTH, Status.OK, 7, 0, b"mesh-secret")
    ok = authenticate(req, b"mesh-secret")
    assert (ok.op, ok.status, ok.request_id, ok.payload) == (Op.AUTH, Status.OK, 7, b"")
    for wrong in (b"mesh-secreT", b"", b"mesh-secret-and-more"):
        refused = authenticate(Frame(Op.AUTH, Status.OK, 8, 0, wrong), b"mesh-secret")
        assert refused.status is Status.UNAUTHORIZED and b"mesh-secret" not in refused.payload
    assert authenticate(req, None).status is Status.OK  # a server without a token accepts any AUTH
