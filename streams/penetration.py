"""Three-layer penetration tracing (docs/design.md §2.3): model, sequence and token layer caches.

A `CacheAccessed` with `layer` set is one lookup in that layer (a prompt goes one layer down on each
miss): `hit=False` means it went on to the next layer, so a miss in the token layer, the last, means the
request missed all three: it *penetrated*, and warmup is told (`RequestPenetrated`). Accesses without a
layer (tier lookups, KV blocks) count towards QPS and hit rates only. Per layer and window: the
penetration rate (misses / lookups) and the latency a miss adds (mean miss latency - mean hit latency;
the mean miss latency when nothing hit). The layers, as the generator simulates them: model (exact
prompt, key `model:<name>:<version>:<hash(query)>`), sequence (buckets by token length 1-64, 65-256,
257-1024, ..., each 4x the last), token (LRU-K with K=2).
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Literal

from schemas.events import CacheAccessed

Layer = Literal["model", "sequence", "token"]
LAYERS: tuple[Layer, ...] = ("model", "sequence", "token")
LAST_LAYER: Layer = "token"


def query_hash(query: str | bytes, length: int = 16) -> str:
    data = query.encode() if isinstance(query, str) else query
    return hashlib.sha256(data).hexdigest()[:length]


def model_layer_key(model: str, version: str, query: str | bytes) -> str:
    """`model:<name>:<ver>:<hash(query)>` (docs/design.md §2.3)."""
    return f"model:{model}:{version}:{query_hash(query)}"


def sequence_bucket(token_count: int) -> tuple[int, int]:
    """The inclusive token-length bucket: (1, 64), (65, 256), (257, 1024), ... ; 0 tokens -> (0, 0)."""
    if token_count <= 0:
        return (0, 0)
    low, high = 1, 64
    while token_count > high:
        low, high = high + 1, high * 4
    return (low, high)


def sequence_bucket_label(token_count: int) -> str:
    low, high = sequence_bucket(token_count)
    return f"{low}-{high}"


def is_penetration(access: CacheAccessed) -> bool:
    """A miss in the last layer: the request missed the model, sequence and token layers."""
    return access.layer == LAST_LAYER and not access.hit


@dataclass(slots=True)
class LayerCounts:
    """Lookups in one layer within one window; merges by addition."""

    lookups: int = 0
    misses: int = 0
    hit_latency_ms: float = 0.0
    miss_latency_ms: float = 0.0

    def add(self, hit: bool, latency_ms: float) -> None:
        self.lookups += 1
        if hit:
            self.hit_latency_ms += latency_ms
        else:
            self.misses += 1
            self.miss_latency_ms += latency_ms

    def merge(self, other: LayerCounts) -> None:
        self.lookups += other.lookups
        self.misses += other.misses
        self.hit_latency_ms += other.hit_latency_ms
        self.miss_latency_ms += other.miss_latency_ms

    @property
    def rate(self) -> float:
        return self.misses / self.lookups if self.lookups else 0.0

    @property
    def added_latency_ms(self) -> float:
        if not self.misses:
            return 0.0
        mean_miss = self.miss_latency_ms / self.misses
        hits = self.lookups - self.misses
        return mean_miss - self.hit_latency_ms / hits if hits else mean_miss

    def to_json(self) -> list[float]:
        return [self.lookups, self.misses, self.hit_latency_ms, self.miss_latency_ms]

    @classmethod
    def from_json(cls, raw: list[float]) -> LayerCounts:
        return cls(int(raw[0]), int(raw[1]), float(raw[2]), float(raw[3]))


def penetration_by_layer(layers: Mapping[str, LayerCounts]) -> dict[str, float]:
    return {name: c.rate for name, c in sorted(layers.items()) if c.lookups}


def added_latency_by_layer(layers: Mapping[str, LayerCounts]) -> dict[str, float]:
    return {name: c.added_latency_ms for name, c in sorted(layers.items()) if c.lookups}


class LruK:
    """LRU-K (O'Neil et al., 1993), K=2 by default: evicts the entry whose K-th most recent access is
    oldest; entries seen fewer than K times go first (oldest last access first). `access` returns
    whether the key was resident, then records the access. The clock is the access count."""

    def __init__(self, capacity: int, k: int = 2) -> None:
        if capacity <= 0 or k <= 0:
            raise ValueError("capacity and k must be positive")
        self.capacity = capacity
        self.k = k
        self._history: dict[Hashable, list[int]] = {}
        self._tick = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._history

    def __len__(self) -> int:
        return len(self._history)

    def access(self, key: Hashable) -> bool:
        self._tick += 1
        history = self._history.get(key)
        if history is not None:
            history.append(self._tick)
            del history[: -self.k]
            return True
        if len(self._history) >= self.capacity:
            del self._history[self._victim()]
        self._history[key] = [self._tick]
        return False

    def _victim(self) -> Hashable:
        def backward_k_distance(item: tuple[Hashable, list[int]]) -> tuple[int, int]:
            history = item[1]
            kth = history[0] if len(history) >= self.k else -1
            return (kth, history[-1])

        return min(self._history.items(), key=backward_k_distance)[0]
