"""The L2 tier: encoded values kept in the block pool (docs/design.md §1.1, §3.2), by exact key, least
recently used out first when the pool is full.

Each value spans blocks of `BlockPool` (2 KB blocks, then the smallest tail class). The store holds one
reference on every block it owns, so the pool's own reclaimer (which only takes unreferenced, Inactive
blocks) never frees them behind its back; eviction is this store's LRU. Embeddings sit in an exact
cosine index beside the map, so semantic invalidation reaches L2 too. `locate` is what the node's block
server answers FIND with, so other nodes can read a value out of this pool (its spans and a crc32 to
check them against). Pure: no I/O, one owner thread.
"""

from __future__ import annotations

import heapq
import zlib
from collections import Counter, OrderedDict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from services.tiers.entry import Entry, EntryMeta
from services.tiers.l1.vector_index import ExactCosineIndex, normalize
from services.tiers.l2.block_pool import BlockPool, PoolExhausted
from services.tiers.l2.blocks import BlockSpan, Located


@dataclass(slots=True)
class _Resident:
    blocks: list[int]
    nbytes: int
    meta: EntryMeta
    vec_id: int  # row id in the cosine index, -1 without an embedding
    spans: tuple[BlockSpan, ...]
    crc32: int


@dataclass(frozen=True, slots=True)
class L2Stats:
    entries: int
    payload_bytes: int
    pool_bytes: int
    free_bytes: int
    fragmentation: float
    hits: int
    misses: int
    evictions: dict[str, int]
    device: str
    served_remote: int  # FINDs from other nodes answered with an entry


