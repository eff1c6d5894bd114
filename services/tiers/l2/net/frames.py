"""The block wire format, sans I/O: frames and every op's payload (the RDMA handshake included) as bytes in,
typed values out, validated; no asyncio, no sockets (`transport.py` and `rdma.py` carry the bytes).

The frame, the ops and their payloads, AUTH and the HELLO handshake: docs/tiers.md ("The block
transport's frames").
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from schemas.events import MAX_EMBEDDING_DIM, MAX_KEY_CHARS
from services.tiers.entry import EntryMeta
from services.tiers.l2.block_pool import UNIT_BYTES, BlockState
from services.tiers.l2.blocks import BlockSpan, Located

MAGIC = b"CMB1"
FRAME_HEADER = struct.Struct("<4sBBHIQI")
DEFAULT_MAX_FRAME_BYTES = 1 << 20  # blocks are <= 2 KB; this bounds what a bad peer can make us buffer
_U32 = struct.Struct("<I")
_COMMIT = struct.Struct("<II")
_INFO = struct.Struct("<IIBxxxi")
# FIND answer: nbytes u32 | crc32 u32 | spans u32 | descriptor_len u32, then spans (block u64, length
# u32), the descriptor as JSON, and the embedding as little-endian float32 (absent when empty).
_LOCATED = struct.Struct("<IIII")
_SPAN = struct.Struct("<QI")
MAX_SPANS = 4096
MAX_DESCRIPTOR_BYTES = 64 * 1024
_KINDS = ("prompt", "embedding", "kv_block")


class Op(IntEnum):
    READ = 1
    WRITE = 2
    ALLOCATE = 3
    FREE = 4
    ACQUIRE = 5
    RELEASE = 6
    FIND = 7
    INFO = 8
    COMMIT = 9
    HELLO = 10
    AUTH = 11


# What a read-only server (a node sharing the pool its L2 owns) refuses.
MUTATING_OPS = frozenset({Op.WRITE, Op.ALLOCATE, Op.FREE, Op.ACQUIRE, Op.RELEASE, Op.COMMIT})


class Status(IntEnum):
    OK = 0
    BAD_REQUEST = 1
    BLOCK_STATE = 2  # not a block, free, still referenced, ...
    EXHAUSTED = 3
    FRAME_TOO_LARGE = 4
    INTERNAL = 5
    NOT_FOUND = 6  # FIND: this pool holds no entry under the key
    REFUSED = 7  # a mutating op on a read-only server
    UNSUPPORTED = 8  # FIND without a key directory, HELLO without an RDMA device
    UNAUTHORIZED = 9  # no AUTH, or a wrong token, on a server that requires one


class TransportError(Exception):
    """Base of everything a block transport raises."""


class ProtocolError(TransportError):
    """The peer sent bytes that are not a valid frame."""


class FrameTooLarge(ProtocolError):
    pass


class ConnectionClosed(TransportError):
    pass


class RemoteError(TransportError):
    """The remote pool refused the request; `status` says why."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(f"{status.name}: {message}")
        self.status = status
        self.message = message


class RdmaUnavailable(TransportError):
    """pyverbs is missing or no RDMA device exists: use the TCP transport."""


# --- frames ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frame:
    op: Op
    status: Status
    request_id: int
    block_id: int
    payload: bytes = b""


# What a client asks: (op, block_id, payload); the channel numbers it into a `Frame`.
Request = tuple[Op, int, bytes]


def encode_frame(frame: Frame) -> bytes:
    return (
        FRAME_HEADER.pack(
            MAGIC, frame.op, frame.status, 0, frame.request_id, frame.block_id, len(frame.payload)
        )
        + frame.payload
    )


def decode_frame_header(raw: bytes, max_frame_bytes: int) -> tuple[Op, Status, int, int, int]:
    """(op, status, request_id, block_id, payload_len) from a frame header, validated."""
    if len(raw) != FRAME_HEADER.size:
        raise ProtocolError(f"frame header is {FRAME_HEADER.size} bytes, got {len(raw)}")
    magic, op, status, _, request_id, block_id, payload_len = FRAME_HEADER.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r}")
    try:
        op_, status_ = Op(op), Status(status)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    if payload_len > max_frame_bytes:
        raise FrameTooLarge(f"frame payload {payload_len} bytes exceeds the limit of {max_frame_bytes}")
    return op_, status_, request_id, block_id, payload_len


def check_payload(payload: bytes, max_frame_bytes: int) -> None:
    """A sender's own limit: what the receiving side would refuse is not sent."""
    if len(payload) > max_frame_bytes:
        raise FrameTooLarge(f"payload {len(payload)} bytes exceeds the limit of {max_frame_bytes}")


def remote_error(frame: Frame) -> RemoteError:
    """The error a non-OK response stands for (its payload is the server's message)."""
    return RemoteError(frame.status, frame.payload.decode(errors="replace"))


# --- ALLOCATE, COMMIT, INFO -----------------------------------------------------------------------


