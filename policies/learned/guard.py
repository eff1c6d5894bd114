"""The online guard of the learned chain term (`chains.ChainReuse`), which also picks LRFU's half-life: it
stands the term down where it does not pay, and moves the half-life where another one hits more.

Miniature chain caches run side by side on a spatially hashed sample of the prefix chains, scaled:
1/`RATE` of the capacity up to `MAX_MINIATURE` blocks, and the same share of the chains (SHARDS:
Waldspurger et al., ATC '17; fixed-size past that, so the guard's cost per access falls as the cache
grows). One miniature without the term per candidate half-life (the arms: `HALF_LIVES`, the cache's own
first) and one with the term, at the half-life in use. A chain is in the sample when its root's key
hashes into it (the full-size cache marks its blocks: a block is when its parent is), so each miniature
sees whole chains. Over windows of sampled accesses the guard keeps paired hit differences per access
(the one with the term minus the arm in use; each arm minus each other), halved every `HALVE_WINDOWS`
windows. The full-size cache's term goes to weight 0 once the one with it hits less than the arm in use
by more than two standard errors, and back to its weight once it hits more; the cache moves to the
half-life of an arm that hits more than the one in use by more than `SWITCH_SE` standard errors (the
one that leads by most), its leaf queue rebuilt at the new rate, and the miniature with the term
follows. Why: no fixed half-life is best on both the Mooncake trace (3) and mixed traffic (10-30)
(bench/chain_half_life.py); the arms go without the term because where the half-life matters most
(mixed traffic) the term is stood down, and without it they cost less.
`heatcore/src/guard.rs` is the same, decision for decision (on 64-bit int keys; other keys are hashed by
their repr here and by their interned id there).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Hashable
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
HALF_LIVES = (3.0, 10.0, 30.0)  # the candidate half-lives, in capacities of accesses
SWITCH_SE = 2.0  # standard errors by which another half-life's arm must lead the one in use
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
    def set_half_life(self, half_life: float) -> None: ...


@dataclass(frozen=True)
class GuardState:
    term_on: bool
    windows: int  # windows completed
    windows_off: int  # ... of them with the term at weight 0
    accesses: int  # sampled accesses
    hits_with: int  # the miniature with the term
    hits_without: int  # the arm in use
    half_life: float  # the half-life in use
    switches: int  # times it moved


class _Paired:
    """Decayed sums of one per-window difference and of its square."""

    def __init__(self) -> None:
        self.s = self.q = 0.0

    def add(self, d: float) -> None:
        self.s += d
        self.q += d * d

    def halve(self) -> None:
        self.s, self.q = self.s / 2.0, self.q / 2.0

    def mean_se(self, n: float) -> tuple[float, float]:
        mean = self.s / n
        return mean, math.sqrt(max(self.q / n - mean * mean, 0.0) / n)


class ChainGuard:
    def __init__(
        self,
        reuse: Any,
        arms: list[Miniature],
        half_lives: list[float],
        with_term: Miniature,
        window: int,
        cut: int,
        move: Callable[[float], None],
    ) -> None:
        self.cut = cut
        self.move = move  # sets the full-size cache's half-life
        self.reuse = reuse  # the full-size cache's ChainReuse: its weight is what the guard sets
        self.weight = float(reuse.weight)
        self.arms, self.half_lives, self.with_term = arms, half_lives, with_term
        self.current = 0  # the arm (half-life) the full-size cache runs
        self.window = window
        self.term_on = True
        self.windows = self.windows_off = self.accesses = self.switches = 0
        self.hits_with = self.hits_without = 0
        self._in_window = self._term_diff = 0
        self._arm_hits = [0] * len(arms)
        self._term = _Paired()
        self._pairs = {(i, j): _Paired() for i in range(len(arms)) for j in range(i)}  # arm i minus arm j
        self._n = 0.0

    @classmethod
    def around(cls, policy: Any) -> ChainGuard | None:
        """The guard of a heat policy entering prefix mode (None without the term, or when small)."""
        reuse = policy.chain_reuse
        mini = min(policy.capacity // RATE, MAX_MINIATURE)
        if reuse is None or mini < MIN_MINIATURE:
            return None

        def miniature(term: bool, half_life: float) -> Any:
            m = type(policy)(
                mini,
                seed=policy.seed,
                experts=(),
                chain_half_life=half_life,
                chain_half_lives=(),
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
        candidates = [policy.chain_half_life, *policy.chain_half_lives]
        half_lives = list(dict.fromkeys(float(h) for h in candidates))
        arms = [miniature(False, h) for h in half_lives]
        with_term = miniature(True, half_lives[0])
        return cls(reuse, arms, half_lives, with_term, max(MIN_WINDOW, mini // 4), cut, policy.set_half_life)

    def admits(self, key: Hashable, parent: int, sampled: np.ndarray) -> bool:
        """Whether a newcomer is in the sample (`parent`: its parent's slot, -1 for a root)."""
        return bool(sampled[parent]) if parent >= 0 else root_sampled(key, self.cut)

    def heard(self, key: Hashable, parent: Hashable | None, now_ms: int, size: int = 1) -> None:
        """A sampled block's access (hit or admitted miss) in the full-size cache."""
        meta = AccessMeta(parent=parent)
        without = 0
        for a, arm in enumerate(self.arms):
            hit = self._access(arm, key, now_ms, size, meta)
            self._arm_hits[a] += hit
            if a == self.current:
                without = hit
        hit_with = self._access(self.with_term, key, now_ms, size, meta)
        self.hits_with += hit_with
        self.hits_without += without
        self._term_diff += hit_with - without
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
        w, hits = float(self.window), self._arm_hits
        self._term.add(self._term_diff / w)
        for (i, j), pair in self._pairs.items():
            pair.add((hits[i] - hits[j]) / w)
        self._in_window = self._term_diff = 0
        self._arm_hits = [0] * len(self.arms)
        self.windows += 1
        self._n += 1.0
        if self.windows % HALVE_WINDOWS == 0:
            self._term.halve()
            for pair in self._pairs.values():
                pair.halve()
            self._n /= 2.0
        if self._n >= MIN_WINDOWS:
            mean, se = self._term.mean_se(self._n)
            if self.term_on and mean + 2.0 * se < 0.0:
                self._set(False)
            elif not self.term_on and mean > 0.0:
                self._set(True)
            self._switch()
        if not self.term_on:
            self.windows_off += 1

    def _switch(self) -> None:
        """The arm that leads the one in use by most, if by more than `SWITCH_SE` standard errors."""
        c, best, best_lead = self.current, self.current, 0.0
        for a in range(len(self.arms)):
            if a == c:
                continue
            mean, se = self._lead(a, c)
            if mean - SWITCH_SE * se > 0.0 and mean > best_lead:
                best, best_lead = a, mean
        if best == c:
            return
        self.current = best
        self.switches += 1
        self.with_term.set_half_life(self.half_lives[best])
        self.move(self.half_lives[best])

    def _lead(self, a: int, b: int) -> tuple[float, float]:
        """Arm `a`'s hits per access over arm `b`'s: (mean, standard error)."""
        if a > b:
            return self._pairs[a, b].mean_se(self._n)
        mean, se = self._pairs[b, a].mean_se(self._n)
        return -mean, se

    def _set(self, on: bool) -> None:
        self.term_on = on
        self.reuse.set_weight(self.weight if on else 0.0)

    def state(self) -> GuardState:
        return GuardState(
            self.term_on,
            self.windows,
            self.windows_off,
            self.accesses,
            self.hits_with,
            self.hits_without,
            self.half_lives[self.current],
            self.switches,
        )
