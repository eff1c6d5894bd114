"""The L2 block pool (docs/design.md §3.2): one contiguous buffer of 16 KB pages, each page carved
into blocks of a single class (256 B, 512 B or 2 KB) chosen by payload size, and payloads larger than
a page in one block spanning a run of whole pages, read and written in one copy.

Blocks go Allocated -> Active -> Inactive (`inactive_after_ms`) -> reclaimed, least recently used first.
The buffer is CuPy device memory or numpy host memory (`xp`), host memory optionally a POSIX
shared-memory segment (`shared=True`). The lifecycle, fragmentation and the shared segment:
docs/tiers.md ("The L2 block pool").
"""

from __future__ import annotations

import contextlib
import heapq
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from multiprocessing import shared_memory
from types import ModuleType
from typing import Any

import numpy as np

PAGE_BYTES = 16 * 1024
BLOCK_CLASSES = (256, 512, 2048)
UNIT_BYTES = BLOCK_CLASSES[0]  # block id = byte offset // UNIT_BYTES
UNITS_PER_PAGE = PAGE_BYTES // UNIT_BYTES
MAX_BLOCK_BYTES = BLOCK_CLASSES[-1]
RUN_CLASS = PAGE_BYTES  # the class of pages in a run (a block of whole pages)
DEFAULT_INACTIVE_AFTER_MS = 1_000


class BlockState(IntEnum):
    FREE = 0
    ALLOCATED = 1  # handed out, never acquired
    ACTIVE = 2  # acquired at least once; stays Active until unreferenced for the timeout
    INACTIVE = 3  # refs == 0 for inactive_after_ms: data still valid, first in line to be reclaimed


_FREE = int(BlockState.FREE)
_ACTIVE = int(BlockState.ACTIVE)


class PoolExhausted(MemoryError):
    """No free block of the class, no free page, and nothing Inactive left to reclaim."""


class BlockStateError(RuntimeError):
    """The operation is not allowed in the block's state (e.g. acquiring a free block)."""


@dataclass(frozen=True, slots=True)
class BlockInfo:
    block_id: int
    offset: int
    capacity: int
    length: int
    state: BlockState
    refcount: int
    last_use_ms: int


@dataclass(frozen=True, slots=True)
class PoolStats:
    total_bytes: int
    free_bytes: int
    allocated_bytes: int  # block capacity handed out (Allocated, Active or Inactive)
    payload_bytes: int  # bytes actually written into those blocks
    largest_free_run: int
    fragmentation: float
    free_pages: int
    blocks_by_state: dict[str, int]


def default_array_module() -> ModuleType:
    """CuPy when it imports and sees a CUDA device, numpy otherwise."""
    try:
        import cupy

        if cupy.cuda.is_available():
            return cupy
    except Exception:  # a broken CUDA install means "no GPU", not a crash
        pass
    return np


def size_class(nbytes: int) -> int:
    """The smallest block class that holds `nbytes` (docs/design.md §3.2: 256 B / 512 B / 2 KB)."""
    if nbytes < 0:
        raise ValueError(f"negative size {nbytes}")
    for cls in BLOCK_CLASSES:
        if nbytes <= cls:
            return cls
    raise ValueError(f"{nbytes} bytes exceeds the largest block ({MAX_BLOCK_BYTES}); use allocate_span")


