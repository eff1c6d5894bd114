"""Cosine-similarity search for L1 semantic lookup: exact search for small tables, an HNSW index above
a size threshold (backend chosen by `bench/vector_index.py`), both behind `VectorIndex`.

Vectors are L2-normalised on the way in, so cosine is an inner product. Ids are small non-negative
integers (L1 uses its descriptor slots). `SemanticIndex` keeps the exact store as the source of truth,
builds the ANN graph from it once `ann_threshold` entries are live, and re-ranks the ANN's candidates
with exact cosine, so the similarities it reports are exact whichever path answered.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

# Exact search scans n x dim floats per query: at 384-d its p50 matches hnswlib's (~100 us) around
# 4-8k rows on this 2-core machine, and it needs no graph upkeep below that. Below half the threshold
# the ANN graph is dropped again.
DEFAULT_ANN_THRESHOLD = 4096
# Candidates taken from the ANN before exact re-ranking: covers entries whose tolerance rejects the
# top-1 and the ANN's small rank errors.
DEFAULT_CANDIDATES = 8
_SCORE_CELLS = 1 << 22  # query x row similarities computed per chunk in exact search (16 MiB)


def normalize(vectors: npt.ArrayLike, dim: int | None = None) -> np.ndarray:
    """Rows scaled to unit L2 norm, as C-contiguous float32. Rejects zero and non-finite rows."""
    v = np.array(vectors, dtype=np.float32, ndmin=2, copy=True, order="C")
    if v.ndim != 2 or (dim is not None and v.shape[1] != dim):
        raise ValueError(f"expected vectors of shape (n, {dim}), got {v.shape}")
    norms = np.linalg.norm(v, axis=1)
    if not np.all(np.isfinite(norms)) or np.any(norms == 0):
        raise ValueError("vectors must be finite and nonzero to have a cosine")
    v /= norms[:, None]
    return v


def cosine_topk(queries: Any, vectors: Any, k: int, xp: ModuleType = np) -> tuple[Any, Any]:
    """Top-k rows of `vectors` by inner product with each query (unit rows: cosine), best first.

    Array-module agnostic (numpy reference; CuPy runs the same code). Returns (rows, sims) of shape
    (n_queries, min(k, n_rows)).
    """
    sims = queries @ vectors.T
    k = min(k, vectors.shape[0])
    if k == 0:
        return xp.zeros((queries.shape[0], 0), dtype=xp.int64), xp.zeros((queries.shape[0], 0), sims.dtype)
    if k == 1:
        rows = xp.argmax(sims, axis=1)[:, None]
    else:
        part = xp.argpartition(-sims, k - 1, axis=1)[:, :k]
        order = xp.argsort(-xp.take_along_axis(sims, part, axis=1), axis=1)
        rows = xp.take_along_axis(part, order, axis=1)
    return rows.astype(xp.int64), xp.take_along_axis(sims, rows, axis=1)


class VectorIndex(ABC):
    """Cosine top-k over vectors keyed by small non-negative int ids; adding a present id replaces it."""

    name: str
    supports_remove: bool = True

    def __init__(self, dim: int) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.dim = dim

    @abstractmethod
    def add(self, ids: npt.ArrayLike, vectors: npt.ArrayLike) -> None: ...

    @abstractmethod
    def remove(self, ids: npt.ArrayLike) -> None:
        """Drop `ids`; ids not present are ignored."""

    @abstractmethod
    def search(self, queries: npt.ArrayLike, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(ids, sims), each (n_queries, k), best first; missing results are id -1, sim -inf."""

    @abstractmethod
    def __len__(self) -> int: ...


def _as_ids(ids: npt.ArrayLike) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(ids, dtype=np.int64))
    if arr.ndim != 1 or (arr.size and arr.min() < 0):
        raise ValueError("ids must be a 1-d array of non-negative integers")
    return arr


