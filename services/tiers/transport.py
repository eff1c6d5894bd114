"""Reading and writing blocks in another node's L2 pool (DESIGN.md §1 L2): the `BlockTransport` port,
its TCP adapter (asyncio streams, length-prefixed frames) that every node has, and a guarded pyverbs
RDMA adapter for hosts with an RDMA device.

Frame (little-endian, request and response alike)::

    magic "CMB1" | op u8 | status u8 | reserved u16 | request_id u32 | block_id u64 | payload_len u32
    payload (payload_len bytes, at most max_frame_bytes)

Requests on one connection are answered in order; `read_many` pipelines them. A response with a
nonzero status carries a utf-8 error message as payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from types import TracebackType
from typing import Any, Self

from services.tiers.block_pool import BlockPool, BlockStateError, PoolExhausted

MAGIC = b"CMB1"
FRAME_HEADER = struct.Struct("<4sBBHIQI")
DEFAULT_MAX_FRAME_BYTES = 1 << 20  # blocks are <= 2 KB; this bounds what a bad peer can make us buffer
DEFAULT_TIMEOUT_S = 5.0
_U32 = struct.Struct("<I")


class Op(IntEnum):
    READ = 1
    WRITE = 2
    ALLOCATE = 3
    FREE = 4
    ACQUIRE = 5
    RELEASE = 6


class Status(IntEnum):
    OK = 0
    BAD_REQUEST = 1
    BLOCK_STATE = 2  # not a block, free, still referenced, ...
    EXHAUSTED = 3
    FRAME_TOO_LARGE = 4
    INTERNAL = 5


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


def handle_request(pool: BlockPool, req: Frame) -> Frame:
    """Apply one request to the pool; pure, so the server's semantics are testable without sockets."""

    def reply(status: Status = Status.OK, block_id: int = req.block_id, payload: bytes = b"") -> Frame:
        return Frame(req.op, status, req.request_id, block_id, payload)

    try:
        if req.op is Op.READ:
            return reply(payload=pool.read_bytes(req.block_id))
        if req.op is Op.WRITE:
            pool.write(req.block_id, req.payload)
            return reply()
        if req.op is Op.ALLOCATE:
            if len(req.payload) != _U32.size:
                return reply(Status.BAD_REQUEST, payload=b"ALLOCATE carries the size as u32")
            return reply(block_id=pool.allocate(_U32.unpack(req.payload)[0]))
        if req.op is Op.FREE:
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

    async def read_many(self, block_ids: Sequence[int]) -> list[bytes]:
        return [await self.read(b) for b in block_ids]

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


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
    """Serves one `BlockPool` over TCP. `async with TcpBlockServer(pool) as server: server.port`."""

    def __init__(
        self,
        pool: BlockPool,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.pool = pool
        self.host = host
        self._port = port
        self.max_frame_bytes = max_frame_bytes
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[Any]] = set()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, self.host, self._port)

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
                try:
                    resp = handle_request(self.pool, req)
                except Exception as exc:  # one bad request must not kill the server
                    resp = Frame(req.op, Status.INTERNAL, req.request_id, req.block_id, repr(exc).encode())
                writer.write(encode_frame(resp))
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class TcpBlockClient(BlockTransport):
    """One connection to a `TcpBlockServer`; calls are serialised on it, `read_many` pipelines."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.port = port
        self.max_frame_bytes = max_frame_bytes
        self.timeout_s = timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0

    async def connect(self) -> None:
        if self._writer is None:
            async with asyncio.timeout(self.timeout_s):
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def close(self) -> None:
        if self._writer is not None:
            writer, self._writer, self._reader = self._writer, None, None
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _call(self, requests: Sequence[tuple[Op, int, bytes]]) -> list[Frame]:
        for _, _, payload in requests:
            if len(payload) > self.max_frame_bytes:
                raise FrameTooLarge(
                    f"payload {len(payload)} bytes exceeds the limit of {self.max_frame_bytes}"
                )
        async with self._lock:
            await self.connect()
            assert self._reader is not None and self._writer is not None
            ids = []
            for op, block_id, payload in requests:
                self._next_id = (self._next_id + 1) & 0xFFFFFFFF
                ids.append(self._next_id)
                self._writer.write(encode_frame(Frame(op, Status.OK, self._next_id, block_id, payload)))
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self._writer.drain()
                    responses = [await _read_frame(self._reader, self.max_frame_bytes) for _ in requests]
            except BaseException:
                # A half-read stream cannot be reused: drop the connection, reconnect next call.
                await self.close()
                raise
        for rid, resp in zip(ids, responses, strict=True):
            if resp.request_id != rid:
                # A connection-level error (request id 0) or a desynchronised stream: start afresh.
                await self.close()
                if resp.status is Status.OK:
                    raise ProtocolError(f"response to request {resp.request_id}, expected {rid}")
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


def rdma_devices() -> list[str]:
    """Names of the RDMA devices pyverbs sees; raises `RdmaUnavailable` when there are none."""
    try:
        from pyverbs.device import get_device_list
    except ImportError as exc:
        raise RdmaUnavailable(
            "pyverbs is not importable in this interpreter (Debian's python3-pyverbs serves only "
            "/usr/bin/python3); use TcpBlockClient"
        ) from exc
    try:
        devices = get_device_list()
    except Exception as exc:  # PyverbsRDMAError when the kernel has no RDMA support
        raise RdmaUnavailable(f"no RDMA device: {exc}") from exc
    if not devices:
        raise RdmaUnavailable("no RDMA device")
    return [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in devices]


def rdma_available() -> bool:
    try:
        rdma_devices()
    except RdmaUnavailable:
        return False
    return True


class RdmaBlockTransport(BlockTransport):
    """pyverbs adapter: opens the device and a protection domain. The one-sided READ/WRITE data path
    (queue-pair exchange over a TCP control channel, remote keys of the peer's registered pool) is not
    built yet, since no host here has an RDMA device to test it on; until then every data call says so."""

    def __init__(self, device: str | None = None) -> None:
        names = rdma_devices()
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.device = device or names[0]
        if self.device not in names:
            raise RdmaUnavailable(f"RDMA device {self.device!r} not found; have {names}")
        self._ctx = Context(name=self.device)
        self._pd = PD(self._ctx)

    def _data_path(self) -> RdmaUnavailable:
        return RdmaUnavailable(
            f"RDMA data path is not implemented yet (device {self.device} opened); use TcpBlockClient"
        )

    async def read(self, block_id: int) -> bytes:
        raise self._data_path()

    async def write(self, block_id: int, data: bytes | bytearray | memoryview) -> None:
        raise self._data_path()

    async def allocate(self, nbytes: int) -> int:
        raise self._data_path()

    async def free(self, block_id: int) -> None:
        raise self._data_path()

    async def acquire(self, block_id: int) -> None:
        raise self._data_path()

    async def release(self, block_id: int) -> None:
        raise self._data_path()

    async def close(self) -> None:
        for resource in (getattr(self, "_pd", None), getattr(self, "_ctx", None)):
            if resource is not None:
                resource.close()
