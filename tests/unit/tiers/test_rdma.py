"""The RDMA transport's pure parts, without a device: the handshake messages, the address arithmetic,
the batching of work requests, and the op sequence (INFO then READ; INFO, WRITE, COMMIT; a failed
completion drops the session and the next call shakes hands again) run over an in-memory fabric whose
reads and writes bypass the server's request handler, as one-sided RDMA does. pyverbs itself is only
exercised by the `rdma`-marked tests, which need a device."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from services.tiers.entry import Entry, EntryMeta
from services.tiers.l2.block_pool import UNIT_BYTES, BlockPool
from services.tiers.l2.blocks import BlockSpan
from services.tiers.l2.net.frames import (
    CLIENT_HELLO_BYTES,
    SERVER_HELLO_BYTES,
    ClientHello,
    QpInfo,
    RdmaUnavailable,
    RemoteError,
    ServerHello,
    Status,
    decode_client_hello,
    decode_server_hello,
    encode_client_hello,
    encode_server_hello,
    gid_raw,
    gid_text,
)
from services.tiers.l2.net.rdma import PyverbsEndpoint, PyverbsExporter, RdmaBlockTransport, rdma_available
from services.tiers.l2.net.rdma_plan import RdmaOp, plan, remote_address
from services.tiers.l2.net.transport import LocalBlockClient
from services.tiers.l2.store import L2Store
from tests.unit.tiers.fakes import Clock, MemoryEndpoint, MemoryExporter, MemoryFabric

GID = bytes(range(16))
QP = QpInfo(GID, 0x1234, 0xABCDE, 7, 3)
REGION = ServerHello(QP, 0x7000_0000, 0x99, 8 * 16 * 1024, False)


# --- messages -------------------------------------------------------------------------------------


def test_hellos_round_trip() -> None:
    client = ClientHello(QP, write=True)
    raw = encode_client_hello(client)
    assert len(raw) == CLIENT_HELLO_BYTES and raw[:4] == b"CMR1"
    assert decode_client_hello(raw) == client
    server = ServerHello(QP, 0x7F12_3456_0000, 0xDEADBEEF, 1 << 20, writable=False)
    raw = encode_server_hello(server)
    assert len(raw) == SERVER_HELLO_BYTES
    assert decode_server_hello(raw) == server


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda raw: raw[:-1], "bytes"),
        (lambda raw: b"XXXX" + raw[4:], "magic"),
        (lambda raw: raw[:4] + b"\x02" + raw[5:], "version"),
        (lambda raw: raw[:22] + struct.pack("<I", 0) + raw[26:], "QP number"),  # qp_num 0
        (lambda raw: raw[:26] + struct.pack("<I", 1 << 24) + raw[30:], "PSN"),
        (lambda raw: raw[:32] + b"\x09" + raw[33:], "MTU"),
    ],
)
def test_bad_client_hellos_are_refused(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    raw = mutate(encode_client_hello(ClientHello(QP, write=False)))
    with pytest.raises(ValueError, match=message):
        decode_client_hello(raw)


def test_a_server_hello_must_name_a_sane_region() -> None:
    raw = bytearray(encode_server_hello(REGION))
    raw[-8:] = struct.pack("<Q", 100)  # not a whole number of 256 B units
    with pytest.raises(ValueError, match="region"):
        decode_server_hello(bytes(raw))


def test_gids_in_pyverbs_text_form() -> None:
    text = gid_text(bytes.fromhex("fe800000000000000202c9fffe000001"))
    assert text == "fe80:0000:0000:0000:0202:c9ff:fe00:0001"
    assert gid_raw(text) == bytes.fromhex("fe800000000000000202c9fffe000001")
    with pytest.raises(ValueError):
        gid_raw("fe80::1")
    assert not QpInfo(bytes(16), 1, 0, 1, 1).global_route and QP.global_route


# --- addresses and batches -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("block", "nbytes", "offset", "expected"),
    [
        (0, 256, 0, 0x7000_0000),
        (3, 100, 0, 0x7000_0000 + 3 * UNIT_BYTES),
        (8, 2048, 0, 0x7000_0000 + 8 * UNIT_BYTES),
        (511, 256, 0, 0x7000_0000 + 511 * UNIT_BYTES),  # the last unit of 8 pages
        (4, 10, 6, 0x7000_0000 + 4 * UNIT_BYTES + 6),
    ],
)
def test_remote_address(block: int, nbytes: int, offset: int, expected: int) -> None:
    assert remote_address(REGION, block, nbytes, offset) == expected


@pytest.mark.parametrize(("block", "nbytes", "offset"), [(512, 1, 0), (511, 257, 0), (-1, 1, 0), (0, 1, -1)])
def test_remote_address_stays_inside_the_pool(block: int, nbytes: int, offset: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        remote_address(REGION, block, nbytes, offset)


def test_plan_packs_spans_into_the_bounce_buffer_and_the_queue_depth() -> None:
    spans = [
        BlockSpan(0, 2048),
        BlockSpan(8, 2048),
        BlockSpan(16, 0),
        BlockSpan(17, 300),
        BlockSpan(20, 1000),
    ]
    batches = plan(spans, REGION, bounce_bytes=4096, depth=8)
    assert [[op.wr_id for op in b] for b in batches] == [[0, 1], [3, 4]]  # the empty span needs no request
    assert [(op.local_offset, op.length) for op in batches[1]] == [(0, 300), (300, 1000)]
    assert batches[0][1] == RdmaOp(1, False, 2048, REGION.addr + 8 * UNIT_BYTES, 2048)
    by_depth = plan([BlockSpan(i, 10) for i in range(5)], REGION, bounce_bytes=4096, depth=2)
    assert [len(b) for b in by_depth] == [2, 2, 1]
    with pytest.raises(ValueError, match="bounce"):
        plan([BlockSpan(0, 2048)], REGION, bounce_bytes=1024, depth=2)


# --- the op sequence over the in-memory fabric ---------------------------------------------------


def rig(
    *, writable: bool = False, bounce_bytes: int = 4096, depth: int = 4, clock: Clock | None = None
) -> tuple[RdmaBlockTransport, LocalBlockClient, MemoryEndpoint, MemoryExporter, L2Store]:
    pool = BlockPool(4, xp=np)
    store = L2Store(pool)
    fabric = MemoryFabric()
    exporter = MemoryExporter(fabric, pool, writable=writable)
    control = LocalBlockClient(pool, directory=store, writable=writable, rdma=exporter)
    endpoint = MemoryEndpoint(fabric, bounce_bytes=bounce_bytes, depth=depth)
    transport = RdmaBlockTransport(
        control, endpoint, timeout_s=1.0, **({"clock": lambda: clock.ms / 1000} if clock else {})
    )
    return transport, control, endpoint, exporter, store


async def test_find_then_gather_reads_one_sided() -> None:
    transport, control, endpoint, exporter, store = rig(bounce_bytes=4096, depth=2)
    blob = np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8).tobytes()  # 2 KB + 2 KB + 904 B
    store.put(Entry(EntryMeta(key="kv", kind="kv_block", model="m"), blob))
    loc = await transport.find("kv")
    assert loc is not None and [s.length for s in loc.spans] == [2048, 2048, 904]
    (got,) = await transport.gather([loc.spans])
    assert got == blob
    assert exporter.accepted == 1 and control.requests["HELLO"] == 1
    assert control.requests["READ"] == 0, "data never went through the request handler"
    assert endpoint.batches == [2, 1]  # 4 KB bounce buffer, depth 2: both 2 KB blocks, then the tail
    assert await transport.find("absent") is None


async def test_read_asks_info_for_the_length_then_reads() -> None:
    transport, control, endpoint, _, _ = rig(writable=True)
    block = await transport.allocate(300)
    await control.write(block, b"x" * 300)
    assert await transport.read(block) == b"x" * 300
    assert control.requests["INFO"] == 1 and endpoint.posted[-1].length == 300
    assert await transport.read_many([]) == []
    await control.free(block)
    with pytest.raises(RemoteError) as err:
        await transport.read(block)  # INFO says why before any READ is posted
    assert err.value.status is Status.BLOCK_STATE and len(endpoint.posted) == 1


async def test_write_is_info_write_commit() -> None:
    transport, control, endpoint, _, _ = rig(writable=True)
    block = await transport.allocate(2048)
    await transport.write(block, b"kv" * 600)
    assert endpoint.posted[-1].write and endpoint.posted[-1].length == 1200
    assert control.requests["COMMIT"] == 1
    assert control.pool.read_bytes(block)[:1200] == b"kv" * 600  # landed, and its length recorded
    assert control.pool.info(block).length == 2048  # allocated for 2048: the longer of the two
    small = await transport.allocate(10)
    await transport.write(small, b"")
    assert control.pool.info(small).length == 10
    with pytest.raises(ValueError, match="fit"):
        await transport.write(small, b"y" * 300)


async def test_a_read_only_pool_refuses_rdma_writes() -> None:
    transport, _control, _endpoint, _, _ = rig(writable=False)
    with pytest.raises(RemoteError) as err:
        await transport.allocate(10)
    assert err.value.status is Status.REFUSED
    await transport.connect()
    assert transport.region is not None and not transport.region.writable
    with pytest.raises(RemoteError) as err:
        await transport.write(0, b"x")  # block 0 is free: INFO refuses first
    assert err.value.status is Status.BLOCK_STATE


async def test_a_failed_completion_drops_the_session_and_the_next_call_shakes_hands_again() -> None:
    transport, _control, endpoint, exporter, store = rig()
    store.put(Entry(EntryMeta(key="k", kind="prompt", model="m"), b"v" * 100))
    loc = await transport.find("k")
    assert loc is not None
    await transport.connect()
    exporter.rkey = 0x1  # as if the region were re-registered: the next READ faults remotely
    with pytest.raises(Exception, match="remote access error"):
        await transport.gather([loc.spans])
    assert transport.region is None and endpoint.resets == 1
    exporter.rkey = 0xBEEF
    assert await transport.gather([loc.spans]) == [b"v" * 100]
    assert transport.sessions == 2 and exporter.accepted == 2


async def test_completions_that_never_come_time_out() -> None:
    clock = Clock()
    transport, _, endpoint, _, store = rig(clock=clock)
    store.put(Entry(EntryMeta(key="k", kind="prompt", model="m"), b"v" * 100))
    loc = await transport.find("k")
    assert loc is not None
    endpoint.hold = True
    original = endpoint.poll

    def poll_and_tick(n: int) -> list[tuple[int, str | None]]:
        clock.advance(300)  # each empty poll costs 300 ms of the 1 s budget
        return original(n)

    endpoint.poll = poll_and_tick  # type: ignore[method-assign]
    with pytest.raises(TimeoutError, match="not completed"):
        await transport.gather([loc.spans])
    assert transport.region is None


async def test_a_peer_without_rdma_says_so() -> None:
    pool = BlockPool(1, xp=np)
    transport = RdmaBlockTransport(LocalBlockClient(pool), MemoryEndpoint(MemoryFabric()))
    with pytest.raises(RdmaUnavailable, match="does not serve RDMA"):
        await transport.connect()


async def test_one_rdma_session_per_connection() -> None:
    transport, control, endpoint, _, _ = rig()
    await transport.connect()
    with pytest.raises(RemoteError) as err:
        await control.hello(encode_client_hello(ClientHello(endpoint.local(), False)))
    assert err.value.status is Status.BAD_REQUEST
    await transport.close()
    assert endpoint.closed


# --- pyverbs ------------------------------------------------------------------------------------


@pytest.mark.skipif(rdma_available(), reason="an RDMA device exists here")
def test_without_a_device_pyverbs_adapters_fail_clearly() -> None:
    assert not rdma_available()
    with pytest.raises(RdmaUnavailable, match=r"pyverbs|RDMA device"):
        PyverbsEndpoint()
    with pytest.raises(RdmaUnavailable, match=r"pyverbs|RDMA device"):
        PyverbsExporter(BlockPool(1, xp=np))


def test_a_gpu_pool_is_not_registered() -> None:
    class DevicePool:
        xp = object()  # anything but numpy: device memory

    with pytest.raises(RdmaUnavailable, match="GPU"):
        PyverbsExporter(DevicePool())  # type: ignore[arg-type]
