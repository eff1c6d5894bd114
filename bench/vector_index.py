"""Which ANN backend serves L1 semantic lookup: usearch vs hnswlib vs faiss (HNSW, IVF) vs exact numpy.

For each data set (uniform random unit vectors, a clustered mixture) and query set (`near`: a stored
vector plus noise at cosine ~0.93, what a paraphrase looks like; `fresh`: new draws from the same
distribution), every backend is built once, its search knob swept until recall@1 against exact search
reaches --target-recall, and at that setting the table reports build time, single-query p50/p99
(one thread, through the `VectorIndex` adapter L1 uses), batched queries/s (all threads), recall@1, and
recall@1 after deleting 10% of the ids. Deletions are checked, not assumed: a backend that cannot
remove filters tombstones at search time and says so.

    python -m bench.vector_index                       # 100k x 384, both data sets (minutes)
    python -m bench.vector_index --n 20000 --datasets clustered --backends usearch hnswlib
"""

from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from services.tiers.l1.vector_index import (
    ExactCosineIndex,
    HnswlibIndex,
    VectorIndex,
    _as_ids,
    _padded,
    normalize,
)

NEAR_COSINE = 0.93  # a paraphrase that an entry with similarity_tolerance 0.92 should answer
CLUSTER_COSINE = 0.75  # members of one cluster sit at about this cosine from its centre


# -- data ------------------------------------------------------------------------------------------


def _noisy(base: np.ndarray, cosine: float, rng: np.random.Generator) -> np.ndarray:
    """Unit vectors at about `cosine` from each row of `base` (noise norm sigma = tan(arccos c))."""
    sigma = np.sqrt(1.0 / cosine**2 - 1.0)
    noise = rng.standard_normal(base.shape, dtype=np.float32) * (sigma / np.sqrt(base.shape[1]))
    return normalize(base + noise)


