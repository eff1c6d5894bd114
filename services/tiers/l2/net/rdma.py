"""The RDMA adapter behind `BlockTransport` (docs/design.md §1.1, §7): control ops and the handshake
travel on the TCP frame channel (transport.py), data moves by one-sided RDMA READ / WRITE against the peer's
registered pool buffer, so the peer's CPU never touches a read.

`PyverbsEndpoint` / `PyverbsExporter` import pyverbs lazily and raise `RdmaUnavailable` without it or a
device; they have not run on an RDMA device yet (their tests are marked `rdma`). The handshake, the
addresses and the op sequence: docs/tiers.md ("The RDMA adapter").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Self

import numpy as np

from services.tiers.l2.block_pool import BlockPool, PoolExhausted
from services.tiers.l2.blocks import BlockSpan, Located
from services.tiers.l2.net.frames import (
    ClientHello,
    QpInfo,
    RdmaUnavailable,
    RemoteError,
    ServerHello,
    Status,
    TransportError,
    decode_client_hello,
    decode_server_hello,
    encode_client_hello,
    encode_server_hello,
    gid_raw,
    gid_text,
)
from services.tiers.l2.net.rdma_plan import RdmaOp, plan
from services.tiers.l2.net.transport import (
    DEFAULT_TIMEOUT_S,
    BlockTransport,
    FramedBlockClient,
    TcpBlockClient,
)

log = logging.getLogger(__name__)

DEFAULT_BOUNCE_BYTES = 1 << 20
DEFAULT_DEPTH = 64  # work requests in flight on one queue pair
RD_ATOMIC = 16  # outstanding RDMA READs per queue pair (clamped to the device's limit)
# RC retry parameters as in ibv_rc_pingpong and rdma-core's tests.
MIN_RNR_TIMER = 12
TIMEOUT = 14
RETRY_CNT = 7
RNR_RETRY = 7


# --- the endpoint port and the transport ---------------------------------------------------------


class RdmaEndpoint(ABC):
    """One RC queue pair, its CQ and a registered bounce buffer: the verbs the transport needs."""

    bounce_bytes: int
    depth: int

    @abstractmethod
    def local(self) -> QpInfo:
        """This queue pair's info for the peer (a fresh PSN per queue pair)."""

    @abstractmethod
    def connect(self, remote: QpInfo) -> None:
        """INIT -> RTR -> RTS against the peer's queue pair."""

    @abstractmethod
    def post(self, ops: Sequence[RdmaOp], rkey: int) -> None: ...

    @abstractmethod
    def poll(self, max_entries: int) -> list[tuple[int, str | None]]:
        """Completions ready now: (wr_id, None) for success, (wr_id, reason) for a failure."""

    @abstractmethod
    def put(self, offset: int, data: bytes) -> None:
        """Copy into the bounce buffer (a WRITE's source)."""

    @abstractmethod
    def get(self, offset: int, nbytes: int) -> bytes:
        """Copy out of the bounce buffer (a READ's destination)."""

    @abstractmethod
    def reset(self) -> None:
        """A new queue pair (the old one is in error or its peer is gone)."""

    @abstractmethod
    def close(self) -> None: ...


