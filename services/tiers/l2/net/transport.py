"""Reading and writing blocks in another node's L2 pool (DESIGN.md §1 L2): the `BlockTransport` port,
its TCP adapter (asyncio streams, length-prefixed frames) that every node has, an in-process adapter over
the same request handler, and the ops the pyverbs RDMA adapter (`rdma.py`) needs for its control channel.

Frame (little-endian, request and response alike)::

    magic "CMB1" | op u8 | status u8 | reserved u16 | request_id u32 | block_id u64 | payload_len u32
    payload (payload_len bytes, at most max_frame_bytes)

Requests on one connection are answered in order; `exchange` pipelines them (in chunks, so neither side
blocks writing while the other is not reading). A response with a nonzero status carries a utf-8 error
message as payload. Ops and their payloads:

    READ      -> the block's written bytes
    WRITE     bytes at offset 0                     (refused by a read-only server)
    ALLOCATE  size u32 -> block_id                  (refused by a read-only server)
    FREE / ACQUIRE / RELEASE                        (refused by a read-only server)
    FIND      key utf-8 (<= 512 chars) -> `Located`: the entry's block spans, size, crc32 and descriptor
              (NOT_FOUND when the node's L2 does not hold the key; UNSUPPORTED without a key directory)
    INFO      -> capacity u32 | length u32 | state u8 | pad 3 | refcount i32
    COMMIT    offset u32 | nbytes u32: a one-sided RDMA WRITE put these bytes into the block
    HELLO     RDMA handshake (rdma.py encodes both sides); UNSUPPORTED without an RDMA device
    AUTH      the mesh token (the tier node's `api_token`). A server with a token answers every other op
              UNAUTHORIZED, and hangs up, until the connection has sent it; a wrong token is answered
              UNAUTHORIZED and the connection is closed. A server without a token accepts any AUTH.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import struct
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from types import TracebackType
from typing import Any, Protocol, Self

import numpy as np

from schemas.events import MAX_EMBEDDING_DIM, MAX_KEY_CHARS
from services.tiers.entry import EntryMeta
from services.tiers.l2.block_pool import BlockPool, BlockState, BlockStateError, PoolExhausted

MAGIC = b"CMB1"
FRAME_HEADER = struct.Struct("<4sBBHIQI")
DEFAULT_MAX_FRAME_BYTES = 1 << 20  # blocks are <= 2 KB; this bounds what a bad peer can make us buffer
DEFAULT_TIMEOUT_S = 5.0
# Requests written before their answers are read: bounds what either side buffers (64 x 2 KB reads).
PIPELINE_DEPTH = 64
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


@dataclass(frozen=True, slots=True)
class Frame:
    op: Op
    status: Status
    request_id: int
    block_id: int
    payload: bytes = b""


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


# --- FIND: where an entry's value lies ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockSpan:
    """One block of a value and how many of its bytes the value uses."""

    block_id: int
    length: int


@dataclass(frozen=True, slots=True)
class Located:
    """An entry in a remote pool: its blocks in order, its size and crc32 (what a reader checks the
    gathered bytes against: blocks may be freed and reused between FIND and READ), and its facts."""

    meta: EntryMeta
    spans: tuple[BlockSpan, ...]
    nbytes: int
    crc32: int


class KeyDirectory(Protocol):
    """What a block server consults for FIND (the node's L2 store)."""

    def locate(self, key: str) -> Located | None: ...


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
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"FIND descriptor is malformed: {exc!r}") from None
    return Located(meta, spans, nbytes, crc32)


@dataclass(frozen=True, slots=True)
class BlockExtent:
    """INFO: a block's capacity, written length, state and references (RDMA reads need the length)."""

    block_id: int
    capacity: int
    length: int
    state: BlockState
    refcount: int


# --- the server side, pure ----------------------------------------------------------------------