def largest_free_run(free_units: np.ndarray) -> int:
    """Length, in units, of the longest run of True in a 1-d boolean mask."""
    if not free_units.any():
        return 0
    edges = np.diff(np.concatenate(([0], free_units.view(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    return int((ends - starts).max())


def fragmentation(free_units: np.ndarray) -> float:
    """(free total - largest free contiguous run) / free total; 0 when nothing is free."""
    free = int(free_units.sum())
    if free == 0:
        return 0.0
    return (free - largest_free_run(free_units)) / free


SEGMENT_PREFIX = "cachemesh-l2-"


def _remove_stale_segments(shm_dir: str = "/dev/shm") -> None:
    """Unlink pool segments whose creating process is gone (a SIGKILLed node never unlinks its own)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(shm_dir):
            if not name.startswith(SEGMENT_PREFIX):
                continue
            try:
                pid = int(name[len(SEGMENT_PREFIX) :].split("-", 1)[0])
                os.kill(pid, 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(shm_dir, name))
            except (ValueError, PermissionError):
                continue


def _as_uint8(data: Any, xp: ModuleType) -> Any:
    """A flat uint8 array of `data`'s bytes in module `xp`, copying across host/device only."""
    if hasattr(data, "__cuda_array_interface__"):
        flat = data.reshape(-1).view("uint8")
        return flat.get() if xp is np else flat
    arr = data if isinstance(data, np.ndarray) else np.frombuffer(memoryview(data).cast("B"), np.uint8)
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return flat if xp is np else xp.asarray(flat)


class BlockPool:
    """Allocator over `n_pages` x 16 KB of one buffer. Block ids are byte offsets / 256."""

    def __init__(
        self,
        n_pages: int,
        *,
        xp: ModuleType | None = None,
        clock: Callable[[], int] | None = None,
        inactive_after_ms: int = DEFAULT_INACTIVE_AFTER_MS,
        shared: bool = False,
    ) -> None:
        if n_pages <= 0:
            raise ValueError(f"n_pages must be positive, got {n_pages}")
        self.xp = xp if xp is not None else default_array_module()
        self.clock = clock or (lambda: time.monotonic_ns() // 1_000_000)
        self.inactive_after_ms = inactive_after_ms
        self.n_pages = n_pages
        self.total_bytes = n_pages * PAGE_BYTES
        self._shm: shared_memory.SharedMemory | None = None
        if shared and self.xp is np:
            _remove_stale_segments()
            # Mode 0600: only this user's processes can map it. Zero-filled by the kernel.
            self._shm = shared_memory.SharedMemory(
                name=f"{SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(4)}",
                create=True,
                size=self.total_bytes,
            )
            self.buffer: Any = np.ndarray(self.total_bytes, dtype=np.uint8, buffer=self._shm.buf)
        else:
            self.buffer = self.xp.zeros(self.total_bytes, dtype=self.xp.uint8)
        n_units = n_pages * UNITS_PER_PAGE
        # Per unit; meaningful at a block's first unit. Host-side on every device.
        self._cap = np.zeros(n_units, dtype=np.int32)  # block capacity in bytes, 0 = no block starts here
        self._state = np.zeros(n_units, dtype=np.uint8)
        self._refs = np.zeros(n_units, dtype=np.int32)
        self._last = np.zeros(n_units, dtype=np.int64)
        self._len = np.zeros(n_units, dtype=np.int32)
        self._unit_free = np.ones(n_units, dtype=bool)
        self._page_cls = np.zeros(n_pages, dtype=np.int32)  # 0 = uncarved
        self._page_used = np.zeros(n_pages, dtype=np.int32)
        self._page_free: list[list[int]] = [[] for _ in range(n_pages)]
        # Lowest addresses first keeps live data packed at the bottom and free space in one run.
        self._free_pages = list(range(n_pages))
        self._partial: dict[int, list[int]] = {cls: [] for cls in BLOCK_CLASSES}

    @property
    def segment(self) -> str | None:
        """The shared-memory segment's name (`/dev/shm/<name>` on Linux), or None."""
        return None if self._shm is None else self._shm.name

    def close(self) -> None:
        """Give the shared segment back (its name is unlinked: mappings that exist stay valid)."""
        if self._shm is not None:
            self.buffer = np.zeros(0, dtype=np.uint8)
            shm, self._shm = self._shm, None
            shm.unlink()
            with contextlib.suppress(BufferError):  # a view handed out earlier still holds the mapping
                shm.close()

    # -- allocation ------------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> int:
        """A block of the smallest class holding `nbytes`; reclaims Inactive blocks (LRU first) when
        full. The block starts Allocated with no references."""
        cls = size_class(nbytes)
        block = self._take(cls)
        if block < 0:
            self.sweep()
            block = self._reclaim_for(cls)
        if block < 0:
            raise PoolExhausted(
                f"no {cls} B block for {nbytes} bytes: {self.free_bytes} bytes free "
                f"(largest run {self.largest_free_run()}), nothing Inactive to reclaim"
            )
        units = cls // UNIT_BYTES
        self._unit_free[block : block + units] = False
        self._state[block] = BlockState.ALLOCATED
        self._refs[block] = 0
        self._len[block] = nbytes
        self._last[block] = self.clock()
        self._page_used[block // UNITS_PER_PAGE] += 1
        return block

    def allocate_span(self, nbytes: int) -> list[int]:
        """Blocks for a payload larger than one block: one run of whole pages above a page, else full
        2 KB blocks, then the smallest tail."""
        if nbytes <= MAX_BLOCK_BYTES:
            return [self.allocate(nbytes)]
        if nbytes > PAGE_BYTES:
            return [self.allocate_run(nbytes)]
        sizes = [MAX_BLOCK_BYTES] * (nbytes // MAX_BLOCK_BYTES)
        if nbytes % MAX_BLOCK_BYTES:
            sizes.append(nbytes % MAX_BLOCK_BYTES)
        blocks: list[int] = []
        try:
            for size in sizes:
                blocks.append(self.allocate(size))
        except PoolExhausted:
            for b in blocks:
                self.free(b)
            raise
        return blocks

    def allocate_run(self, nbytes: int) -> int:
        """One block of consecutive whole pages holding `nbytes` (lowest address first); reclaims
        Inactive blocks (LRU first) until such a run is free."""
        n = max(1, -(-nbytes // PAGE_BYTES))
        first = self._free_run_of(n)
        if first < 0:
            self.sweep()
            for b in self.inactive_lru().tolist():
                self._release_block(b)
                first = self._free_run_of(n)
                if first >= 0:
                    break
        if first < 0:
            raise PoolExhausted(
                f"no run of {n} free pages for {nbytes} bytes: {self.free_bytes} bytes free "
                f"(largest run {self.largest_free_run()}), nothing Inactive to reclaim"
            )
        self._page_cls[first : first + n] = RUN_CLASS
        self._page_used[first : first + n] = 1
        block = first * UNITS_PER_PAGE
        self._cap[block] = n * PAGE_BYTES
        self._unit_free[block : block + n * UNITS_PER_PAGE] = False
        self._state[block] = BlockState.ALLOCATED
        self._refs[block] = 0
        self._len[block] = nbytes
        self._last[block] = self.clock()
        return block

    def _free_run_of(self, n: int) -> int:
        """The first page of the lowest run of `n` uncarved pages, or -1."""
        free = self._page_cls == 0
        edges = np.diff(np.concatenate(([0], free.view(np.int8), [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        fits = np.flatnonzero(ends - starts >= n)
        return int(starts[fits[0]]) if len(fits) else -1

    def _take(self, cls: int) -> int:
        heap = self._partial[cls]
        while heap:
            page = heap[0]
            free = self._page_free[page]
            if self._page_cls[page] != cls or not free:
                heapq.heappop(heap)  # stale: page was released or filled up
                continue
            block = free.pop()
            if not free:
                heapq.heappop(heap)
            return block
        page = -1
        while self._free_pages:
            candidate = heapq.heappop(self._free_pages)
            if self._page_cls[candidate] == 0:  # not taken by a run (or carved) since it was freed
                page = candidate
                break
        if page < 0:
            return -1
        self._page_cls[page] = cls
        step = cls // UNIT_BYTES
        first = page * UNITS_PER_PAGE
        # Reversed so pop() hands out the lowest block first.
        self._page_free[page] = list(range(first + UNITS_PER_PAGE - step, first - 1, -step))
        self._cap[first : first + UNITS_PER_PAGE : step] = cls
        heapq.heappush(self._partial[cls], page)
        return self._take(cls)

    def _release_block(self, block: int) -> None:
        cls = int(self._cap[block])
        self._unit_free[block : block + cls // UNIT_BYTES] = True
        self._state[block] = BlockState.FREE
        self._refs[block] = 0
        self._len[block] = 0
        page = block // UNITS_PER_PAGE
        if cls > MAX_BLOCK_BYTES:  # a run: every page of it is free again
            n = cls // PAGE_BYTES
            self._cap[block] = 0
            self._page_cls[page : page + n] = 0
            self._page_used[page : page + n] = 0
            for p in range(page, page + n):
                heapq.heappush(self._free_pages, p)
            return
        self._page_used[page] -= 1
        if self._page_used[page] == 0:
            # Whole page free again: give it back so any class can carve it.
            first = page * UNITS_PER_PAGE
            self._cap[first : first + UNITS_PER_PAGE] = 0
            self._page_cls[page] = 0
            self._page_free[page] = []
            heapq.heappush(self._free_pages, page)
            return
        free = self._page_free[page]
        free.append(block)
        if len(free) == 1:
            heapq.heappush(self._partial[cls], page)

    def _check(self, block: int) -> None:
        # Plain ints: comparing numpy scalars with the IntEnum costs more than the rest of a read.
        if not (0 <= block < len(self._cap)) or int(self._cap[block]) == 0:
            raise BlockStateError(f"{block} is not a block id")
        if int(self._state[block]) == _FREE:
            raise BlockStateError(f"block {block} is free")

    # -- lifecycle -------------------------------------------------------------------------------

    def acquire(self, block: int) -> None:
        """Take a reference: the block is Active (an Inactive block not yet reclaimed revives)."""
        self._check(block)
        self._refs[block] += 1
        self._state[block] = _ACTIVE
        self._last[block] = self.clock()

    def release(self, block: int) -> None:
        self._check(block)
        if self._refs[block] <= 0:
            raise BlockStateError(f"block {block} has no reference to release")
        self._refs[block] -= 1
        self._last[block] = self.clock()

    def free(self, block: int) -> None:
        """Give an unreferenced block back now (an owner dropping it, or an eviction)."""
        self._check(block)
        if self._refs[block] > 0:
            raise BlockStateError(f"block {block} still has {self._refs[block]} reference(s)")
        self._release_block(block)

    def sweep(self) -> int:
        """Mark unreferenced blocks idle for `inactive_after_ms` Inactive; returns how many."""
        now = self.clock()
        state = self._state
        idle = (
            ((state == BlockState.ALLOCATED) | (state == BlockState.ACTIVE))
            & (self._refs == 0)
            & (now - self._last >= self.inactive_after_ms)
        )
        state[idle] = BlockState.INACTIVE
        return int(idle.sum())

    def inactive_lru(self) -> np.ndarray:
        """Inactive block ids, least recently used first (ties by address)."""
        ids = np.flatnonzero(self._state == BlockState.INACTIVE)
        return ids[np.argsort(self._last[ids], kind="stable")]

    def reclaim(self, max_blocks: int | None = None) -> list[int]:
        """Free Inactive blocks, least recently used first; returns their ids."""
        victims = self.inactive_lru()[:max_blocks].tolist()
        for b in victims:
            self._release_block(b)
        return victims

    def _reclaim_for(self, cls: int) -> int:
        for b in self.inactive_lru().tolist():
            self._release_block(b)
            block = self._take(cls)
            if block >= 0:
                return block
        return -1

    # -- data ------------------------------------------------------------------------------------

    def write(self, block: int, data: Any, offset: int = 0) -> None:
        """Copy bytes (any buffer, or an array of this pool's module) into the block."""
        self._check(block)
        src = _as_uint8(data, self.xp)
        n = int(src.size)
        cap = int(self._cap[block])
        if offset < 0 or offset + n > cap:
            raise ValueError(f"{n} bytes at offset {offset} do not fit a {cap} B block")
        start = block * UNIT_BYTES + offset
        self.buffer[start : start + n] = src
        self._len[block] = max(int(self._len[block]), offset + n)
        self._last[block] = self.clock()

    def mark_written(self, block: int, offset: int, nbytes: int) -> None:
        """Record that `nbytes` at `offset` of the block were written from outside (a one-sided RDMA
        WRITE lands without this process seeing it): the same bookkeeping as `write`."""
        self._check(block)
        cap = int(self._cap[block])
        if offset < 0 or nbytes < 0 or offset + nbytes > cap:
            raise ValueError(f"{nbytes} bytes at offset {offset} do not fit a {cap} B block")
        self._len[block] = max(int(self._len[block]), offset + nbytes)
        self._last[block] = self.clock()

    def read(self, block: int) -> Any:
        """A view (no copy) of the block's payload in the pool's array module."""
        self._check(block)
        start = block * UNIT_BYTES
        return self.buffer[start : start + int(self._len[block])]

    def read_bytes(self, block: int) -> bytes:
        view = self.read(block)
        host = view.get() if self.xp is not np else view  # CuPy: device -> host copy
        return bytes(host.tobytes())

    def is_live(self, block: int) -> bool:
        """True when `block` is a block id in any state but Free."""
        return 0 <= block < len(self._cap) and self._cap[block] > 0 and self._state[block] != BlockState.FREE

    def info(self, block: int) -> BlockInfo:
        self._check(block)
        return BlockInfo(
            block_id=block,
            offset=block * UNIT_BYTES,
            capacity=int(self._cap[block]),
            length=int(self._len[block]),
            state=BlockState(int(self._state[block])),
            refcount=int(self._refs[block]),
            last_use_ms=int(self._last[block]),
        )

    # -- metrics ---------------------------------------------------------------------------------

    @property
    def free_bytes(self) -> int:
        return int(self._unit_free.sum()) * UNIT_BYTES

    def largest_free_run(self) -> int:
        return largest_free_run(self._unit_free) * UNIT_BYTES

    def fragmentation(self) -> float:
        return fragmentation(self._unit_free)

    def live_blocks(self) -> np.ndarray:
        """Ids of every block not Free."""
        return np.flatnonzero((self._cap > 0) & (self._state != BlockState.FREE))

    def stats(self) -> PoolStats:
        live = self.live_blocks()
        states = self._state[live]
        return PoolStats(
            total_bytes=self.total_bytes,
            free_bytes=self.free_bytes,
            allocated_bytes=int(self._cap[live].sum()),
            payload_bytes=int(self._len[live].sum()),
            largest_free_run=self.largest_free_run(),
            fragmentation=self.fragmentation(),
            free_pages=int((self._page_cls == 0).sum()),
            blocks_by_state={s.name: int((states == s).sum()) for s in BlockState if s != BlockState.FREE},
        )
