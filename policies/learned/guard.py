"""The online guard of the learned chain term (`chains.ChainReuse`): it stands the term down where it
does not pay.

Two miniature chain caches, one with the term and one without, run side by side on a spatially hashed
sample of the prefix chains, scaled: 1/`RATE` of the capacity up to `MAX_MINIATURE` blocks, and the
same share of the chains (SHARDS: Waldspurger et al., ATC '17; fixed-size past that, so the guard's
cost per access falls as the cache grows). A chain is in the sample when its root's key hashes into
it (the full-size cache marks its blocks: a block is when its parent is), so each miniature sees whole
chains. Over windows of sampled accesses the guard keeps the hit difference (with minus without) per
access, halved every `HALVE_WINDOWS` windows; the full-size cache's term goes to weight 0 once that
mean is below zero by more than two standard errors, and back to its weight once the mean is above
zero. `heatcore/src/guard.rs` is the same, decision for decision (on 64-bit int keys; other keys are
hashed by their repr here and by their interned id there).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from policies.base import AccessMeta

RATE = 10  # one chain in 10, at 1/10 of the capacity ...
MAX_MINIATURE = 2048  # ... up to this many blocks
MIN_MINIATURE = 64  # no guard below RATE * this capacity: a miniature that small says little
MIN_WINDOW = 256
MIN_WINDOWS = 4  # windows seen (after halving) before the guard decides
HALVE_WINDOWS = 32
_MASK = (1 << 64) - 1


def mix64(x: int) -> int:
    """SplitMix64's finaliser over a 64-bit pattern (the key's two's complement)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def root_sampled(key: Hashable, cut: int) -> bool:
    """A chain whose root is `key` is in the sample (its hash below `cut`, of 2^64)."""
    bits = key & _MASK if isinstance(key, int) else zlib.crc32(repr(key).encode())
    return mix64(bits) < cut


class Miniature(Protocol):
    def __contains__(self, key: Hashable) -> bool: ...
    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None: ...
    def on_miss(self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None) -> Any: ...


@dataclass(frozen=True)
class GuardState:
    term_on: bool
    windows: int  # windows completed
    windows_off: int  # ... of them with the term at weight 0
    accesses: int  # sampled accesses
    hits_with: int  # the miniature with the term
    hits_without: int


class ChainGuard:
    def __init__(self, reuse: Any, with_term: Miniature, without: Miniature, window: int, cut: int) -> None:
        self.cut = cut
        self.reuse = reuse  # the full-size cache's ChainReuse: its weight is what the guard sets
        self.weight = float(reuse.weight)
        self.with_term, self.without = with_term, without
        self.window = window
        self.term_on = True
        self.windows = self.windows_off = self.accesses = 0
        self.hits_with = self.hits_without = 0
        self._in_window = self._diff = 0
        self._s = self._q = self._n = 0.0

    @classmethod
    def around(cls, policy: Any) -> ChainGuard | None:
        """The guard of a heat policy entering prefix mode (None without the term, or when small)."""
        reuse = policy.chain_reuse
        mini = min(policy.capacity // RATE, MAX_MINIATURE)
        if reuse is None or mini < MIN_MINIATURE:
            return None

        def miniature(term: bool) -> Any:
            m = type(policy)(
                mini,
                seed=policy.seed,
                experts=(),
                chain_half_life=policy.chain_half_life,
                rescore_ms=policy.rescore_ms,
                neighbour_tau=policy.neighbour_tau,
                cold_cluster=policy.cold_cluster,
                prior_recency=policy.prior_recency,
                chain_reuse=term,
                chain_reuse_weight=reuse.weight,
                chain_guard=False,
            )
            m._enter_prefix_mode()
            return m

        cut = (1 << 64) * mini // policy.capacity
        used = np.nonzero(policy.table.used)[0].tolist()
        policy.sampled[used] = [root_sampled(policy._keys[s], cut) for s in used]  # their own roots
        return cls(reuse, miniature(True), miniature(False), max(MIN_WINDOW, mini // 4), cut)

    def admits(self, key: Hashable, parent: int, sampled: np.ndarray) -> bool:
        """Whether a newcomer is in the sample (`parent`: its parent's slot, -1 for a root)."""
        return bool(sampled[parent]) if parent >= 0 else root_sampled(key, self.cut)

    def heard(self, key: Hashable, parent: Hashable | None, now_ms: int, size: int = 1) -> None:
        """A sampled block's access (hit or admitted miss) in the full-size cache."""
        meta = AccessMeta(parent=parent)
        hit_with = self._access(self.with_term, key, now_ms, size, meta)
        hit_without = self._access(self.without, key, now_ms, size, meta)
        self.hits_with += hit_with
        self.hits_without += hit_without
        self._diff += hit_with - hit_without
        self.accesses += 1
        self._in_window += 1
        if self._in_window == self.window:
            self._close_window()

    @staticmethod
    def _access(mini: Miniature, key: Hashable, now_ms: int, size: int, meta: AccessMeta) -> int:
        if key in mini:
            mini.on_hit(key, now_ms, meta)
            return 1
        mini.on_miss(key, now_ms, size, meta)
        return 0

    def _close_window(self) -> None:
        d = self._diff / self.window
        self._in_window = self._diff = 0
        self.windows += 1
        self._s += d
        self._q += d * d
        self._n += 1.0
        if self.windows % HALVE_WINDOWS == 0:
            self._s, self._q, self._n = self._s / 2.0, self._q / 2.0, self._n / 2.0
        if self._n >= MIN_WINDOWS:
            mean = self._s / self._n
            se = math.sqrt(max(self._q / self._n - mean * mean, 0.0) / self._n)
            if self.term_on and mean + 2.0 * se < 0.0:
                self._set(False)
            elif not self.term_on and mean > 0.0:
                self._set(True)
        if not self.term_on:
            self.windows_off += 1

    def _set(self, on: bool) -> None:
        self.term_on = on
        self.reuse.set_weight(self.weight if on else 0.0)

    def state(self) -> GuardState:
        return GuardState(
            self.term_on, self.windows, self.windows_off, self.accesses, self.hits_with, self.hits_without
        )