def make_dataset(
    name: str, n: int, dim: int, n_queries: int, seed: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    if name == "uniform":
        data = normalize(rng.standard_normal((n, dim), dtype=np.float32))
        fresh = normalize(rng.standard_normal((n_queries, dim), dtype=np.float32))
    elif name == "clustered":
        # Zipf-sized clusters: a few popular topics, a long tail, like prompts hitting a cache.
        n_clusters = max(1, n // 100)
        centres = normalize(rng.standard_normal((n_clusters, dim), dtype=np.float32))
        weights = 1.0 / np.arange(1, n_clusters + 1) ** 0.8
        weights /= weights.sum()
        data = _noisy(centres[rng.choice(n_clusters, n, p=weights)], CLUSTER_COSINE, rng)
        fresh = _noisy(centres[rng.choice(n_clusters, n_queries, p=weights)], CLUSTER_COSINE, rng)
    else:
        raise ValueError(f"unknown dataset {name!r}")
    near = _noisy(data[rng.choice(n, n_queries, replace=False)], NEAR_COSINE, rng)
    return data, {"near": near, "fresh": fresh}


# -- adapters for the backends not chosen for L1 ------------------------------------------------------


class UsearchIndex(VectorIndex):
    """usearch HNSW (inner product on unit vectors); `remove` deletes from the graph."""

    name = "usearch-hnsw"

    def __init__(
        self,
        dim: int,
        *,
        connectivity: int = 16,
        expansion_add: int = 128,
        expansion_search: int = 64,
        dtype: str = "f32",
        threads: int = 0,
    ) -> None:
        super().__init__(dim)
        from usearch.index import Index  # imported lazily: L1 without ANN needs no native library

        self._index = Index(
            ndim=dim,
            metric="ip",
            dtype=dtype,
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=expansion_search,
        )
        self.threads = threads

    def __len__(self) -> int:
        return len(self._index)

    @property
    def expansion_search(self) -> int:
        return int(self._index.expansion_search)

    @expansion_search.setter
    def expansion_search(self, value: int) -> None:
        self._index.expansion_search = value  # type: ignore[misc]  # the stub lacks the setter

    def add(self, ids: npt.ArrayLike, vectors: npt.ArrayLike) -> None:
        id_arr = _as_ids(ids)
        vecs = normalize(vectors, self.dim)
        present = self._index.contains(id_arr) if len(self._index) else np.zeros(len(id_arr), bool)
        if np.any(present):
            self._index.remove(id_arr[present])
        self._index.add(id_arr.astype(np.uint64), vecs, threads=self.threads)

    def remove(self, ids: npt.ArrayLike) -> None:
        id_arr = _as_ids(ids)
        if len(id_arr) and len(self._index):
            self._index.remove(id_arr.astype(np.uint64))

    def search(self, queries: npt.ArrayLike, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        q = normalize(queries, self.dim)
        if not len(self._index) or k <= 0:
            return _padded(np.zeros((len(q), 0), np.int64), np.zeros((len(q), 0), np.float32), max(k, 0))
        m = self._index.search(q, k, threads=self.threads)
        keys = np.asarray(m.keys, dtype=np.int64).reshape(len(q), -1)
        with np.errstate(invalid="ignore"):  # unfilled result slots carry NaN distances
            sims = (1.0 - np.asarray(m.distances, dtype=np.float32)).reshape(len(q), -1)
        # One query comes back as `Matches` (trimmed to what was found), several as `BatchMatches`.
        counts = np.asarray(getattr(m, "counts", [keys.shape[1]])).reshape(len(q), 1)
        filled = np.arange(keys.shape[1])[None, :] < counts
        return _padded(np.where(filled, keys, -1), np.where(filled, sims, -np.inf).astype(np.float32), k)


class FaissHnswIndex(VectorIndex):
    """faiss IndexHNSWFlat: no removal from the graph, so deletes are tombstones filtered at search."""

    name = "faiss-hnsw"
    supports_remove = False

    def __init__(self, dim: int, *, m: int = 16, ef_construction: int = 128, ef: int = 64) -> None:
        super().__init__(dim)
        import faiss

        self._faiss = faiss
        self._index: Any = faiss.IndexIDMap(faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT))
        hnsw: Any = faiss.downcast_index(self._index.index)
        hnsw.hnsw.efConstruction = ef_construction
        self.ef = ef
        self._dead: set[int] = set()
        self._n = 0

    def __len__(self) -> int:
        return self._n - len(self._dead)

    def add(self, ids: npt.ArrayLike, vectors: npt.ArrayLike) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        self._index.add_with_ids(normalize(vectors, self.dim), ids)
        self._n += len(ids)

    def remove(self, ids: npt.ArrayLike) -> None:
        self._dead.update(np.asarray(ids, dtype=np.int64).tolist())

    def search(self, queries: npt.ArrayLike, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        f = self._faiss
        params = f.SearchParametersHNSW(efSearch=self.ef)
        if self._dead:
            params.sel = f.IDSelectorNot(f.IDSelectorBatch(np.fromiter(self._dead, np.int64)))
        sims, ids = self._index.search(normalize(queries, self.dim), k, params=params)
        return _padded(ids, sims, k)


class FaissIvfIndex(VectorIndex):
    """faiss IndexIVFFlat (inner product): k-means coarse quantiser, trained on the first add."""

    name = "faiss-ivf"

    def __init__(self, dim: int, *, nlist: int = 1024, nprobe: int = 8) -> None:
        super().__init__(dim)
        import faiss

        self._quantizer = faiss.IndexFlatIP(dim)
        self._index: Any = faiss.IndexIVFFlat(self._quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        self._index.nprobe = nprobe

    def __len__(self) -> int:
        return int(self._index.ntotal)

    @property
    def ef(self) -> int:
        return int(self._index.nprobe)

    @ef.setter
    def ef(self, value: int) -> None:
        self._index.nprobe = value

    def add(self, ids: npt.ArrayLike, vectors: npt.ArrayLike) -> None:
        vecs = normalize(vectors, self.dim)
        if not self._index.is_trained:
            self._index.train(vecs)
        self._index.add_with_ids(vecs, np.asarray(ids, dtype=np.int64))

    def remove(self, ids: npt.ArrayLike) -> None:
        self._index.remove_ids(np.asarray(ids, dtype=np.int64))

    def search(self, queries: npt.ArrayLike, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        sims, ids = self._index.search(normalize(queries, self.dim), k)
        return _padded(ids, sims, k)


# -- backends under test -----------------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    make: Callable[[int, int], VectorIndex]  # (dim, threads) -> index
    sweep: list[int]  # search knob values, cheapest first
    set_knob: Callable[[Any, int], None]
    set_threads: Callable[[Any, int], None]
    deletes: str


def _faiss_threads(_: Any, threads: int) -> None:
    import faiss

    faiss.omp_set_num_threads(threads)


def _set_attr(name: str) -> Callable[[Any, int], None]:
    def setter(index: Any, value: int) -> None:
        setattr(index, name, value)

    return setter


def backends(m: int, ef_construction: int, n: int) -> dict[str, Backend]:
    nlist = max(16, int(2 * np.sqrt(n)))  # ~2 sqrt(n) lists: the usual IVF sizing
    return {
        "exact": Backend(
            "exact (numpy)",
            lambda d, t: ExactCosineIndex(d),
            [0],
            lambda i, v: None,
            lambda i, t: None,
            "yes",
        ),
        "usearch": Backend(
            "usearch HNSW f32",
            lambda d, t: UsearchIndex(d, connectivity=m, expansion_add=ef_construction, threads=t),
            [16, 32, 64, 128, 256],
            _set_attr("expansion_search"),
            _set_attr("threads"),
            "yes (remove)",
        ),
        "hnswlib": Backend(
            "hnswlib HNSW",
            lambda d, t: HnswlibIndex(d, m=m, ef_construction=ef_construction, threads=t),
            [16, 32, 64, 128, 256],
            _set_attr("ef"),
            _set_attr("threads"),
            "yes (mark_deleted)",
        ),
        "faiss-hnsw": Backend(
            "faiss HNSWFlat",
            lambda d, t: FaissHnswIndex(d, m=m, ef_construction=ef_construction),
            [16, 32, 64, 128, 256],
            _set_attr("ef"),
            _faiss_threads,
            "no (tombstone filter)",
        ),
        "faiss-ivf": Backend(
            "faiss IVFFlat",
            lambda d, t: FaissIvfIndex(d, nlist=nlist),
            [1, 2, 4, 8, 16, 32, 64],
            _set_attr("ef"),
            _faiss_threads,
            "yes (remove_ids)",
        ),
    }


# -- measurement -------------------------------------------------------------------------------------


def recall_at_1(index: VectorIndex, queries: np.ndarray, truth: np.ndarray) -> float:
    ids, _ = index.search(queries, 1)
    return float(np.mean(ids[:, 0] == truth))


def latencies_us(index: VectorIndex, queries: np.ndarray) -> np.ndarray:
    out = np.empty(len(queries))
    for i in range(len(queries)):
        q = queries[i : i + 1]
        t0 = time.perf_counter_ns()
        index.search(q, 1)
        out[i] = (time.perf_counter_ns() - t0) / 1e3
    return out


def batch_qps(index: VectorIndex, queries: np.ndarray) -> float:
    t0 = time.perf_counter()
    index.search(queries, 1)
    return len(queries) / (time.perf_counter() - t0)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    all_backends = backends(args.m, args.ef_construction, args.n)
    for ds in args.datasets:
        data, query_sets = make_dataset(ds, args.n, args.dim, args.queries, args.seed)
        ids = np.arange(args.n)
        exact = ExactCosineIndex(args.dim, initial_rows=args.n)
        exact.add(ids, data)
        truth = {name: exact.search(q, 1)[0][:, 0] for name, q in query_sets.items()}
        rng = np.random.default_rng(args.seed + 1)
        deleted = rng.choice(args.n, args.n // 10, replace=False)
        exact.remove(deleted)
        truth_after = {name: exact.search(q, 1)[0][:, 0] for name, q in query_sets.items()}
        for key in args.backends:
            b = all_backends[key]
            try:
                index = b.make(args.dim, args.threads)
            except ImportError as exc:
                # Only hnswlib is a dependency; the others are installed by hand to compare.
                print(f"{ds:9} skip    {b.name:17} not installed ({exc.name}): pip install faiss-cpu usearch")
                continue
            t0 = time.perf_counter()
            index.add(ids, data)
            build_s = time.perf_counter() - t0
            measured = {}
            for qname, q in query_sets.items():
                # Smallest knob value reaching the recall target (else the largest tried).
                b.set_threads(index, args.threads)
                for knob in b.sweep:
                    b.set_knob(index, knob)
                    rec = recall_at_1(index, q, truth[qname])
                    if rec >= args.target_recall:
                        break
                qps = batch_qps(index, q)
                b.set_threads(index, 1)
                lat = latencies_us(index, q[: args.latency_queries])
                measured[qname] = (knob, rec, qps, lat)
            index.remove(deleted)
            for qname, q in query_sets.items():
                knob, rec, qps, lat = measured[qname]
                b.set_knob(index, knob)
                b.set_threads(index, args.threads)
                row = {
                    "dataset": ds,
                    "queries": qname,
                    "backend": b.name,
                    "knob": knob,
                    "build_s": round(build_s, 1),
                    "p50_us": round(float(np.percentile(lat, 50)), 1),
                    "p99_us": round(float(np.percentile(lat, 99)), 1),
                    "batch_qps": round(qps),
                    "recall@1": round(rec, 3),
                    "recall@1_after_10pct_deleted": round(recall_at_1(index, q, truth_after[qname]), 3),
                    "deletes": b.deletes,
                }
                rows.append(row)
                print_row(row)
            del index
    return rows


COLUMNS = [
    ("dataset", 9),
    ("queries", 7),
    ("backend", 17),
    ("knob", 5),
    ("build_s", 8),
    ("p50_us", 8),
    ("p99_us", 8),
    ("batch_qps", 9),
    ("recall@1", 8),
    ("recall@1_after_10pct_deleted", 12),
    ("deletes", 22),
]
_header_printed = False


def print_row(row: dict[str, Any]) -> None:
    global _header_printed
    if not _header_printed:
        print(" ".join(("del-recall" if c.startswith("recall@1_after") else c).ljust(w) for c, w in COLUMNS))
        _header_printed = True
    print(" ".join(str(row[c]).ljust(w) for c, w in COLUMNS), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--queries", type=int, default=2000, help="queries per set (recall, batched qps)")
    p.add_argument("--latency-queries", type=int, default=1000, help="single queries timed for p50/p99")
    p.add_argument("--datasets", nargs="+", default=["uniform", "clustered"])
    p.add_argument(
        "--backends", nargs="+", default=["exact", "usearch", "hnswlib", "faiss-hnsw", "faiss-ivf"]
    )
    p.add_argument("--m", type=int, default=16, help="HNSW links per node")
    p.add_argument("--ef-construction", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="threads for build and batched search")
    p.add_argument("--target-recall", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--csv", type=Path, help="also write the rows here")
    args = p.parse_args()
    print(
        f"n={args.n} dim={args.dim} queries={args.queries} M={args.m} efC={args.ef_construction} "
        f"threads={args.threads}; knob = ef_search (HNSW) or nprobe (IVF), smallest reaching "
        f"recall@1 >= {args.target_recall}"
    )
    rows = run(args)
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