class RdmaBlockTransport(BlockTransport):
    """Blocks of a remote pool by RDMA: control ops (allocate, free, acquire, release, find, info,
    commit, the handshake) on `control`, data by one-sided READ / WRITE on `endpoint`."""

    def __init__(
        self,
        control: FramedBlockClient,
        endpoint: RdmaEndpoint,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        want_write: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.control = control
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.want_write = want_write
        self.clock = clock
        self.region: ServerHello | None = None
        self._lock = asyncio.Lock()
        self.sessions = 0  # handshakes done (1 unless a failure forced a new queue pair)

    @classmethod
    def over_tcp(
        cls,
        host: str,
        port: int,
        *,
        device: str | None = None,
        ib_port: int = 1,
        gid_index: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        want_write: bool = True,
    ) -> Self:
        """A transport to the block server at host:port; `RdmaUnavailable` without pyverbs or a device."""
        endpoint = PyverbsEndpoint(device, port=ib_port, gid_index=gid_index)
        return cls(
            TcpBlockClient(host, port, timeout_s=timeout_s),
            endpoint,
            timeout_s=timeout_s,
            want_write=want_write,
        )

    async def connect(self) -> ServerHello:
        """Shake hands if not yet connected: exchange queue pair info, learn the pool's address and key."""
        if self.region is not None:
            return self.region
        hello = ClientHello(self.endpoint.local(), self.want_write)
        try:
            answer = decode_server_hello(await self.control.hello(encode_client_hello(hello)))
        except ValueError as exc:
            raise TransportError(f"bad RDMA handshake answer: {exc}") from None
        except RemoteError as exc:
            if exc.status is Status.UNSUPPORTED:
                raise RdmaUnavailable(f"the peer does not serve RDMA: {exc.message}") from None
            raise
        self.endpoint.connect(answer.qp)
        self.region = answer
        self.sessions += 1
        return answer

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def _drop_session(self) -> None:
        """After a failed completion: a new queue pair, and a new control connection (the server
        tears its side down when the connection that shook hands closes)."""
        self.region = None
        self.endpoint.reset()
        await self.control.close()

    async def _run(self, batch: Sequence[RdmaOp], rkey: int) -> None:
        self.endpoint.post(batch, rkey)
        pending = {op.wr_id for op in batch}
        deadline = self.clock() + self.timeout_s
        while pending:
            done = self.endpoint.poll(len(pending))
            for wr_id, error in done:
                if error is not None:
                    await self._drop_session()
                    raise TransportError(f"RDMA work request {wr_id} failed: {error}")
                pending.discard(wr_id)
            if not pending:
                return
            if self.clock() > deadline:
                await self._drop_session()
                raise TimeoutError(f"{len(pending)} RDMA work requests not completed in {self.timeout_s} s")
            if not done:
                await asyncio.sleep(0)  # busy-poll, yielding to the loop: sub-ms ops complete in a few turns

    async def _read_spans(self, spans: Sequence[BlockSpan]) -> list[bytes]:
        async with self._lock:
            region = await self.connect()
            ep = self.endpoint
            out: list[bytes] = [b""] * len(spans)
            for batch in plan(spans, region, bounce_bytes=ep.bounce_bytes, depth=ep.depth):
                await self._run(batch, region.rkey)
                for op in batch:
                    out[op.wr_id] = ep.get(op.local_offset, op.length)
            return out

    async def read(self, block_id: int) -> bytes:
        return (await self.read_many([block_id]))[0]

    async def read_many(self, block_ids: Sequence[int]) -> list[bytes]:
        if not block_ids:
            return []
        extents = await self.control.extents(block_ids)  # lengths, and a clear error for a free block
        return await self._read_spans([BlockSpan(e.block_id, e.length) for e in extents])

    async def gather(self, values: Sequence[Sequence[BlockSpan]]) -> list[bytes | None]:
        flat = [s for spans in values for s in spans]
        parts = await self._read_spans(flat) if flat else []
        out: list[bytes | None] = []
        at = 0
        for spans in values:
            out.append(b"".join(parts[at : at + len(spans)]))
            at += len(spans)
        return out

    async def write(self, block_id: int, data: bytes | bytearray | memoryview) -> None:
        payload = bytes(data)
        (extent,) = await self.control.extents([block_id])
        if len(payload) > extent.capacity:
            raise ValueError(f"{len(payload)} bytes do not fit a {extent.capacity} B block")
        async with self._lock:
            region = await self.connect()
            if not region.writable:
                raise RemoteError(Status.REFUSED, "the peer registered its pool read-only")
            ep = self.endpoint
            # One block is one work request (empty data needs none, only the COMMIT).
            span = BlockSpan(block_id, len(payload))
            for batch in plan([span], region, bounce_bytes=ep.bounce_bytes, depth=ep.depth, write=True):
                ep.put(batch[0].local_offset, payload)
                await self._run(batch, region.rkey)
        await self.control.commit(block_id, 0, len(payload))

    async def allocate(self, nbytes: int) -> int:
        return await self.control.allocate(nbytes)

    async def free(self, block_id: int) -> None:
        await self.control.free(block_id)

    async def acquire(self, block_id: int) -> None:
        await self.control.acquire(block_id)

    async def release(self, block_id: int) -> None:
        await self.control.release(block_id)

    async def find_many(self, keys: Sequence[str]) -> list[Located | None]:
        return await self.control.find_many(keys)

    async def close(self) -> None:
        self.region = None
        try:
            self.endpoint.close()
        finally:
            await self.control.close()


# --- pyverbs -------------------------------------------------------------------------------------


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


class _Device:
    """An opened device, port and GID: what both sides need to build RC queue pairs."""

    def __init__(self, device: str | None, port: int, gid_index: int) -> None:
        names = rdma_devices()
        import pyverbs.enums as e
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.e: Any = e
        self.name = device or names[0]
        if self.name not in names:
            raise RdmaUnavailable(f"RDMA device {self.name!r} not found; have {names}")
        self.port = port
        self.gid_index = gid_index
        self.ctx: Any = Context(name=self.name)
        try:
            self.pd: Any = PD(self.ctx)
            attr = self.ctx.query_port(port)
            self.lid = int(attr.lid)
            self.mtu = int(attr.active_mtu)
            dev = self.ctx.query_device()
            self.rd_atomic = max(1, min(RD_ATOMIC, int(dev.max_qp_rd_atom), int(dev.max_qp_init_rd_atom)))
            try:
                self.gid = gid_raw(self.ctx.query_gid(port, gid_index).gid)
            except Exception:  # InfiniBand ports may have no GID table entry: address by LID
                self.gid = bytes(16)
        except BaseException:
            self.ctx.close()
            raise

    def cq(self, depth: int) -> Any:
        from pyverbs.cq import CQ

        return CQ(self.ctx, depth, None, None, 0)

    def rc_qp(self, cq: Any, *, send_depth: int, access: int) -> tuple[Any, int]:
        """A new RC queue pair in INIT (pyverbs moves an RC QP created with a QPAttr there)."""
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        e = self.e
        cap = QPCap(max_send_wr=send_depth, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)
        attr = QPAttr(port_num=self.port)
        attr.qp_access_flags = access
        return QP(self.pd, init, attr), random.getrandbits(24)

    def info(self, qp: Any, psn: int) -> QpInfo:
        return QpInfo(self.gid, int(qp.qp_num), psn, self.lid, self.mtu)

    def to_rts(self, qp: Any, *, psn: int, remote: QpInfo, access: int) -> None:
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr

        attr = QPAttr(port_num=self.port)
        attr.qp_access_flags = access
        attr.path_mtu = min(self.mtu, remote.mtu)
        attr.dest_qp_num = remote.qp_num
        attr.rq_psn = remote.psn  # what the peer sends starts at its PSN (ibv_rc_pingpong's convention)
        attr.sq_psn = psn
        attr.max_dest_rd_atomic = self.rd_atomic
        attr.max_rd_atomic = self.rd_atomic
        attr.min_rnr_timer = MIN_RNR_TIMER
        attr.timeout = TIMEOUT
        attr.retry_cnt = RETRY_CNT
        attr.rnr_retry = RNR_RETRY
        if remote.global_route:
            gr = GlobalRoute(dgid=GID(gid_text(remote.gid)), sgid_index=self.gid_index)
            attr.ah_attr = AHAttr(port_num=self.port, is_global=1, gr=gr, dlid=remote.lid)
        else:
            attr.ah_attr = AHAttr(port_num=self.port, is_global=0, dlid=remote.lid)
        qp.to_rts(attr)

    def close(self, *resources: Any) -> None:
        for r in (*resources, self.pd, self.ctx):
            if r is not None:
                with contextlib.suppress(Exception):
                    r.close()


class PyverbsEndpoint(RdmaEndpoint):
    """The client side: an RC queue pair, a CQ and a bounce buffer registered for local write."""

    def __init__(
        self,
        device: str | None = None,
        *,
        port: int = 1,
        gid_index: int = 0,
        bounce_bytes: int = DEFAULT_BOUNCE_BYTES,
        depth: int = DEFAULT_DEPTH,
    ) -> None:
        self._dev = _Device(device, port, gid_index)
        self.device = self._dev.name
        self.bounce_bytes = bounce_bytes
        self.depth = depth
        self._cq: Any = None
        self._mr: Any = None
        self._qp: Any = None
        try:
            from pyverbs.mr import MR

            self._cq = self._dev.cq(depth)
            self._mr = MR(self._dev.pd, bounce_bytes, self._dev.e.IBV_ACCESS_LOCAL_WRITE)
            self._new_qp()
        except BaseException:
            self.close()
            raise

    def _new_qp(self) -> None:
        self._qp, self._psn = self._dev.rc_qp(
            self._cq, send_depth=self.depth, access=self._dev.e.IBV_ACCESS_LOCAL_WRITE
        )

    def local(self) -> QpInfo:
        return self._dev.info(self._qp, self._psn)

    def connect(self, remote: QpInfo) -> None:
        self._dev.to_rts(self._qp, psn=self._psn, remote=remote, access=self._dev.e.IBV_ACCESS_LOCAL_WRITE)

    def post(self, ops: Sequence[RdmaOp], rkey: int) -> None:
        from pyverbs.wr import SGE, SendWR

        e = self._dev.e
        for op in ops:
            sge = SGE(self._mr.buf + op.local_offset, op.length, self._mr.lkey)
            wr = SendWR(
                wr_id=op.wr_id,
                opcode=e.IBV_WR_RDMA_WRITE if op.write else e.IBV_WR_RDMA_READ,
                num_sge=1,
                sg=[sge],
                send_flags=e.IBV_SEND_SIGNALED,
            )
            wr.set_wr_rdma(rkey, op.remote_addr)
            self._qp.post_send(wr)

    def poll(self, max_entries: int) -> list[tuple[int, str | None]]:
        success = self._dev.e.IBV_WC_SUCCESS
        _, wcs = self._cq.poll(max_entries)
        return [
            (int(wc.wr_id), None if wc.status == success else f"completion status {wc.status}") for wc in wcs
        ]

    def put(self, offset: int, data: bytes) -> None:
        if offset < 0 or offset + len(data) > self.bounce_bytes:
            raise ValueError(f"{len(data)} bytes at {offset} overflow the bounce buffer")
        self._mr.write(data, len(data), offset)

    def get(self, offset: int, nbytes: int) -> bytes:
        if offset < 0 or offset + nbytes > self.bounce_bytes:
            raise ValueError(f"{nbytes} bytes at {offset} overflow the bounce buffer")
        return bytes(self._mr.read(nbytes, offset))

    def reset(self) -> None:
        if self._qp is not None:
            with contextlib.suppress(Exception):
                self._qp.close()
        self._new_qp()

    def close(self) -> None:
        qp, mr, cq = self._qp, self._mr, self._cq
        self._qp = self._mr = self._cq = None
        self._dev.close(qp, mr, cq)


class PyverbsExporter:
    """The server side: registers the pool's host buffer as one memory region and answers HELLO with a
    queue pair in RTS per connection (the transport's `RdmaExporter`)."""

    def __init__(
        self,
        pool: BlockPool,
        device: str | None = None,
        *,
        port: int = 1,
        gid_index: int = 0,
        writable: bool = False,
        max_sessions: int = 64,
    ) -> None:
        if pool.xp is not np:
            raise RdmaUnavailable(
                "the L2 pool is GPU memory: registering device memory (GPUDirect RDMA) is not built; "
                "peers read it over TCP"
            )
        self.pool = pool
        self.writable = writable
        self.max_sessions = max_sessions
        self.sessions = 0
        self._dev = _Device(device, port, gid_index)
        self.device = self._dev.name
        e = self._dev.e
        self._remote_access = e.IBV_ACCESS_REMOTE_READ | (e.IBV_ACCESS_REMOTE_WRITE if writable else 0)
        self._cq: Any = None
        self._mr: Any = None
        try:
            from pyverbs.mr import MR

            buffer = pool.buffer
            if not buffer.flags["C_CONTIGUOUS"]:
                raise RdmaUnavailable("the pool buffer is not contiguous")
            self.addr = int(buffer.ctypes.data)
            access = e.IBV_ACCESS_LOCAL_WRITE | self._remote_access
            try:
                self._mr = MR(self._dev.pd, pool.total_bytes, access, address=self.addr)
            except (
                TypeError
            ) as exc:  # pyverbs before MR(address=...) cannot register a buffer it did not make
                raise RdmaUnavailable(f"this pyverbs cannot register an existing buffer: {exc}") from exc
            self._cq = self._dev.cq(4)  # responder-only queue pairs post nothing; RC still needs a CQ
        except BaseException:
            self.close()
            raise

    def accept(self, hello: bytes) -> tuple[bytes, Callable[[], None]]:
        client = decode_client_hello(hello)
        if self.sessions >= self.max_sessions:
            raise PoolExhausted(f"{self.sessions} RDMA sessions open; the limit is {self.max_sessions}")
        access = self._remote_access if client.write else self._dev.e.IBV_ACCESS_REMOTE_READ
        qp, psn = self._dev.rc_qp(self._cq, send_depth=1, access=access)
        try:
            self._dev.to_rts(qp, psn=psn, remote=client.qp, access=access)
        except BaseException:
            qp.close()
            raise
        self.sessions += 1
        closed = False

        def close() -> None:
            nonlocal closed
            if not closed:
                closed = True
                self.sessions -= 1
                qp.close()

        answer = ServerHello(
            self._dev.info(qp, psn), self.addr, int(self._mr.rkey), self.pool.total_bytes, self.writable
        )
        return encode_server_hello(answer), close

    def close(self) -> None:
        mr, cq = self._mr, self._cq
        self._mr = self._cq = None
        self._dev.close(mr, cq)
