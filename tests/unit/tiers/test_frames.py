"""The block wire format on its own (frames.py): every op's frame and payload round trip, and truncated or
garbage bytes are refused with the error type and reason a peer's bad bytes must produce."""

from __future__ import annotations

import random

import numpy as np
import pytest

from services.tiers.entry import EntryMeta
from services.tiers.l2.block_pool import BlockState
from services.tiers.l2.blocks import BlockSpan, Located
from services.tiers.l2.net.frames import (
    CLIENT_HELLO_BYTES,
    DEFAULT_MAX_FRAME_BYTES,
    FRAME_HEADER,
    SERVER_HELLO_BYTES,
    BlockExtent,
    ClientHello,
    Frame,
    FrameTooLarge,
    Op,
    ProtocolError,
    QpInfo,
    RemoteError,
    ServerHello,
    Status,
    check_payload,
    decode_allocate,
    decode_client_hello,
    decode_commit,
    decode_find_key,
    decode_frame_header,
    decode_info,
    decode_located,
    decode_server_hello,
    encode_allocate,
    encode_client_hello,
    encode_commit,
    encode_find_key,
    encode_frame,
    encode_info,
    encode_located,
    encode_server_hello,
    remote_error,
)

QP = QpInfo(bytes(range(16)), 0x1234, 0xABCDE, 7, 3)


