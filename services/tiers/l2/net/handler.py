"""What a block server answers, sans I/O: one request frame applied to a `BlockPool` (FIND through a key
directory, HELLO through an RDMA exporter, AUTH against the mesh token), so its semantics are testable
without sockets. `transport.py` runs it per connection; `LocalBlockClient` calls it in process."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Protocol

from services.tiers.l2.block_pool import BlockPool, BlockStateError, PoolExhausted
from services.tiers.l2.blocks import Located
from services.tiers.l2.net.frames import (
    MUTATING_OPS,
    Frame,
    Op,
    ProtocolError,
    RdmaUnavailable,
    Status,
    decode_allocate,
    decode_commit,
    decode_find_key,
    encode_info,
    encode_located,
)


class KeyDirectory(Protocol):
    """What a block server consults for FIND (the node's L2 store)."""

    def locate(self, key: str) -> Located | None: ...


class RdmaExporter(Protocol):
    """The server side of the RDMA handshake (rdma.py): takes a client's HELLO payload, sets up a queue
    pair against the registered pool, returns the answer and a function that tears that pair down."""

    def accept(self, hello: bytes) -> tuple[bytes, Callable[[], None]]: ...


def handle_request(
    pool: BlockPool, req: Frame, *, directory: KeyDirectory | None = None, writable: bool = True
) -> Frame:
    """Apply one request to the pool. HELLO is connection-scoped and answered by `answer`."""

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
            return reply(payload=encode_info(info.capacity, info.length, info.state, info.refcount))
        if req.op is Op.HELLO:
            return reply(Status.UNSUPPORTED, payload=b"HELLO is answered per connection")
        if req.op is Op.WRITE:
            pool.write(req.block_id, req.payload)
            return reply()
        if req.op is Op.ALLOCATE:
            return reply(block_id=pool.allocate(decode_allocate(req.payload)))
        if req.op is Op.COMMIT:
            pool.mark_written(req.block_id, *decode_commit(req.payload))
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
    except (ProtocolError, ValueError) as exc:  # a malformed payload, or a size or range the pool refuses
        return reply(Status.BAD_REQUEST, payload=str(exc).encode())


def _find(directory: KeyDirectory | None, req: Frame, reply: Callable[..., Frame]) -> Frame:
    if directory is None:
        return reply(Status.UNSUPPORTED, payload=b"this server has no key directory (no L2 store)")
    located = directory.locate(decode_find_key(req.payload))
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