def encode_allocate(nbytes: int) -> bytes:
    if not 0 <= nbytes <= 0xFFFFFFFF:
        raise ValueError(f"cannot allocate {nbytes} bytes")
    return _U32.pack(nbytes)


def decode_allocate(payload: bytes) -> int:
    if len(payload) != _U32.size:
        raise ProtocolError("ALLOCATE carries the size as u32")
    return int(_U32.unpack(payload)[0])


def encode_commit(offset: int, nbytes: int) -> bytes:
    return _COMMIT.pack(offset, nbytes)


def decode_commit(payload: bytes) -> tuple[int, int]:
    """(offset, nbytes) a one-sided WRITE put into the block."""
    if len(payload) != _COMMIT.size:
        raise ProtocolError("COMMIT carries offset and length as two u32")
    offset, nbytes = _COMMIT.unpack(payload)
    return int(offset), int(nbytes)


@dataclass(frozen=True, slots=True)
class BlockExtent:
    """INFO: a block's capacity, written length, state and references (RDMA reads need the length)."""

    block_id: int
    capacity: int
    length: int
    state: BlockState
    refcount: int


def encode_info(capacity: int, length: int, state: BlockState, refcount: int) -> bytes:
    return _INFO.pack(capacity, length, state, refcount)


def decode_info(block_id: int, payload: bytes) -> BlockExtent:
    if len(payload) != _INFO.size:
        raise ProtocolError(f"INFO answer of {len(payload)} bytes, expected {_INFO.size}")
    cap, length, state, refs = _INFO.unpack(payload)
    try:
        return BlockExtent(block_id, cap, length, BlockState(state), refs)
    except ValueError:
        raise ProtocolError(f"INFO answer with block state {state}") from None


# --- FIND: where an entry's value lies ------------------------------------------------------------


def encode_find_key(key: str) -> bytes:
    return key.encode()


def decode_find_key(payload: bytes) -> str:
    try:
        key = payload.decode()
    except UnicodeDecodeError:
        raise ProtocolError("FIND carries the key as utf-8") from None
    if not 0 < len(key) <= MAX_KEY_CHARS:
        raise ProtocolError(f"FIND key must be 1-{MAX_KEY_CHARS} characters")
    return key


def encode_located(loc: Located) -> bytes:
    meta = json.dumps(loc.meta.as_dict(), separators=(",", ":")).encode()
    emb = b"" if loc.meta.embedding is None else np.asarray(loc.meta.embedding, dtype="<f4").tobytes()
    spans = b"".join(_SPAN.pack(s.block_id, s.length) for s in loc.spans)
    return _LOCATED.pack(loc.nbytes, loc.crc32, len(loc.spans), len(meta)) + spans + meta + emb