def split(stream: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> list[Frame]:
    """Frames back to back in a byte string, as a reader takes them off a connection."""
    out, at = [], 0
    while at < len(stream):
        op, status, rid, block, n = decode_frame_header(stream[at : at + FRAME_HEADER.size], max_frame_bytes)
        at += FRAME_HEADER.size
        payload = stream[at : at + n]
        if len(payload) != n:
            raise ProtocolError(f"truncated payload: {len(payload)} of {n} bytes")
        out.append(Frame(op, status, rid, block, payload))
        at += n
    return out


# A request and a response for every op, with its real payload.
LOCATED = Located(
    EntryMeta(key="k", kind="kv_block", model="m", embedding=np.ones(4, dtype=np.float32)),
    (BlockSpan(8, 2048), BlockSpan(3, 10)),
    2058,
    0x1234_5678,
)
SERVER_HELLO = ServerHello(QP, 0x7F00_0000_0000, 0xBEEF, 1 << 20, writable=True)
EXCHANGES = {
    Op.READ: (b"", b"block bytes"),
    Op.WRITE: (b"new bytes", b""),
    Op.ALLOCATE: (encode_allocate(300), b""),
    Op.FREE: (b"", b""),
    Op.ACQUIRE: (b"", b""),
    Op.RELEASE: (b"", b""),
    Op.FIND: (encode_find_key("model:x:1"), encode_located(LOCATED)),
    Op.INFO: (b"", encode_info(2048, 1000, BlockState.ACTIVE, 1)),
    Op.COMMIT: (encode_commit(0, 200), b""),
    Op.HELLO: (encode_client_hello(ClientHello(QP, write=True)), encode_server_hello(SERVER_HELLO)),
    Op.AUTH: (b"mesh-token", b""),
}


def test_every_op_has_an_exchange_here() -> None:
    assert set(EXCHANGES) == set(Op)


@pytest.mark.parametrize("op", list(Op))
def test_every_ops_frames_round_trip(op: Op) -> None:
    req_payload, resp_payload = EXCHANGES[op]
    frames = [
        Frame(op, Status.OK, 1, 2**63 + 5, req_payload),
        Frame(op, Status.OK, 0xFFFFFFFF, 17, resp_payload),
        *(Frame(op, s, 2, 0, f"{s.name} because".encode()) for s in Status if s is not Status.OK),
    ]
    assert split(b"".join(encode_frame(f) for f in frames)) == frames


def test_payloads_decode_to_typed_values() -> None:
    assert decode_allocate(EXCHANGES[Op.ALLOCATE][0]) == 300
    assert decode_commit(EXCHANGES[Op.COMMIT][0]) == (0, 200)
    assert decode_find_key(EXCHANGES[Op.FIND][0]) == "model:x:1"
    loc = decode_located(EXCHANGES[Op.FIND][1])
    assert (loc.spans, loc.nbytes, loc.crc32, loc.meta.key) == (LOCATED.spans, 2058, 0x1234_5678, "k")
    np.testing.assert_array_equal(loc.meta.embedding, np.ones(4, dtype=np.float32))
    assert decode_info(9, EXCHANGES[Op.INFO][1]) == BlockExtent(9, 2048, 1000, BlockState.ACTIVE, 1)
    assert decode_client_hello(EXCHANGES[Op.HELLO][0]) == ClientHello(QP, write=True)
    assert decode_server_hello(EXCHANGES[Op.HELLO][1]) == SERVER_HELLO


def test_a_truncated_header_is_refused_at_every_length() -> None:
    raw = encode_frame(Frame(Op.READ, Status.OK, 1, 2, b"xyz"))
    for n in range(FRAME_HEADER.size):
        with pytest.raises(ProtocolError, match="frame header is 24 bytes"):
            decode_frame_header(raw[:n], 1024)


def test_a_truncated_payload_is_seen() -> None:
    raw = encode_frame(Frame(Op.WRITE, Status.OK, 1, 2, b"0123456789"))
    with pytest.raises(ProtocolError, match="truncated payload: 9 of 10"):
        split(raw[:-1])


def test_garbage_headers_are_protocol_errors() -> None:
    rng = random.Random(7)
    for _ in range(200):
        with pytest.raises(ProtocolError):
            decode_frame_header(rng.randbytes(FRAME_HEADER.size), DEFAULT_MAX_FRAME_BYTES)
    http = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[: FRAME_HEADER.size]
    with pytest.raises(ProtocolError, match="magic"):
        decode_frame_header(http, DEFAULT_MAX_FRAME_BYTES)


def test_a_sender_checks_its_own_limit() -> None:
    check_payload(b"x" * 10, 10)
    with pytest.raises(FrameTooLarge, match="11 bytes exceeds the limit of 10"):
        check_payload(b"x" * 11, 10)


@pytest.mark.parametrize(
    ("decode", "payload", "reason"),
    [
        (decode_allocate, b"\x01\x02", "ALLOCATE carries the size as u32"),
        (decode_allocate, b"\x00" * 8, "ALLOCATE carries the size as u32"),
        (decode_commit, b"\x00" * 4, "COMMIT carries offset and length as two u32"),
        (decode_find_key, b"", "1-512 characters"),
        (decode_find_key, b"k" * 513, "1-512 characters"),
        (decode_find_key, b"\xff\xfe", "utf-8"),
        (lambda p: decode_info(1, p), b"\x00" * 15, "INFO answer of 15 bytes, expected 16"),
        (
            lambda p: decode_info(1, p),
            encode_info(256, 0, BlockState.FREE, 0)[:8] + b"\x63" + b"\x00" * 7,
            "state 99",
        ),
    ],
)
def test_malformed_payloads_are_refused(decode, payload: bytes, reason: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProtocolError, match=reason):
        decode(payload)


def test_allocate_sizes_must_fit_a_u32() -> None:
    for bad in (-1, 1 << 32):
        with pytest.raises(ValueError, match="cannot allocate"):
            encode_allocate(bad)


def test_a_find_answer_cut_short_anywhere_is_refused() -> None:
    # Without an embedding every byte is accounted for by the header, so any prefix is detectably short.
    raw = encode_located(Located(EntryMeta(key="k", kind="prompt", model="m"), (BlockSpan(1, 5),), 5, 1))
    for n in range(len(raw)):
        with pytest.raises(ProtocolError):
            decode_located(raw[:n])


@pytest.mark.parametrize(
    ("decode", "raw"),
    [
        (decode_client_hello, encode_client_hello(ClientHello(QP, write=False))),
        (decode_server_hello, encode_server_hello(SERVER_HELLO)),
    ],
)
def test_a_hello_cut_short_or_padded_is_refused(decode, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    size = CLIENT_HELLO_BYTES if decode is decode_client_hello else SERVER_HELLO_BYTES
    for bad in (*(raw[:n] for n in range(len(raw))), raw + b"\x00"):
        with pytest.raises(ValueError, match=f"HELLO is {size} bytes"):
            decode(bad)


def test_an_error_response_becomes_a_remote_error() -> None:
    err = remote_error(Frame(Op.FREE, Status.BLOCK_STATE, 1, 2, b"block 2 is free \xff"))
    assert isinstance(err, RemoteError) and err.status is Status.BLOCK_STATE
    assert err.message == "block 2 is free \ufffd" and str(err).startswith("BLOCK_STATE: ")
