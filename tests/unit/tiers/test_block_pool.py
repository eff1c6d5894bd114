from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.tiers.l2.block_pool import (
    BLOCK_CLASSES,
    PAGE_BYTES,
    UNIT_BYTES,
    BlockPool,
    BlockState,
    BlockStateError,
    PoolExhausted,
    default_array_module,
    fragmentation,
    largest_free_run,
    size_class,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def make_pool(n_pages: int = 4, inactive_after_ms: int = 100) -> tuple[BlockPool, Clock]:
    clock = Clock()
    return BlockPool(n_pages, xp=np, clock=clock, inactive_after_ms=inactive_after_ms), clock


@pytest.mark.parametrize(
    ("nbytes", "cls"),
    [(0, 256), (1, 256), (256, 256), (257, 512), (512, 512), (513, 2048), (2048, 2048)],
)
def test_size_class_is_the_smallest_that_fits(nbytes: int, cls: int) -> None:
    assert size_class(nbytes) == cls


def test_size_class_rejects_oversize() -> None:
    with pytest.raises(ValueError, match="allocate_span"):
        size_class(2049)


@pytest.mark.parametrize(
    ("mask", "run", "frag"),
    [
        ([], 0, 0.0),
        ([0, 0, 0], 0, 0.0),  # nothing free: defined as 0
        ([1, 1, 1, 1], 4, 0.0),  # all free in one run
        ([1, 1, 0, 1], 2, 1 / 3),
        ([1, 0, 1, 0, 1], 1, 2 / 3),
        ([0, 1, 1, 1, 0, 1, 0], 3, 1 / 4),
    ],
)
def test_fragmentation_formula(mask: list[int], run: int, frag: float) -> None:
    free = np.array(mask, dtype=bool)
    assert largest_free_run(free) == run
    assert fragmentation(free) == pytest.approx(frag)


def test_lifecycle_allocated_active_inactive_reclaimed() -> None:
    pool, clock = make_pool()
    b = pool.allocate(100)
    assert pool.info(b).state is BlockState.ALLOCATED
    pool.acquire(b)
    pool.acquire(b)
    assert (pool.info(b).state, pool.info(b).refcount) == (BlockState.ACTIVE, 2)
    pool.release(b)
    pool.release(b)
    clock.now += 99
    assert pool.sweep() == 0  # unreferenced but not yet past the timeout
    clock.now += 1
    assert pool.sweep() == 1
    assert pool.info(b).state is BlockState.INACTIVE
    pool.acquire(b)  # a hit on an Inactive block revives it
    assert pool.info(b).state is BlockState.ACTIVE
    pool.release(b)
    clock.now += 100
    pool.sweep()
    assert pool.reclaim() == [b]
    assert not pool.is_live(b)
    with pytest.raises(BlockStateError, match="not a block"):  # its page went back to the pool
        pool.info(b)


def test_referenced_blocks_never_go_inactive() -> None:
    pool, clock = make_pool()
    b = pool.allocate(10)
    pool.acquire(b)
    clock.now += 10_000
    assert pool.sweep() == 0
    assert pool.reclaim() == []


def test_reclaim_is_least_recently_used_first() -> None:
    pool, clock = make_pool()
    blocks = [pool.allocate(100) for _ in range(3)]
    for b in (blocks[1], blocks[0], blocks[2]):  # use order: 1 oldest, 2 newest
        clock.now += 10
        pool.acquire(b)
        pool.release(b)
    clock.now += 1_000
    pool.sweep()
    assert pool.inactive_lru().tolist() == [blocks[1], blocks[0], blocks[2]]
    assert pool.reclaim(max_blocks=1) == [blocks[1]]


def test_full_pool_reclaims_lru_inactive_to_allocate() -> None:
    pool, clock = make_pool(n_pages=1)
    blocks = [pool.allocate(2048) for _ in range(PAGE_BYTES // 2048)]
    with pytest.raises(PoolExhausted):
        pool.allocate(2048)
    for i, b in enumerate(blocks):
        clock.now += 1
        if i != 3:
            pool.acquire(b)
            pool.release(b)
    pool.acquire(blocks[3])  # stays referenced: must survive
    clock.now += 1_000
    got = pool.allocate(2000)
    assert got == blocks[0]  # the least recently used one made way
    assert pool.info(blocks[3]).state is BlockState.ACTIVE


def test_page_returns_to_the_pool_and_changes_class() -> None:
    pool, _ = make_pool(n_pages=1)
    small = [pool.allocate(200) for _ in range(PAGE_BYTES // 256)]
    with pytest.raises(PoolExhausted):
        pool.allocate(2000)  # the only page is carved into 256 B blocks
    for b in small:
        pool.free(b)
    assert pool.stats().free_pages == 1
    big = pool.allocate(2000)
    assert pool.info(big).capacity == 2048


def test_errors_are_clear() -> None:
    pool, _ = make_pool()
    b = pool.allocate(300)
    with pytest.raises(BlockStateError, match="no reference"):
        pool.release(b)
    pool.acquire(b)
    with pytest.raises(BlockStateError, match="reference"):
        pool.free(b)
    with pytest.raises(ValueError, match="do not fit"):
        pool.write(b, b"x" * 513)
    with pytest.raises(BlockStateError, match="not a block"):
        pool.acquire(b + 1)  # inside the block, not its start
    with pytest.raises(BlockStateError, match="not a block"):
        pool.read(10**9)


def test_write_read_round_trip_and_views() -> None:
    pool, _ = make_pool()
    b = pool.allocate(6)
    pool.write(b, b"abc")
    pool.write(b, np.frombuffer(b"def", np.uint8), offset=3)
    assert pool.read_bytes(b) == b"abcdef"
    view = pool.read(b)
    assert np.shares_memory(view, pool.buffer)
    kv = np.arange(64, dtype=np.float16)
    b2 = pool.allocate(kv.nbytes)
    pool.write(b2, kv)
    np.testing.assert_array_equal(pool.read(b2).view(np.float16), kv)


def test_allocate_span_splits_and_rolls_back() -> None:
    pool, _ = make_pool(n_pages=1)
    span = pool.allocate_span(5000)
    assert [pool.info(b).capacity for b in span] == [2048, 2048, 2048]
    assert sum(pool.info(b).length for b in span) == 5000
    with pytest.raises(PoolExhausted):
        pool.allocate_span(12_000)  # needs 6 blocks, 5 left
    assert len(pool.live_blocks()) == 3  # the partial span was given back


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, 2048)),
        st.tuples(st.sampled_from(["free", "acquire", "release"]), st.integers(0, 10**6)),
        st.tuples(st.just("tick"), st.integers(0, 300)),
        st.tuples(st.just("reclaim"), st.integers(1, 4)),
    ),
    min_size=10,
    max_size=120,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, n_pages=st.integers(1, 3))
def test_allocator_invariants(ops, n_pages: int) -> None:
    pool, clock = make_pool(n_pages=n_pages)
    refs: dict[int, int] = {}  # model: live block -> reference count
    payload: dict[int, bytes] = {}
    for op, arg in ops:
        live = sorted(refs)
        if op == "alloc":
            try:
                b = pool.allocate(arg)
            except PoolExhausted:
                b = -1
                # Only when nothing of that class fits and nothing Inactive is left.
                assert not pool.inactive_lru().size
            for gone in [x for x in refs if not pool.is_live(x)]:
                assert refs.pop(gone) == 0  # reclaimed to make room: never a referenced block
                payload.pop(gone)
            if b < 0:
                check_pool(pool, refs, payload)
                continue
            assert b not in refs or refs[b] == 0
            refs[b] = 0
            payload[b] = bytes([b % 251]) * arg
            pool.write(b, payload[b])
        elif op == "tick":
            clock.now += arg
            pool.sweep()
        elif op == "reclaim":
            for b in pool.reclaim(arg):
                assert refs.pop(b) == 0
                payload.pop(b)
        elif live:
            b = live[arg % len(live)]
            if op == "acquire":
                pool.acquire(b)
                refs[b] += 1
            elif op == "release" and refs[b]:
                pool.release(b)
                refs[b] -= 1
            elif op == "free" and not refs[b]:
                pool.free(b)
                refs.pop(b)
                payload.pop(b)
        check_pool(pool, refs, payload)


def check_pool(pool: BlockPool, refs: dict[int, int], payload: dict[int, bytes]) -> None:
    assert sorted(pool.live_blocks().tolist()) == sorted(refs)
    intervals = sorted((pool.info(b).offset, pool.info(b).offset + pool.info(b).capacity) for b in refs)
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert end <= start, "blocks overlap"
    free_mask = np.ones(pool.total_bytes // UNIT_BYTES, dtype=bool)
    for b in refs:
        info = pool.info(b)
        assert info.capacity in BLOCK_CLASSES
        assert (
            info.offset % info.capacity == 0
            and info.offset // PAGE_BYTES == (info.offset + info.capacity - 1) // PAGE_BYTES
        ), "a block straddles pages"
        assert info.refcount == refs[b]
        if info.refcount:
            assert info.state is BlockState.ACTIVE
        assert pool.read_bytes(b) == payload[b], "a block's bytes were overwritten"
        free_mask[info.offset // UNIT_BYTES : (info.offset + info.capacity) // UNIT_BYTES] = False
    stats = pool.stats()
    assert stats.free_bytes == pool.total_bytes - sum(pool.info(b).capacity for b in refs)
    assert stats.fragmentation == pytest.approx(fragmentation(free_mask))
    assert stats.largest_free_run == largest_free_run(free_mask) * UNIT_BYTES


def test_default_array_module_without_gpu_is_numpy() -> None:
    xp = default_array_module()
    assert xp is np or xp.cuda.is_available()


def _gpu_available() -> bool:
    return default_array_module() is not np


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_available(), reason="needs a CUDA device and CuPy")
def test_cupy_pool_matches_numpy_reference() -> None:
    import cupy

    rng = np.random.default_rng(3)
    pools = [BlockPool(4, xp=np, clock=Clock()), BlockPool(4, xp=cupy, clock=Clock())]
    blocks: list[list[int]] = [[], []]
    for step in range(60):
        size = int(rng.integers(1, 2049))
        data = rng.integers(0, 256, size, dtype=np.uint8)
        for i, pool in enumerate(pools):
            if step % 5 == 4 and blocks[i]:
                pool.free(blocks[i].pop(0))
            try:
                b = pool.allocate(size)
            except PoolExhausted:
                continue
            pool.write(b, data if i == 0 else cupy.asarray(data))
            blocks[i].append(b)
    assert blocks[0] == blocks[1]
    for b in blocks[0]:
        assert pools[0].read_bytes(b) == pools[1].read_bytes(b)
        assert isinstance(pools[1].read(b), cupy.ndarray)
    assert pools[0].stats() == pools[1].stats()


def test_a_payload_over_a_page_takes_one_run_of_whole_pages() -> None:
    pool, _ = make_pool(n_pages=8)
    small = pool.allocate(300)  # carves page 0
    (run,) = pool.allocate_span(3 * PAGE_BYTES + 10)
    assert run == 1 * PAGE_BYTES // UNIT_BYTES and pool.info(run).capacity == 4 * PAGE_BYTES
    data = np.arange(3 * PAGE_BYTES + 10, dtype=np.uint32).astype(np.uint8)
    pool.write(run, data)
    assert np.array_equal(pool.read(run), data)
    assert pool.stats().free_pages == 3
    # A second run does not fit in three free pages; small blocks still do, and the run's pages come
    # back whole when it is freed.
    with pytest.raises(PoolExhausted, match="no run of 4 free pages"):
        pool.allocate_run(4 * PAGE_BYTES)
    pool.allocate(2048)
    pool.free(run)
    assert pool.stats().free_pages >= 4
    assert pool.allocate_run(4 * PAGE_BYTES) == run
    pool.free(small)


def test_a_run_reclaims_inactive_blocks_oldest_first() -> None:
    pool, clock = make_pool(n_pages=4, inactive_after_ms=100)
    a = pool.allocate_run(2 * PAGE_BYTES)
    b = pool.allocate_run(2 * PAGE_BYTES)
    clock.now += 50
    pool.acquire(b)
    pool.release(b)  # b used more recently
    clock.now += 100
    c = pool.allocate_run(2 * PAGE_BYTES)
    assert c == a and pool.is_live(b)  # a, the least recently used, made room; b stayed
    assert pool.info(c).state == BlockState.ALLOCATED


def test_a_shared_pool_is_readable_through_its_segment_and_gone_when_closed() -> None:
    import mmap
    import os

    pool = BlockPool(4, xp=np, shared=True)
    assert pool.segment is not None
    path = os.path.join("/dev/shm", pool.segment)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"  # this user's processes only
    block = pool.allocate_run(PAGE_BYTES + 100)
    data = np.arange(PAGE_BYTES + 100, dtype=np.uint32).astype(np.uint8)
    pool.write(block, data)
    fd = os.open(path, os.O_RDONLY)
    try:
        view = mmap.mmap(fd, pool.total_bytes, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    offset = block * UNIT_BYTES
    assert view[offset : offset + len(data)] == data.tobytes()
    pool.close()
    assert not os.path.exists(path)
    view.close()
    assert BlockPool(1, xp=np).segment is None


def test_a_segment_left_by_a_dead_node_is_removed_by_the_next_pool() -> None:
    import os
    import subprocess
    import sys

    # SIGKILLed with its process group, a node's resource tracker dies too and unlinks nothing: here the
    # segment is taken off the tracker's list, so the child's exit leaves it behind the same way.
    code = (
        "import numpy as np, os; from multiprocessing import resource_tracker; "
        "from services.tiers.l2.block_pool import BlockPool; "
        "p = BlockPool(1, xp=np, shared=True); "
        "resource_tracker.unregister('/' + p.segment, 'shared_memory'); "
        "print(p.segment, flush=True); os._exit(0)"
    )
    name = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = os.path.join("/dev/shm", name)
    assert os.path.exists(path)  # the process died without unlinking it
    BlockPool(1, xp=np, shared=True).close()
    assert not os.path.exists(path)
