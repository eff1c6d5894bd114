"""The L1 tier (docs/design.md §1.1): an in-process cache answering exact keys from a cuckoo table and
near-duplicate prompts by cosine similarity, with TTLs, byte and entry bounds, and evictions decided by a
`Policy` (LRU by default; the heat policy drives it the same way).

Every entry owns a descriptor slot `s` in [0, max_entries): per-slot numpy columns hold its expiry,
similarity tolerance and size, its value lives at value reference `s`, and its embedding (if any) is
row `s` of the semantic index. The cuckoo table maps the key hash to those three references.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from policies.base import AccessMeta, Eviction, Policy
from policies.recency.lru import LRU
from schemas.descriptor import DEFAULT_SIMILARITY_FLOOR
from services.tiers.l1.cuckoo import CuckooFull, CuckooTable, key_hash, key_hashes
from services.tiers.l1.vector_index import (
    DEFAULT_ANN_THRESHOLD,
    DEFAULT_CANDIDATES,
    AnnFactory,
    SemanticIndex,
    normalize,
)

NEVER = np.iinfo(np.int64).max


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class L1Hit:
    key: str
    value: Any
    similarity: float


@dataclass(frozen=True, slots=True)
class L1Stats:
    entries: int
    bytes_used: int
    exact_hits: int
    semantic_hits: int
    misses: int
    evictions: dict[str, int]


def value_size(value: Any) -> int:
    """Bytes a value occupies, for the kinds L1 holds; anything else needs an explicit size_bytes."""
    if isinstance(value, bytes | bytearray):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    raise TypeError(f"cannot size a {type(value).__name__}; pass size_bytes")


class L1Cache:
    """Exact + semantic in-process cache.

    Capacity: `capacity_bytes` is the policy's budget (an entry's charge is its value plus embedding
    bytes); `max_entries` bounds the entry count. The `Policy` interface only evicts to make room in
    its own units, so the entry bound is enforced through it: every entry is charged at least
    capacity_bytes // (max_entries + 1) + 1, so the policy never holds more than `max_entries`
    entries, whichever policy it is. The price: when small entries mix with large ones the cache may
    evict before either bound is strictly reached. A `policy` passed in must count bytes and have
    capacity `capacity_bytes`. Not thread-safe: one event loop (or one thread) owns an L1.
    """

    def __init__(
        self,
        *,
        dim: int | None = None,
        capacity_bytes: int = 256 << 20,
        max_entries: int = 100_000,
        policy: Policy | None = None,
        clock: Callable[[], int] = monotonic_ms,
        default_similarity_tolerance: float = DEFAULT_SIMILARITY_FLOOR,
        ann_threshold: int = DEFAULT_ANN_THRESHOLD,
        ann_factory: AnnFactory | None = None,
        candidates: int = DEFAULT_CANDIDATES,
        hasher: Callable[[str], int] = key_hash,
    ) -> None:
        if max_entries <= 0 or capacity_bytes <= 0:
            raise ValueError("capacity_bytes and max_entries must be positive")
        self.policy = policy if policy is not None else LRU(capacity_bytes)
        if self.policy.capacity != capacity_bytes:
            raise ValueError(f"policy capacity {self.policy.capacity} != capacity_bytes {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.max_entries = max_entries
        # The smallest charge c with (max_entries + 1) * c > capacity: one entry too many never fits.
        self.min_charge = capacity_bytes // (max_entries + 1) + 1
        self.clock = clock
        self.default_similarity_tolerance = default_similarity_tolerance
        self.candidates = candidates
        self._hasher = hasher
        self.dim = dim
        self.index = (
            SemanticIndex(dim, ann_threshold=ann_threshold, ann_factory=ann_factory, candidates=candidates)
            if dim is not None
            else None
        )
        self._table = CuckooTable.for_capacity(max_entries)
        n = max_entries
        self._keys: list[str | None] = [None] * n
        # key -> slot, for the scalar probes (get, peek, remove): a dict lookup is a tenth of a cuckoo
        # probe from Python (a blake2b hash and numpy reads) and stays cheap when the CPU's caches are
        # cold, as they are for a request that arrives alone. The cuckoo table serves the vectorised
        # batch probes (`get_many`).
        self._slots: dict[str, int] = {}
        self._values: list[Any] = [None] * n
        self._models: list[str | None] = [None] * n
        self._kh = np.zeros(n, dtype=np.uint64)
        self._expires = np.full(n, NEVER, dtype=np.int64)
        self._tolerance = np.zeros(n, dtype=np.float32)
        self._size = np.zeros(n, dtype=np.int64)
        self._free = list(range(n - 1, -1, -1))  # stack: low slots first keeps columns dense
        self._bytes = 0
        self._exact_hits = self._semantic_hits = self._misses = 0
        self._evictions: Counter[str] = Counter()

    # -- introspection ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.max_entries - len(self._free)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._slot(key) >= 0

    def keys(self) -> list[str]:
        return [k for k in self._keys if k is not None]

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def stats(self) -> L1Stats:
        return L1Stats(
            entries=len(self),
            bytes_used=self._bytes,
            exact_hits=self._exact_hits,
            semantic_hits=self._semantic_hits,
            misses=self._misses,
            evictions=dict(self._evictions),
        )

    def _slot(self, key: str) -> int:
        return self._slots.get(key, -1)

    # -- writes ----------------------------------------------------------------------------------

    def put(
        self,
        key: str,
        value: Any,
        *,
        size_bytes: int | None = None,
        embedding: npt.ArrayLike | None = None,
        ttl_hint_ms: int | None = None,
        similarity_tolerance: float | None = None,
        model: str | None = None,
        meta: AccessMeta | None = None,
    ) -> list[Eviction]:
        """Admit `key` (replacing any previous value) and return what left to make room; the list
        holds `Eviction(key, "rejected")` when the policy declined the newcomer."""
        if ttl_hint_ms is not None and ttl_hint_ms <= 0:
            raise ValueError(f"ttl_hint_ms must be positive, got {ttl_hint_ms}")
        tolerance = (
            self.default_similarity_tolerance if similarity_tolerance is None else similarity_tolerance
        )
        if not 0.0 <= tolerance <= 1.0:
            raise ValueError(f"similarity_tolerance must be in [0, 1], got {tolerance}")
        vec = None
        if embedding is not None:
            if self.index is None:
                raise ValueError("this L1 was built without dim: semantic entries are disabled")
            vec = normalize(embedding, self.dim)
        if value is None:
            raise ValueError("None cannot be cached: get() returns None for a miss")
        size = value_size(value) if size_bytes is None else size_bytes
        if vec is not None:
            size += vec.nbytes
        now = self.clock()
        kh = self._hasher(key)
        found = self._table.get(kh)
        if found is not None:
            # Same key: an update. A different key with the same 64-bit hash: it makes way.
            old = self._keys[found.desc]
            assert old is not None
            self.policy.on_remove(old)
            self._drop(found.desc)
        if meta is None and ttl_hint_ms is not None:
            meta = AccessMeta(ttl_ms=ttl_hint_ms)
        decisions = self.policy.on_miss(key, now, max(size, self.min_charge), meta)
        admitted = True
        for ev in decisions:
            if ev.key == key:
                admitted = False
                self._evictions[ev.reason] += 1
            else:
                self._evict_resident(ev)
        if not admitted:
            return decisions
        if not self._free:
            self.policy.on_remove(key)
            raise RuntimeError("L1 slot table exhausted: the policy admitted more than max_entries")
        s = self._free.pop()
        try:
            self._table.put(kh, s, s, s if vec is not None else -1)
        except CuckooFull:
            # Beyond the sized load factor only after unlucky walks: double the buckets and retry.
            self._table = self._table.resized(self._table.n_buckets * 2)
            self._table.put(kh, s, s, s if vec is not None else -1)
        self._keys[s] = key
        self._slots[key] = s
        self._values[s] = value
        self._models[s] = model
        self._kh[s] = kh
        self._expires[s] = NEVER if ttl_hint_ms is None else now + ttl_hint_ms
        self._tolerance[s] = tolerance
        self._size[s] = size
        self._bytes += size
        if vec is not None and self.index is not None:
            self.index.add([s], vec)
        return decisions

    def _drop(self, s: int) -> None:
        """Forget slot `s` everywhere but in the policy."""
        self._table.delete(int(self._kh[s]))
        if self.index is not None and s in self.index:
            self.index.remove([s])
        self._bytes -= int(self._size[s])
        del self._slots[self._keys[s]]  # type: ignore[arg-type]
        self._keys[s] = None
        self._values[s] = None
        self._models[s] = None
        self._kh[s] = 0
        self._expires[s] = NEVER
        self._size[s] = 0
        self._free.append(s)

    def _evict_resident(self, ev: Eviction) -> None:
        s = self._slot(ev.key) if isinstance(ev.key, str) else -1
        if s >= 0:
            self._drop(s)
            self._evictions[ev.reason] += 1

    def apply_evictions(self, evictions: Sequence[Eviction]) -> None:
        """Carry out decisions a policy made on its own (e.g. a heat re-score): the policy already
        forgot these keys, so it is not told again."""
        for ev in evictions:
            self._evict_resident(ev)

    def remove(self, key: str, reason: str = "removed") -> bool:
        """Drop `key` for a reason outside the policy (delete, invalidation, context end, expiry)."""
        s = self._slot(key)
        if s < 0:
            return False
        self.policy.on_remove(key)
        self._drop(s)
        self._evictions[reason] += 1
        return True

    def expire(self) -> list[Eviction]:
        """Sweep every entry past its TTL (reads also expire lazily)."""
        now = self.clock()
        gone = []
        for s in np.flatnonzero(self._expires <= now).tolist():
            key = self._keys[s]
            assert key is not None
            self.remove(key, "expired")
            gone.append(Eviction(key, "expired"))
        return gone

    def similar_keys(self, embedding: npt.ArrayLike, threshold: float) -> list[str]:
        """Keys of every entry whose embedding has cosine >= `threshold` with `embedding`, read-only.
        Exact scan: invalidations are rare and must not miss."""
        if self.index is None or not len(self.index):
            return []
        q = normalize(embedding, self.dim)[0]
        exact = self.index.exact
        slots = exact.ids[exact.matrix @ q >= threshold].tolist()
        return [k for k in (self._keys[s] for s in slots) if k is not None]

    def invalidate_similar(self, embedding: npt.ArrayLike, threshold: float) -> list[str]:
        """Semantic invalidation (docs/design.md §1.1): drop every entry whose embedding has cosine >=
        `threshold` with `embedding`."""
        keys = self.similar_keys(embedding, threshold)
        for key in keys:
            self.remove(key, "invalidated")
        return keys

    # -- reads -----------------------------------------------------------------------------------

    def _live(self, s: int, now: int) -> bool:
        if self._expires.item(s) > now:
            return True
        key = self._keys[s]
        assert key is not None
        self.remove(key, "expired")
        return False

    def peek(self, key: str) -> Any | None:
        """The value under `key` without counting an access or telling the policy (expired: None)."""
        s = self._slot(key)
        if s < 0 or self._expires.item(s) <= self.clock():
            return None
        return self._values[s]

    def touch(self, key: str) -> bool:
        """Count a use of `key` in the policy without reading it (a heat keep-alive)."""
        if self._slot(key) < 0:
            return False
        self.policy.on_hit(key, self.clock())
        return True

    def get(self, key: str) -> Any | None:
        """The value cached under exactly `key`, or None."""
        s = self._slots.get(key, -1)
        if s < 0:
            self._misses += 1
            return None
        now = self.clock()
        if self._expires.item(s) <= now:
            self.remove(key, "expired")
            self._misses += 1
            return None
        self.policy.on_hit(key, now)
        self._exact_hits += 1
        return self._values[s]

    def semantic_candidates(
        self,
        embeddings: npt.ArrayLike,
        *,
        min_similarity: float = 0.0,
        entry_floor: bool = True,
        floor_margin: float = 0.0,
        model: str | None = None,
    ) -> list[list[L1Hit]]:
        """Per query, the live entries (of `model`) at or above `min_similarity` (and, with
        `entry_floor`, their own tolerance less `floor_margin`), best first: candidates for a match
        decision. Nothing is counted as a hit and the policy is not told until `note_semantic_hit`; a
        query without a candidate counts as a miss."""
        q = np.asarray(embeddings, dtype=np.float32)
        if self.index is None or not len(self.index):
            self._misses += len(q)
            return [[] for _ in range(len(q))]
        ids, sims = self.index.search(q, min(self.candidates, len(self.index)))
        need = np.full(ids.shape, np.float32(min_similarity), dtype=np.float32)
        if entry_floor:
            need = np.maximum(need, self._tolerance[np.maximum(ids, 0)] - np.float32(floor_margin))
        ok = (ids >= 0) & (sims >= need)
        now = self.clock()
        out: list[list[L1Hit]] = []
        for row in range(ids.shape[0]):
            found = []
            for c in np.flatnonzero(ok[row]).tolist():
                s = int(ids[row, c])
                key = self._keys[s]
                if key is None or (model is not None and self._models[s] != model) or not self._live(s, now):
                    continue
                found.append(L1Hit(key, self._values[s], float(sims[row, c])))
            self._misses += not found
            out.append(found)
        return out

    def note_semantic_hit(self, key: str) -> None:
        """A candidate of `semantic_candidates` was served: count it and tell the policy."""
        if self._slot(key) >= 0:
            self.policy.on_hit(key, self.clock())
            self._semantic_hits += 1

    def get_many(self, keys: Sequence[str]) -> list[Any | None]:
        """Exact lookups for a batch: one vectorised probe of the cuckoo table."""
        if not keys:
            return []
        khs = (
            key_hashes(list(keys))
            if self._hasher is key_hash
            else np.fromiter((self._hasher(k) for k in keys), np.uint64, len(keys))
        )
        found, desc, _, _ = self._table.get_many(khs)
        now = self.clock()
        live = found & (self._expires[np.maximum(desc, 0)] > now)
        out: list[Any | None] = []
        for key, s, ok, hit in zip(keys, desc.tolist(), live.tolist(), found.tolist(), strict=True):
            if hit and self._keys[s] == key:
                if ok:
                    self.policy.on_hit(key, now)
                    self._exact_hits += 1
                    out.append(self._values[s])
                    continue
                self.remove(key, "expired")
            self._misses += 1
            out.append(None)
        return out