def handle_request(
    pool: BlockPool, req: Frame, *, directory: KeyDirectory | None = None, writable: bool = True
) -> Frame:
    """Apply one request to the pool; pure, so the server's semantics are testable without sockets.
    HELLO is connection-scoped and answered by `answer`."""

    def reply(status: Status = Status.OK, block_id: int = req.block_id, payload: bytes = b"") -> Frame:
        return Frame(req.op, status, req.request_id, block_id, payload)

    if not writable and req.op in MUTATING_OPS:
        return reply(Status.REFUSED, payload=f"{req.op.name} refused: this pool is served read-only".encode())
    try:
        if req.op is Op.READ:
            return reply(payload=pool.read_bytes(req.block_id))
        if req.op is Op.FIND:
            return _find(directory, req, reply)
        if req.op is Op.INFO:
            info = pool.info(req.block_id)
            return reply(payload=_INFO.pack(info.capacity, info.length, info.state, info.refcount))
        if req.op is Op.HELLO:
            return reply(Status.UNSUPPORTED, payload=b"HELLO is answered per connection")
        if req.op is Op.WRITE:
            pool.write(req.block_id, req.payload)
            return reply()
        if req.op is Op.ALLOCATE:
            if len(req.payload) != _U32.size:
                return reply(Status.BAD_REQUEST, payload=b"ALLOCATE carries the size as u32")
            return reply(block_id=pool.allocate(_U32.unpack(req.payload)[0]))
        if req.op is Op.COMMIT:
            if len(req.payload) != _COMMIT.size:
                return reply(Status.BAD_REQUEST, payload=b"COMMIT carries offset and length as two u32")
            pool.mark_written(req.block_id, *_COMMIT.unpack(req.payload))
        elif req.op is Op.FREE:
            pool.free(req.block_id)
        elif req.op is Op.ACQUIRE:
            pool.acquire(req.block_id)
        elif req.op is Op.RELEASE:
            pool.release(req.block_id)
        return reply()
    except BlockStateError as exc:
        return reply(Status.BLOCK_STATE, payload=str(exc).encode())
    except PoolExhausted as exc:
        return reply(Status.EXHAUSTED, payload=str(exc).encode())
    except ValueError as exc:
        return reply(Status.BAD_REQUEST, payload=str(exc).encode())


def _find(directory: KeyDirectory | None, req: Frame, reply: Callable[..., Frame]) -> Frame:
    if directory is None:
        return reply(Status.UNSUPPORTED, payload=b"this server has no key directory (no L2 store)")
    try:
        key = req.payload.decode()
    except UnicodeDecodeError:
        return reply(Status.BAD_REQUEST, payload=b"FIND carries the key as utf-8")
    if not 0 < len(key) <= MAX_KEY_CHARS:
        return reply(Status.BAD_REQUEST, payload=f"FIND key must be 1-{MAX_KEY_CHARS} characters".encode())
    located = directory.locate(key)
    if located is None:
        return reply(Status.NOT_FOUND, payload=b"no entry under this key")
    return reply(payload=encode_located(located))


def authenticate(req: Frame, token: bytes | None) -> Frame:
    """The answer to an AUTH frame: OK when the server needs no token or the token matches (compared
    in constant time), UNAUTHORIZED otherwise. The token is never echoed."""
    if token is None or hmac.compare_digest(req.payload, token):
        return Frame(Op.AUTH, Status.OK, req.request_id, 0)
    return Frame(Op.AUTH, Status.UNAUTHORIZED, req.request_id, 0, b"wrong token for this block server")


def unauthorized(req: Frame) -> Frame:
    """The answer to any other op before a required AUTH."""
    return Frame(
        req.op,
        Status.UNAUTHORIZED,
        req.request_id,
        req.block_id,
        b"this block server requires AUTH with the mesh token first",
    )


class RdmaExporter(Protocol):
    """The server side of the RDMA handshake (rdma.py): takes a client's HELLO payload, sets up a queue
    pair against the registered pool, returns the answer and a function that tears that pair down."""

    def accept(self, hello: bytes) -> tuple[bytes, Callable[[], None]]: ...


def answer(
    pool: BlockPool,
    req: Frame,
    *,
    directory: KeyDirectory | None = None,
    writable: bool = True,
    rdma: RdmaExporter | None = None,
    sessions: list[Callable[[], None]] | None = None,
) -> Frame:
    """One request on one connection: HELLO opens an RDMA session (its teardown goes on `sessions`),
    everything else goes to `handle_request`."""
    if req.op is not Op.HELLO:
        return handle_request(pool, req, directory=directory, writable=writable)

    def reply(status: Status, message: bytes) -> Frame:
        return Frame(req.op, status, req.request_id, 0, message)

    if rdma is None:
        return reply(Status.UNSUPPORTED, b"no RDMA device on this node: read over TCP")
    if sessions is None:
        return reply(Status.UNSUPPORTED, b"this channel cannot hold an RDMA session")
    if sessions:
        return reply(Status.BAD_REQUEST, b"one RDMA session per connection")
    try:
        payload, close = rdma.accept(req.payload)
    except ValueError as exc:
        return reply(Status.BAD_REQUEST, str(exc).encode())
    except PoolExhausted as exc:
        return reply(Status.EXHAUSTED, str(exc).encode())
    except RdmaUnavailable as exc:
        return reply(Status.UNSUPPORTED, str(exc).encode())
    sessions.append(close)
    return Frame(req.op, Status.OK, req.request_id, 0, payload)


