"""In-memory stand-ins for unit tests of the tiered cache only: an L3 port over dicts (with an injectable
latency on a fake clock, and failures), and a settable clock. Integration tests use the real Postgres."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from services.tiers.entry import Entry
from services.tiers.l3_store import L3Rejected, L3Store, SemanticMatch
from services.tiers.vector_index import normalize


class Clock:
    """Wall ms, monotonic ms and perf ns in one settable counter."""

    def __init__(self, start_ms: int = 1_000_000) -> None:
        self.ms = start_ms

    def __call__(self) -> int:
        return self.ms

    def ns(self) -> int:
        return self.ms * 1_000_000

    def advance(self, ms: int) -> None:
        self.ms += ms


class MemoryL3(L3Store):
    def __init__(
        self, *, clock: Clock | None = None, latency_ms: int = 0, semantic: bool = True, fail: bool = False
    ) -> None:
        self.rows: dict[str, Entry] = {}
        self.clock = clock
        self.latency_ms = latency_ms
        self.semantic = semantic
        self.fail = fail
        self.calls = 0
        self.reject: set[str] = set()  # keys whose writes L3 refuses as bad data

    def _call(self) -> None:
        self.calls += 1
        if self.clock is not None:
            self.clock.advance(self.latency_ms)
        if self.fail:
            raise OSError("L3 is down")

    def _live(self, entry: Entry, now_ms: int) -> bool:
        expires = entry.meta.expires_at_ms
        return expires is None or expires > now_ms

    async def put(self, entry: Entry) -> None:
        self._call()
        if entry.key in self.reject:
            raise L3Rejected(f"L3 refused {entry.key!r}")
        self.rows[entry.key] = entry

    async def get(self, key: str, now_ms: int) -> Entry | None:
        self._call()
        entry = self.rows.get(key)
        return entry if entry is not None and self._live(entry, now_ms) else None

    async def get_many(self, keys: Sequence[str], now_ms: int) -> dict[str, Entry]:
        self._call()
        return {k: e for k in keys if (e := self.rows.get(k)) is not None and self._live(e, now_ms)}

    async def search(
        self,
        embedding: npt.ArrayLike,
        now_ms: int,
        *,
        model: str | None = None,
        tolerance: float | None = None,
        candidates: int = 4,
    ) -> SemanticMatch | None:
        self._call()
        if not self.semantic:
            return None
        q = normalize(embedding)[0]
        scored = []
        for e in self.rows.values():
            if e.meta.embedding is None or not self._live(e, now_ms):
                continue
            if model is not None and e.meta.model != model:
                continue
            scored.append((float(normalize(e.meta.embedding)[0] @ q), e))
        scored.sort(key=lambda t: -t[0])
        for sim, e in scored[:candidates]:
            if sim >= max(tolerance or 0.0, e.meta.similarity_tolerance):
                return SemanticMatch(e, sim)
        return None

    async def delete(self, key: str) -> bool:
        self._call()
        return self.rows.pop(key, None) is not None

    async def delete_bound_to(self, trace_id: str) -> list[str]:
        self._call()
        gone = [k for k, e in self.rows.items() if trace_id in e.meta.bound_to()]
        for k in gone:
            del self.rows[k]
        return gone

    async def delete_expired(self, now_ms: int, limit: int = 1000) -> int:
        self._call()
        gone = [k for k, e in self.rows.items() if not self._live(e, now_ms)][:limit]
        for k in gone:
            del self.rows[k]
        return len(gone)


def unit(rng: np.random.Generator, dim: int) -> np.ndarray:
    return normalize(rng.standard_normal(dim))[0]


def at_cosine(rng: np.random.Generator, v: np.ndarray, cosine: float) -> np.ndarray:
    """A unit vector at exactly `cosine` from unit vector `v`."""
    r = rng.standard_normal(v.shape)
    r -= (r @ v) * v
    r /= np.linalg.norm(r)
    return (cosine * v + np.sqrt(1 - cosine**2) * r).astype(np.float32)