def decode_located(payload: bytes) -> Located:
    """A FIND answer, validated: counts and lengths bounded and consistent, the descriptor well formed."""
    if len(payload) < _LOCATED.size:
        raise ProtocolError(f"FIND answer of {len(payload)} bytes is shorter than its header")
    nbytes, crc32, n_spans, meta_len = _LOCATED.unpack_from(payload)
    if n_spans > MAX_SPANS or meta_len > MAX_DESCRIPTOR_BYTES:
        raise ProtocolError(f"FIND answer claims {n_spans} spans and a {meta_len} byte descriptor")
    at = _LOCATED.size + n_spans * _SPAN.size
    if len(payload) < at + meta_len:
        raise ProtocolError(f"FIND answer of {len(payload)} bytes is shorter than it claims")
    spans = tuple(
        BlockSpan(*_SPAN.unpack_from(payload, _LOCATED.size + i * _SPAN.size)) for i in range(n_spans)
    )
    if sum(s.length for s in spans) != nbytes:
        raise ProtocolError(f"FIND spans hold {sum(s.length for s in spans)} bytes, the value {nbytes}")
    emb_raw = payload[at + meta_len :]
    if len(emb_raw) % 4 or len(emb_raw) > 4 * MAX_EMBEDDING_DIM:
        raise ProtocolError(f"FIND embedding of {len(emb_raw)} bytes is not a float32 vector")
    try:
        d = json.loads(payload[at : at + meta_len])
        if d["kind"] not in _KINDS:
            raise ValueError(f"kind {d['kind']!r}")
        meta = EntryMeta(
            key=str(d["key"]),
            kind=d["kind"],
            model=str(d["model"]),
            embedding=np.frombuffer(emb_raw, dtype="<f4").astype(np.float32) if emb_raw else None,
            similarity_tolerance=float(d["similarity_tolerance"]),
            ttl_hint_ms=None if d["ttl_hint_ms"] is None else int(d["ttl_hint_ms"]),
            trace_id=None if d["trace_id"] is None else str(d["trace_id"]),
            context_dependency_ids=tuple(str(x) for x in d["context_dependency_ids"]),
            semantic_tags={str(k): str(v) for k, v in d["semantic_tags"].items()},
            created_at_ms=int(d["created_at_ms"]),
            updated_at_ms=int(d["updated_at_ms"]),
            size_bytes=int(d["size_bytes"]),
            prompt_text=None if d.get("prompt_text") is None else str(d["prompt_text"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"FIND descriptor is malformed: {exc!r}") from None
    return Located(meta, spans, nbytes, crc32)


# --- HELLO: the RDMA handshake (a malformed one is a ValueError: the server answers BAD_REQUEST) ------

HELLO_MAGIC = b"CMR1"
HELLO_VERSION = 1
_HEAD = struct.Struct("<4sBB")
_QP = struct.Struct("<16sIIHBx")
_REGION = struct.Struct("<QIQ")
CLIENT_HELLO_BYTES = _HEAD.size + _QP.size
SERVER_HELLO_BYTES = _HEAD.size + _QP.size + _REGION.size
_FLAG_WRITE = 1
MAX_PSN = (1 << 24) - 1  # packet sequence numbers and QP numbers are 24-bit
MTU_ENUM = range(1, 6)  # IBV_MTU_256 .. IBV_MTU_4096


@dataclass(frozen=True, slots=True)
class QpInfo:
    """What the other side needs to connect an RC queue pair to this one."""

    gid: bytes  # 16 raw bytes; all zero where the port has no GID (InfiniBand without a GRH)
    qp_num: int
    psn: int
    lid: int
    mtu: int  # ibv_mtu: 1 = 256 B ... 5 = 4096 B

    def __post_init__(self) -> None:
        if len(self.gid) != 16:
            raise ValueError(f"a GID is 16 bytes, got {len(self.gid)}")
        if not 0 < self.qp_num <= MAX_PSN:
            raise ValueError(f"QP number {self.qp_num} is not a 24-bit nonzero value")
        if not 0 <= self.psn <= MAX_PSN:
            raise ValueError(f"PSN {self.psn} is not 24-bit")
        if not 0 <= self.lid <= 0xFFFF:
            raise ValueError(f"LID {self.lid} is not 16-bit")
        if self.mtu not in MTU_ENUM:
            raise ValueError(f"path MTU {self.mtu} is not an ibv_mtu value (1-5)")

    @property
    def global_route(self) -> bool:
        """RoCE (and routed InfiniBand) needs a GRH: address the peer by GID."""
        return any(self.gid)


@dataclass(frozen=True, slots=True)
class ClientHello:
    qp: QpInfo
    write: bool


@dataclass(frozen=True, slots=True)
class ServerHello:
    qp: QpInfo
    addr: int  # virtual address of the registered pool buffer
    rkey: int
    length: int
    writable: bool


def _encode_qp(qp: QpInfo) -> bytes:
    return _QP.pack(qp.gid, qp.qp_num, qp.psn, qp.lid, qp.mtu)


def _decode_head(raw: bytes, size: int, side: str) -> int:
    if len(raw) != size:
        raise ValueError(f"{side} HELLO is {size} bytes, got {len(raw)}")
    magic, version, flags = _HEAD.unpack_from(raw)
    if magic != HELLO_MAGIC:
        raise ValueError(f"bad HELLO magic {magic!r}")
    if version != HELLO_VERSION:
        raise ValueError(f"HELLO version {version}; this node speaks {HELLO_VERSION}")
    return int(flags)


def encode_client_hello(hello: ClientHello) -> bytes:
    flags = _FLAG_WRITE if hello.write else 0
    return _HEAD.pack(HELLO_MAGIC, HELLO_VERSION, flags) + _encode_qp(hello.qp)


def decode_client_hello(raw: bytes) -> ClientHello:
    flags = _decode_head(raw, CLIENT_HELLO_BYTES, "client")
    return ClientHello(QpInfo(*_QP.unpack_from(raw, _HEAD.size)), bool(flags & _FLAG_WRITE))


def encode_server_hello(hello: ServerHello) -> bytes:
    flags = _FLAG_WRITE if hello.writable else 0
    return (
        _HEAD.pack(HELLO_MAGIC, HELLO_VERSION, flags)
        + _encode_qp(hello.qp)
        + _REGION.pack(hello.addr, hello.rkey, hello.length)
    )


def decode_server_hello(raw: bytes) -> ServerHello:
    flags = _decode_head(raw, SERVER_HELLO_BYTES, "server")
    qp = QpInfo(*_QP.unpack_from(raw, _HEAD.size))
    addr, rkey, length = _REGION.unpack_from(raw, _HEAD.size + _QP.size)
    if length == 0 or length % UNIT_BYTES or addr + length > 1 << 64:
        raise ValueError(f"server HELLO names a region of {length} bytes at {addr:#x}")
    return ServerHello(qp, addr, rkey, length, bool(flags & _FLAG_WRITE))


def gid_text(raw: bytes) -> str:
    """16 GID bytes as pyverbs writes them: 'xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx'."""
    if len(raw) != 16:
        raise ValueError(f"a GID is 16 bytes, got {len(raw)}")
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


def gid_raw(text: str) -> bytes:
    raw = bytes.fromhex(text.replace(":", ""))
    if len(raw) != 16:
        raise ValueError(f"{text!r} is not a 16-byte GID")
    return raw