# --- the client side ----------------------------------------------------------------------------


class BlockTransport(ABC):
    """Blocks of a remote pool: ids are the remote pool's block ids."""

    @abstractmethod
    async def read(self, block_id: int) -> bytes: ...

    @abstractmethod
    async def write(self, block_id: int, data: bytes | bytearray | memoryview) -> None: ...

    @abstractmethod
    async def allocate(self, nbytes: int) -> int: ...

    @abstractmethod
    async def free(self, block_id: int) -> None: ...

    @abstractmethod
    async def acquire(self, block_id: int) -> None: ...

    @abstractmethod
    async def release(self, block_id: int) -> None: ...

    @abstractmethod
    async def find_many(self, keys: Sequence[str]) -> list[Located | None]:
        """Where each key's value lies in the remote pool (None: not there)."""

    async def find(self, key: str) -> Located | None:
        return (await self.find_many([key]))[0]

    async def read_many(self, block_ids: Sequence[int]) -> list[bytes]:
        return [await self.read(b) for b in block_ids]

    async def gather(self, values: Sequence[Sequence[BlockSpan]]) -> list[bytes | None]:
        """The bytes of each value (its spans concatenated); None where a block no longer holds what
        FIND said (freed or rewritten meanwhile). Callers still check the crc32."""
        out: list[bytes | None] = []
        for spans in values:
            try:
                parts = [await self.read(s.block_id) for s in spans]
            except RemoteError as exc:
                if exc.status is not Status.BLOCK_STATE:
                    raise
                out.append(None)
                continue
            out.append(_join(spans, parts))
        return out

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _join(spans: Sequence[BlockSpan], parts: Sequence[bytes]) -> bytes | None:
    if any(len(p) < s.length for s, p in zip(spans, parts, strict=True)):
        return None
    return b"".join(p[: s.length] for s, p in zip(spans, parts, strict=True))


Request = tuple[Op, int, bytes]