def _padded(ids: np.ndarray, sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    if ids.shape[1] == k:
        return ids, sims
    n = ids.shape[0]
    out_ids = np.full((n, k), -1, dtype=np.int64)
    out_sims = np.full((n, k), -np.inf, dtype=np.float32)
    out_ids[:, : ids.shape[1]] = ids
    out_sims[:, : sims.shape[1]] = sims
    return out_ids, out_sims


class ExactCosineIndex(VectorIndex):
    """Brute-force cosine over a compact row matrix; removal swaps the last row into the hole."""

    name = "exact"

    def __init__(self, dim: int, initial_rows: int = 1024) -> None:
        super().__init__(dim)
        self._vecs = np.zeros((max(1, initial_rows), dim), dtype=np.float32)
        self._ids = np.full(max(1, initial_rows), -1, dtype=np.int64)
        self._row_of = np.full(max(1, initial_rows), -1, dtype=np.int64)  # id -> row
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __contains__(self, id_: object) -> bool:
        return bool(
            isinstance(id_, int | np.integer) and 0 <= id_ < len(self._row_of) and self._row_of[id_] >= 0
        )

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: self._n]

    @property
    def matrix(self) -> np.ndarray:
        """The live unit rows, aligned with `ids` (a view: do not keep across mutations)."""
        return self._vecs[: self._n]

    def _grow(self, rows: int, max_id: int) -> None:
        if rows > len(self._vecs):
            cap = max(rows, 2 * len(self._vecs))
            self._vecs = np.resize(self._vecs, (cap, self.dim))
            self._ids = np.resize(self._ids, cap)
        if max_id >= len(self._row_of):
            old = len(self._row_of)
            self._row_of = np.resize(self._row_of, max(max_id + 1, 2 * old))
            self._row_of[old:] = -1

    def add(self, ids: npt.ArrayLike, vectors: npt.ArrayLike) -> None:
        id_arr = _as_ids(ids)
        vecs = normalize(vectors, self.dim)
        if len(id_arr) != len(vecs):
            raise ValueError(f"{len(id_arr)} ids for {len(vecs)} vectors")
        if len(np.unique(id_arr)) != len(id_arr):
            raise ValueError("duplicate ids in one add")
        if not len(id_arr):
            return
        self._grow(self._n + len(id_arr), int(id_arr.max()))
        rows = self._row_of[id_arr]
        new = rows < 0
        rows[new] = self._n + np.arange(int(new.sum()))
        self._n += int(new.sum())
        self._vecs[rows] = vecs
        self._ids[rows] = id_arr
        self._row_of[id_arr] = rows

    def remove(self, ids: npt.ArrayLike) -> None:
        for id_ in _as_ids(ids).tolist():
            if id_ >= len(self._row_of) or (row := int(self._row_of[id_])) < 0:
                continue
            last = self._n - 1
            if row != last:
                moved = int(self._ids[last])
                self._vecs[row] = self._vecs[last]
                self._ids[row] = moved
                self._row_of[moved] = row
            self._ids[last] = -1
            self._row_of[id_] = -1
            self._n = last

    def vectors(self, ids: npt.ArrayLike) -> np.ndarray:
        """Stored unit vectors of `ids` (zeros for absent ids)."""
        id_arr = np.asarray(ids, dtype=np.int64)
        valid = (id_arr >= 0) & (id_arr < len(self._row_of))
        rows = np.full(id_arr.shape, -1, dtype=np.int64)
        rows[valid] = self._row_of[id_arr[valid]]
        out = self._vecs[np.maximum(rows, 0)]
        out[rows < 0] = 0.0
        return out

    def search(self, queries: npt.ArrayLike, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        q = normalize(queries, self.dim)
        if self._n == 0 or k <= 0:
            return _padded(np.zeros((len(q), 0), np.int64), np.zeros((len(q), 0), np.float32), max(k, 0))
        step = max(1, _SCORE_CELLS // self._n)
        ids, sims = [], []
        for start in range(0, len(q), step):
            rows, s = cosine_topk(q[start : start + step], self.matrix, k)
            ids.append(self._ids[rows])
            sims.append(s)
        return _padded(np.concatenate(ids), np.concatenate(sims), k)


class HnswlibIndex(VectorIndex):
    """HNSW from hnswlib (inner product on unit vectors); `remove` marks deleted, slots are reused.

    Defaults from bench/vector_index.py at 100k x 384: M=16, ef_construction=128; ef=64 reaches
    recall@1 >= 0.95 on clustered data (near-duplicate queries need 32, uniform random vectors 128).
    """

    name = "hnswlib-hnsw"

    def __init__(
        self,
        dim: int,
        *,
        m: int = 16,
        ef_construction: int = 128,
        ef: int = 64,
        initial_capacity: int = 1024,
        threads: int = -1,
    ) -> None:
        super().__init__(dim)
        import hnswlib  # imported lazily: L1 without ANN needs no native library

        self._index = hnswlib.Index(space="ip", dim=dim)
        # Without replace_deleted, re-adding a deleted label revives its slot: L1 reuses its ids, so
        # the graph never holds more slots than distinct ids.
        self._index.init_index(max_elements=initial_capacity, ef_construction=ef_construction, M=m)
        self._index.set_ef(ef)
        self.threads = threads  # for batches (-1: all cores); a single query always runs inline
        self._live: set[int] = set()
        self._known: set[int] = set()

    def __len__(self) -> int:
        return len(self._live)

    @property
    def ef(self) -> int:
        return int(self._index.ef)

    @ef.setter
    def ef(self, value: int) -> None:
        self._index.set_ef(value)

    def add(self, ids: npt.ArrayLike, vectors: npt.ArrayLike) -> None:
        id_arr = _as_ids(ids)
        vecs = normalize(vectors, self.dim)
        id_list = id_arr.tolist()
        fresh = len(set(id_list) - self._known)
        if len(self._known) + fresh > self._index.get_max_elements():
            self._index.resize_index(max(2 * self._index.get_max_elements(), len(self._known) + fresh))
        self._index.add_items(vecs, id_arr, num_threads=1 if len(id_arr) == 1 else self.threads)
        self._live.update(id_list)
        self._known.update(id_list)

    def remove(self, ids: npt.ArrayLike) -> None:
        for id_ in _as_ids(ids).tolist():
            if id_ in self._live:
                self._index.mark_deleted(id_)
                self._live.discard(id_)

    def search(self, queries: npt.ArrayLike, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        q = normalize(queries, self.dim)
        kk = min(k, len(self._live))
        if kk <= 0:
            return _padded(np.zeros((len(q), 0), np.int64), np.zeros((len(q), 0), np.float32), max(k, 0))
        threads = 1 if len(q) == 1 else self.threads
        while True:
            try:
                labels, dists = self._index.knn_query(q, k=kk, num_threads=threads)
                break
            except RuntimeError:
                # Fewer than kk live nodes reachable (many deletions): ask for fewer.
                if kk == 1:
                    return _padded(np.zeros((len(q), 0), np.int64), np.zeros((len(q), 0), np.float32), k)
                kk = max(1, kk // 2)
        return _padded(labels.astype(np.int64), (1.0 - dists).astype(np.float32), k)


AnnFactory = Callable[[int], VectorIndex]


class SemanticIndex(VectorIndex):
    """Exact store always; an ANN graph on top while `len >= ann_threshold`; ANN hits re-ranked exactly."""

    name = "semantic"

    def __init__(
        self,
        dim: int,
        *,
        ann_threshold: int = DEFAULT_ANN_THRESHOLD,
        ann_factory: AnnFactory | None = None,
        candidates: int = DEFAULT_CANDIDATES,
    ) -> None:
        super().__init__(dim)
        self.exact = ExactCosineIndex(dim)
        self.ann_threshold = ann_threshold
        self.ann_factory: AnnFactory = ann_factory or (lambda d: HnswlibIndex(d))
        self.candidates = candidates
        self.ann: VectorIndex | None = None

    def __len__(self) -> int:
        return len(self.exact)

    def __contains__(self, id_: object) -> bool:
        return id_ in self.exact

    def add(self, ids: npt.ArrayLike, vectors: npt.ArrayLike) -> None:
        id_arr = _as_ids(ids)
        vecs = normalize(vectors, self.dim)
        self.exact.add(id_arr, vecs)
        if self.ann is not None:
            self.ann.add(id_arr, vecs)
        elif len(self.exact) >= self.ann_threshold:
            self.ann = self.ann_factory(self.dim)
            self.ann.add(self.exact.ids.copy(), self.exact.matrix.copy())

    def remove(self, ids: npt.ArrayLike) -> None:
        id_arr = _as_ids(ids)
        self.exact.remove(id_arr)
        if self.ann is not None:
            if len(self.exact) < self.ann_threshold // 2:
                self.ann = None  # small again: exact search is cheaper than keeping the graph
            else:
                self.ann.remove(id_arr)

    def vectors(self, ids: npt.ArrayLike) -> np.ndarray:
        return self.exact.vectors(ids)

    def search(self, queries: npt.ArrayLike, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        if self.ann is None:
            return self.exact.search(queries, k)
        q = normalize(queries, self.dim)
        cand, _ = self.ann.search(q, max(k, self.candidates))
        # Exact re-rank: the ANN may work on quantised vectors and may order close candidates wrongly.
        sims = np.einsum("ncd,nd->nc", self.exact.vectors(cand), q)
        sims[cand < 0] = -np.inf
        order = np.argsort(-sims, axis=1)[:, :k]
        ids = np.take_along_axis(cand, order, axis=1)
        best = np.take_along_axis(sims, order, axis=1).astype(np.float32)
        ids[~np.isfinite(best)] = -1
        return _padded(ids, best, k)
