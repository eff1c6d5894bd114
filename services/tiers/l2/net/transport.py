"""Reading and writing blocks in another node's L2 pool (docs/design.md §1.1): the `BlockTransport` port,
its TCP adapter (asyncio streams carrying the frames of `frames.py`) that every node has, and an
in-process adapter over the same request handler (`handler.py`); the pyverbs RDMA adapter (`rdma.py`)
uses the framed client as its control channel.

Requests on one connection are answered in order; `exchange` pipelines them (in chunks, so neither side
blocks writing while the other is not reading).
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

from services.tiers.l2.block_pool import BlockPool
from services.tiers.l2.blocks import BlockSpan, Located
from services.tiers.l2.net.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    FRAME_HEADER,
    BlockExtent,
    ConnectionClosed,
    Frame,
    FrameTooLarge,
    Op,
    ProtocolError,
    RemoteError,
    Request,
    Status,
    check_payload,
    decode_frame_header,
    decode_info,
    decode_located,
    encode_allocate,
    encode_commit,
    encode_find_key,
    encode_frame,
    remote_error,
)
from services.tiers.l2.net.handler import KeyDirectory, RdmaExporter, answer, authenticate, unauthorized

DEFAULT_TIMEOUT_S = 5.0
# A server gives a frame this long to arrive once its first byte has, and a client this long to take
# an answer: a peer that stalls mid-frame or stops reading (slowloris) is hung up on, not waited for.
DEFAULT_STALL_TIMEOUT_S = 5.0
# Requests written before their answers are read: bounds what either side buffers (64 x 2 KB reads).
PIPELINE_DEPTH = 64


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
                raise remote_error(resp)
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
        return (await self._call([(Op.ALLOCATE, 0, encode_allocate(nbytes))]))[0].block_id

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
        for resp in await self.exchange([(Op.FIND, 0, encode_find_key(k)) for k in keys]):
            if resp.status is Status.NOT_FOUND:
                out.append(None)
            elif resp.status is not Status.OK:
                raise remote_error(resp)
            else:
                out.append(decode_located(resp.payload))
        return out

    async def extents(self, block_ids: Sequence[int]) -> list[BlockExtent]:
        """INFO for each block, pipelined."""
        if not block_ids:
            return []
        responses = await self._call([(Op.INFO, b, b"") for b in block_ids])
        return [decode_info(b, resp.payload) for b, resp in zip(block_ids, responses, strict=True)]

    async def commit(self, block_id: int, offset: int, nbytes: int) -> None:
        await self._call([(Op.COMMIT, block_id, encode_commit(offset, nbytes))])

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
                raise remote_error(bad)
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
            check_payload(payload, self.max_frame_bytes)
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


async def _read_frame(
    reader: asyncio.StreamReader, max_frame_bytes: int, stall_timeout_s: float | None = None
) -> Frame:
    """The next frame; with `stall_timeout_s`, the connection may idle between frames for as long as it
    likes, but a frame once begun must be complete within that time (TimeoutError otherwise)."""
    try:
        if stall_timeout_s is None:
            raw = await reader.readexactly(FRAME_HEADER.size)
        else:
            first = await reader.readexactly(1)
            async with asyncio.timeout(stall_timeout_s):
                return await _finish_frame(
                    reader, first + await reader.readexactly(FRAME_HEADER.size - 1), max_frame_bytes
                )
    except asyncio.IncompleteReadError as exc:
        raise ConnectionClosed("connection closed by peer") from exc
    return await _finish_frame(reader, raw, max_frame_bytes)


async def _finish_frame(reader: asyncio.StreamReader, raw: bytes, max_frame_bytes: int) -> Frame:
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
    with `token`, a connection must open with AUTH carrying it. A frame that stalls half sent, or an
    answer the client does not take, for `stall_timeout_s` closes that connection."""

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
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    ) -> None:
        self.pool = pool
        self.host = host
        self.stall_timeout_s = stall_timeout_s
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

        async def reply(frame: Frame) -> None:
            writer.write(encode_frame(frame))
            async with asyncio.timeout(self.stall_timeout_s):  # a client that stops reading
                await writer.drain()

        try:
            while True:
                try:
                    req = await _read_frame(reader, self.max_frame_bytes, self.stall_timeout_s)
                except ConnectionClosed:
                    return
                except ProtocolError as exc:
                    # The stream is out of sync after a bad header: say why, then hang up.
                    status = Status.FRAME_TOO_LARGE if isinstance(exc, FrameTooLarge) else Status.BAD_REQUEST
                    await reply(Frame(Op.READ, status, 0, 0, str(exc).encode()))
                    return
                self.requests[req.op.name] += 1
                if req.op is Op.AUTH or not authed:
                    resp = authenticate(req, self._token) if req.op is Op.AUTH else unauthorized(req)
                    authed = resp.status is Status.OK
                    await reply(resp)
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
                await reply(resp)
        except (ConnectionError, TimeoutError, asyncio.CancelledError):
            pass  # the connection goes; the server keeps serving the others
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
                        raise remote_error(resp)
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
            check_payload(payload, self.max_frame_bytes)
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
                raise remote_error(resp)
            out.append(resp)
        return out