class FramedBlockClient(BlockTransport):
    """Every block op as frames; subclasses carry them (`exchange`: answers in request order, a
    non-OK status returned as is, not raised)."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES

    @abstractmethod
    async def exchange(self, requests: Sequence[Request]) -> list[Frame]: ...

    async def _call(self, requests: Sequence[Request]) -> list[Frame]:
        responses = await self.exchange(requests)
        for resp in responses:
            if resp.status is not Status.OK:
                raise RemoteError(resp.status, resp.payload.decode(errors="replace"))
        return responses

    async def read(self, block_id: int) -> bytes:
        return (await self._call([(Op.READ, block_id, b"")]))[0].payload

    async def read_many(self, block_ids: Sequence[int]) -> list[bytes]:
        if not block_ids:
            return []
        return [f.payload for f in await self._call([(Op.READ, b, b"") for b in block_ids])]

    async def write(self, block_id: int, data: bytes | bytearray | memoryview) -> None:
        await self._call([(Op.WRITE, block_id, bytes(data))])

    async def allocate(self, nbytes: int) -> int:
        if not 0 <= nbytes <= 0xFFFFFFFF:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        return (await self._call([(Op.ALLOCATE, 0, _U32.pack(nbytes))]))[0].block_id

    async def free(self, block_id: int) -> None:
        await self._call([(Op.FREE, block_id, b"")])

    async def acquire(self, block_id: int) -> None:
        await self._call([(Op.ACQUIRE, block_id, b"")])

    async def release(self, block_id: int) -> None:
        await self._call([(Op.RELEASE, block_id, b"")])

    async def find_many(self, keys: Sequence[str]) -> list[Located | None]:
        if not keys:
            return []
        out: list[Located | None] = []
        for resp in await self.exchange([(Op.FIND, 0, k.encode()) for k in keys]):
            if resp.status is Status.NOT_FOUND:
                out.append(None)
            elif resp.status is not Status.OK:
                raise RemoteError(resp.status, resp.payload.decode(errors="replace"))
            else:
                out.append(decode_located(resp.payload))
        return out

    async def extents(self, block_ids: Sequence[int]) -> list[BlockExtent]:
        """INFO for each block, pipelined."""
        if not block_ids:
            return []
        out = []
        for b, resp in zip(block_ids, await self._call([(Op.INFO, b, b"") for b in block_ids]), strict=True):
            if len(resp.payload) != _INFO.size:
                raise ProtocolError(f"INFO answer of {len(resp.payload)} bytes, expected {_INFO.size}")
            cap, length, state, refs = _INFO.unpack(resp.payload)
            try:
                out.append(BlockExtent(b, cap, length, BlockState(state), refs))
            except ValueError:
                raise ProtocolError(f"INFO answer with block state {state}") from None
        return out

    async def commit(self, block_id: int, offset: int, nbytes: int) -> None:
        await self._call([(Op.COMMIT, block_id, _COMMIT.pack(offset, nbytes))])

    async def hello(self, payload: bytes) -> bytes:
        return (await self._call([(Op.HELLO, 0, payload)]))[0].payload

    async def gather(self, values: Sequence[Sequence[BlockSpan]]) -> list[bytes | None]:
        reads = [(Op.READ, s.block_id, b"") for spans in values for s in spans]
        responses = await self.exchange(reads) if reads else []
        out: list[bytes | None] = []
        i = 0
        for spans in values:
            frames = responses[i : i + len(spans)]
            i += len(spans)
            bad = next((f for f in frames if f.status is not Status.OK), None)
            if bad is not None and bad.status is not Status.BLOCK_STATE:
                raise RemoteError(bad.status, bad.payload.decode(errors="replace"))
            out.append(None if bad is not None else _join(spans, [f.payload for f in frames]))
        return out


class LocalBlockClient(FramedBlockClient):
    """The block ops against a pool in this process, through the same request handler as the server:
    the control channel of tests and of co-located readers, without sockets."""

    def __init__(
        self,
        pool: BlockPool,
        *,
        directory: KeyDirectory | None = None,
        writable: bool = True,
        rdma: RdmaExporter | None = None,
    ) -> None:
        self.pool = pool
        self.directory = directory
        self.writable = writable
        self.rdma = rdma
        self.requests: Counter[str] = Counter()
        self._sessions: list[Callable[[], None]] = []
        self._next_id = 0

    async def exchange(self, requests: Sequence[Request]) -> list[Frame]:
        out = []
        for op, block_id, payload in requests:
            if len(payload) > self.max_frame_bytes:
                raise FrameTooLarge(
                    f"payload {len(payload)} bytes exceeds the limit of {self.max_frame_bytes}"
                )
            self._next_id = (self._next_id + 1) & 0xFFFFFFFF
            self.requests[op.name] += 1
            req = Frame(op, Status.OK, self._next_id, block_id, payload)
            out.append(
                answer(
                    self.pool,
                    req,
                    directory=self.directory,
                    writable=self.writable,
                    rdma=self.rdma,
                    sessions=self._sessions,
                )
            )
        return out

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, []
        for close in sessions:
            close()


async def _read_frame(reader: asyncio.StreamReader, max_frame_bytes: int) -> Frame:
    try:
        raw = await reader.readexactly(FRAME_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        raise ConnectionClosed("connection closed by peer") from exc
    op, status, request_id, block_id, payload_len = decode_frame_header(raw, max_frame_bytes)
    try:
        payload = await reader.readexactly(payload_len) if payload_len else b""
    except asyncio.IncompleteReadError as exc:
        raise ConnectionClosed(f"connection closed inside a {payload_len} byte payload") from exc
    return Frame(op, status, request_id, block_id, payload)


class TcpBlockServer:
    """Serves one `BlockPool` over TCP. `async with TcpBlockServer(pool) as server: server.port`.

    `directory` answers FIND (a node passes its L2 store); `writable=False` refuses every op that
    changes the pool (a node's L2 owns its blocks: peers may only read them); `rdma` answers HELLO;
    with `token`, a connection must open with AUTH carrying it."""

    def __init__(
        self,
        pool: BlockPool,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        directory: KeyDirectory | None = None,
        writable: bool = True,
        rdma: RdmaExporter | None = None,
        token: bytes | None = None,
    ) -> None:
        self.pool = pool
        self.host = host
        self._token = token
        self._port = port
        self.max_frame_bytes = max_frame_bytes
        self.directory = directory
        self.writable = writable
        self.rdma = rdma
        self.requests: Counter[str] = Counter()  # by op name, for stats and tests
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[Any]] = set()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> int:
        return len(self._conns)

    async def start(self) -> None:
        if self._server is None:
            try:
                self._server = await asyncio.start_server(self._serve, self.host, self._port)
            except OSError as exc:
                raise OSError(f"block server cannot listen on {self.host}:{self._port}: {exc}") from exc

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        sessions: list[Callable[[], None]] = []  # RDMA queue pairs this connection opened
        authed = self._token is None
        try:
            while True:
                try:
                    req = await _read_frame(reader, self.max_frame_bytes)
                except ConnectionClosed:
                    return
                except ProtocolError as exc:
                    # The stream is out of sync after a bad header: say why, then hang up.
                    status = Status.FRAME_TOO_LARGE if isinstance(exc, FrameTooLarge) else Status.BAD_REQUEST
                    writer.write(encode_frame(Frame(Op.READ, status, 0, 0, str(exc).encode())))
                    await writer.drain()
                    return
                self.requests[req.op.name] += 1
                if req.op is Op.AUTH or not authed:
                    resp = authenticate(req, self._token) if req.op is Op.AUTH else unauthorized(req)
                    authed = resp.status is Status.OK
                    writer.write(encode_frame(resp))
                    await writer.drain()
                    if not authed:
                        return
                    continue
                try:
                    resp = answer(
                        self.pool,
                        req,
                        directory=self.directory,
                        writable=self.writable,
                        rdma=self.rdma,
                        sessions=sessions,
                    )
                except Exception as exc:  # one bad request must not kill the server
                    resp = Frame(req.op, Status.INTERNAL, req.request_id, req.block_id, repr(exc).encode())
                writer.write(encode_frame(resp))
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            for close in sessions:
                with contextlib.suppress(Exception):
                    close()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class TcpBlockClient(FramedBlockClient):
    """One connection to a `TcpBlockServer`; calls are serialised on it, batches are pipelined."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        token: bytes | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.max_frame_bytes = max_frame_bytes
        self.timeout_s = timeout_s
        self._token = token
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        return self._writer is not None

    async def connect(self) -> None:
        """Open the connection; with a token, AUTH is its first exchange (RemoteError if refused)."""
        if self._writer is None:
            async with asyncio.timeout(self.timeout_s):
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
                if self._token is None:
                    return
                try:
                    (resp,) = await self._exchange_chunk([(Op.AUTH, 0, self._token)])
                    if resp.status is not Status.OK:
                        raise RemoteError(resp.status, resp.payload.decode(errors="replace"))
                except BaseException:
                    await self.close()
                    raise

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def close(self) -> None:
        if self._writer is not None:
            writer, self._writer, self._reader = self._writer, None, None
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def exchange(self, requests: Sequence[Request]) -> list[Frame]:
        for _, _, payload in requests:
            if len(payload) > self.max_frame_bytes:
                raise FrameTooLarge(
                    f"payload {len(payload)} bytes exceeds the limit of {self.max_frame_bytes}"
                )
        out: list[Frame] = []
        async with self._lock:
            await self.connect()
            try:
                async with asyncio.timeout(self.timeout_s):
                    for at in range(0, len(requests), PIPELINE_DEPTH):
                        out.extend(await self._exchange_chunk(requests[at : at + PIPELINE_DEPTH]))
            except BaseException:
                # A half-read stream cannot be reused: drop the connection, reconnect next call.
                await self.close()
                raise
        return out

    async def _exchange_chunk(self, requests: Sequence[Request]) -> list[Frame]:
        assert self._reader is not None and self._writer is not None
        ids = []
        for op, block_id, payload in requests:
            self._next_id = (self._next_id + 1) & 0xFFFFFFFF
            ids.append(self._next_id)
            self._writer.write(encode_frame(Frame(op, Status.OK, self._next_id, block_id, payload)))
        await self._writer.drain()
        out = []
        for rid in ids:
            resp = await _read_frame(self._reader, self.max_frame_bytes)
            if resp.request_id != rid:
                # A connection-level error (request id 0) or a desynchronised stream: the caller's
                # handler closes the connection; the next call starts afresh.
                if resp.status is Status.OK:
                    raise ProtocolError(f"response to request {resp.request_id}, expected {rid}")
                raise RemoteError(resp.status, resp.payload.decode(errors="replace"))
            out.append(resp)
        return out