class L2Store:
    def __init__(self, pool: BlockPool, *, dim: int | None = None, max_value_bytes: int = 256 * 1024) -> None:
        self.pool = pool
        self.max_value_bytes = max_value_bytes
        self._entries: OrderedDict[str, _Resident] = OrderedDict()
        self._index = ExactCosineIndex(dim) if dim is not None else None
        self.dim = dim
        self._free_vec_ids: list[int] = []
        self._next_vec_id = 0
        self._key_of_vec: dict[int, str] = {}
        # (wall-clock expiry ms, key, updated_at_ms) of entries with a TTL; stale rows are skipped.
        self._ttl: list[tuple[int, str, int]] = []
        self._bytes = 0
        self._hits = self._misses = 0
        self._served_remote = 0
        self._evictions: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    # -- writes ----------------------------------------------------------------------------------

    def put(self, entry: Entry) -> bool:
        """Store (or replace) `entry`; evicts least recently used entries to make room. False when the
        value is over `max_value_bytes` or larger than the whole pool."""
        key = entry.key
        self.remove(key, reason="replaced")
        n = len(entry.blob)
        if n > self.max_value_bytes or n > self.pool.total_bytes:
            return False
        while True:
            try:
                blocks = self.pool.allocate_span(max(n, 1))
                break
            except PoolExhausted:
                if not self._entries:
                    return False
                victim = next(iter(self._entries))
                self.remove(victim, reason="capacity")
        view = memoryview(entry.blob)
        off = 0
        spans = []
        for b in blocks:
            cap = self.pool.info(b).capacity
            chunk = view[off : off + cap]
            if len(chunk):
                self.pool.write(b, chunk)
            self.pool.acquire(b)
            spans.append(BlockSpan(b, len(chunk)))
            off += len(chunk)
        vec_id = -1
        emb = entry.meta.embedding
        if emb is not None and self._index is not None:
            vec_id = self._free_vec_ids.pop() if self._free_vec_ids else self._next_vec()
            self._index.add([vec_id], normalize(emb, self.dim))
            self._key_of_vec[vec_id] = key
        self._entries[key] = _Resident(blocks, n, entry.meta, vec_id, tuple(spans), zlib.crc32(entry.blob))
        self._bytes += n
        expires = entry.meta.expires_at_ms
        if expires is not None:
            heapq.heappush(self._ttl, (expires, key, entry.meta.updated_at_ms))
        return True

    def _next_vec(self) -> int:
        self._next_vec_id += 1
        return self._next_vec_id - 1

    def remove(self, key: str, reason: str = "removed") -> bool:
        resident = self._entries.pop(key, None)
        if resident is None:
            return False
        for b in resident.blocks:
            self.pool.release(b)
            self.pool.free(b)
        if resident.vec_id >= 0 and self._index is not None:
            self._index.remove([resident.vec_id])
            self._key_of_vec.pop(resident.vec_id, None)
            self._free_vec_ids.append(resident.vec_id)
        self._bytes -= resident.nbytes
        if reason != "replaced":
            self._evictions[reason] += 1
        return True

    def expire(self, now_ms: int) -> list[str]:
        """Drop every entry whose wall-clock TTL has passed at `now_ms`."""
        gone = []
        while self._ttl and self._ttl[0][0] <= now_ms:
            _, key, updated = heapq.heappop(self._ttl)
            resident = self._entries.get(key)
            if resident is not None and resident.meta.updated_at_ms == updated:
                self.remove(key, "expired")
                gone.append(key)
        if len(self._ttl) > 2 * len(self._entries) + 1024:  # replaced entries left stale rows behind
            self._ttl = [t for t in self._ttl if self._current(t[1], t[2])]
            heapq.heapify(self._ttl)
        return gone

    def _current(self, key: str, updated_at_ms: int) -> bool:
        resident = self._entries.get(key)
        return resident is not None and resident.meta.updated_at_ms == updated_at_ms

    def touch(self, key: str) -> bool:
        """Count a use of `key` (LRU order) without reading it."""
        if key not in self._entries:
            return False
        self._entries.move_to_end(key)
        return True

    def similar_keys(self, embedding: npt.ArrayLike, threshold: float) -> list[str]:
        """Keys whose embedding has cosine >= `threshold` with `embedding` (exact scan)."""
        if self._index is None or not len(self._index):
            return []
        q = normalize(embedding, self.dim)[0]
        ids = self._index.ids[self._index.matrix @ q >= threshold].tolist()
        return [self._key_of_vec[i] for i in ids if i in self._key_of_vec]

    # -- reads -----------------------------------------------------------------------------------

    def locate(self, key: str) -> Located | None:
        """Where `key`'s value lies in the pool (for another node's FIND); counts as a use."""
        resident = self._entries.get(key)
        if resident is None:
            return None
        self._entries.move_to_end(key)
        self._served_remote += 1
        return Located(resident.meta, resident.spans, resident.nbytes, resident.crc32)

    def locate_local(self, key: str) -> Located | None:
        """Where `key`'s value lies in the pool, for a reader on this host mapping it (counts as a hit)."""
        resident = self._entries.get(key)
        if resident is None:
            self._misses += 1
            return None
        self._entries.move_to_end(key)
        self._hits += 1
        return Located(resident.meta, resident.spans, resident.nbytes, resident.crc32)

    def peek_meta(self, key: str) -> EntryMeta | None:
        resident = self._entries.get(key)
        return None if resident is None else resident.meta

    def get(self, key: str) -> Entry | None:
        """The entry under `key` (its bytes copied out of the pool), or None."""
        resident = self._entries.get(key)
        if resident is None:
            self._misses += 1
            return None
        self._entries.move_to_end(key)
        for b in resident.blocks:
            self.pool.acquire(b)  # refreshes last use; the pin stays at one reference
            self.pool.release(b)
        self._hits += 1
        return Entry(resident.meta, self._read(resident))

    def _read(self, resident: _Resident) -> bytes:
        if len(resident.blocks) == 1:
            return self.pool.read_bytes(resident.blocks[0])[: resident.nbytes]
        parts = [self.pool.read(b) for b in resident.blocks]
        if self.pool.xp is np:
            return np.concatenate(parts).tobytes()[: resident.nbytes]
        return b"".join(self.pool.read_bytes(b) for b in resident.blocks)[: resident.nbytes]

    def keys(self) -> list[str]:
        return list(self._entries)

    def stats(self) -> L2Stats:
        pool = self.pool
        return L2Stats(
            entries=len(self._entries),
            payload_bytes=self._bytes,
            pool_bytes=pool.total_bytes,
            free_bytes=pool.free_bytes,
            fragmentation=pool.fragmentation(),
            hits=self._hits,
            misses=self._misses,
            evictions=dict(self._evictions),
            device="gpu" if pool.xp is not np else "host",
            served_remote=self._served_remote,
        )
