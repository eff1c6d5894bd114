"""A panel of replacement experts simulated side by side, and which of them currently leads.

Every expert (LRU, ARC, W-TinyLFU, LIRS, ... at the real capacity) hears the same accesses as the
real cache, in order and nothing more, so its hit count is honest: no expert sees the future and none
prefetches. The evidence is pairwise: `lead(i, j)` is how many more accesses expert i hit and j
missed than the other way round, exponentially decayed over two horizons (`horizons`: 32 and 512
times the capacity; the short one long enough for a workload's periodic phases to average out, the
long one to make a small but lasting lead significant). A challenger may take the lead when, at some
horizon, its lead over the leader clears `min_lead` (8) accesses and `sigmas` standard deviations of
that difference (3 at the short horizon, 2 at the long one; the accesses where exactly one of the two
hit are, under "equally good", a fair coin), and it trails at neither horizon. The caller decides
whether a switch is worth its migration cost (`HeatPolicy`).

With prefix chains (KV blocks, `chained=True` for every block after the first of a request) an
expert's hit counts only while it holds the whole prefix so far, as the replayer counts the real
cache's hits.

Reference: follow-the-leader over expert caches, as in ACME (Ari et al., "ACME: Adaptive Caching
Using Multiple Experts", WDAS 2002) and Caffeine's adaptive window (miniature simulations, Einziger
et al., Middleware 2018); here the experts are full-size and the resident set follows the leader's
decisions instead of only borrowing a parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

from policies.adaptive.arc import ARC
from policies.adaptive.lirs import LIRS
from policies.adaptive.wtinylfu import WTinyLFU
from policies.base import Eviction, Policy
from policies.fifo.s3fifo import S3FIFO
from policies.fifo.sieve import SIEVE
from policies.frequency.lfu import LFU
from policies.recency.lru import LRU

EXPERTS: tuple[str, ...] = ("lirs", "lru", "arc", "wtinylfu")
HORIZONS: tuple[float, ...] = (32, 512)
SIGMAS: tuple[float, ...] = (3.0, 2.0)
MIN_LEAD = 8.0

ExpertFactory = Callable[[int, int], Policy]
_NONE: list[Eviction] = []

FACTORIES: dict[str, ExpertFactory] = {
    "lru": lambda capacity, seed: LRU(capacity),
    "lfu": lambda capacity, seed: LFU(capacity),
    "arc": lambda capacity, seed: ARC(capacity),
    "wtinylfu": lambda capacity, seed: WTinyLFU(capacity, seed=seed),
    "lirs": lambda capacity, seed: LIRS(capacity),
    "s3fifo": lambda capacity, seed: S3FIFO(capacity),
    # libCacheSim's S3FIFO.c: fills main first while warming up (see policies.fifo.s3fifo)
    "s3fifo-lcs": lambda capacity, seed: S3FIFO(capacity, fill_main_first=True),
    "sieve": lambda capacity, seed: SIEVE(capacity),
}


class ExpertPanel:
    """Shadow experts and the pairwise evidence between them; `leader` indexes `names`, the first
    expert leads until another one wins. `built` supplies experts the caller constructs itself (the
    heat frame shares the caller's sketch and model)."""

    def __init__(
        self,
        capacity: int,
        experts: Sequence[str] = EXPERTS,
        *,
        built: Mapping[str, Policy] | None = None,
        seed: int = 0,
        horizons: Sequence[float] = HORIZONS,
        sigmas: float | Sequence[float] = SIGMAS,
        min_lead: float = MIN_LEAD,
    ) -> None:
        built = built or {}
        unknown = [e for e in experts if e not in FACTORIES and e not in built]
        if unknown or not experts:
            raise ValueError(f"unknown experts {unknown}; known: {', '.join([*FACTORIES, *built])}")
        self.names = list(experts)
        self.shadows = [
            built[name] if name in built else FACTORIES[name](capacity, seed) for name in self.names
        ]
        self.leader = 0
        self.sigmas = [sigmas] * len(horizons) if isinstance(sigmas, int | float) else list(sigmas)
        self.min_lead = min_lead
        n = len(self.names)
        # Decay without touching every counter: each access is worth 1/decay more than the last.
        self._decays = [1.0 - 1.0 / max(h * capacity, 512.0) for h in horizons]
        self._weights = [1.0] * len(horizons)
        # _wins[h][i][j]: accesses expert i hit and j missed, decayed over horizon h
        self._wins = [[[0.0] * n for _ in range(n)] for _ in horizons]
        self._prefix = [True] * n
        self._fresh = [True] * n
        self._all = (1 << n) - 1
        self._members = [[i for i in range(n) if mask >> i & 1] for mask in range(1 << n)]
        self.hits = [0] * n
        self.switches = 0
        # Whether the last access was hit by some expert and missed by the leader.
        self.contested = False

    @property
    def leader_name(self) -> str:
        return self.names[self.leader]

    def holds(self, key: Hashable) -> bool:
        """Whether the leading expert has `key` resident."""
        return key in self.shadows[self.leader]

    def access(self, key: Hashable, now_ms: int, chained: bool = False) -> list[Hashable]:
        """Replay one access in every expert; returns the keys the leader evicted (or rejected)."""
        prefix = self._prefix
        if not chained:
            prefix[:] = self._fresh
        hits = 0  # bit i: expert i hit (within its prefix)
        leader, leader_out = self.leader, _NONE
        for i, shadow in enumerate(self.shadows):
            if key in shadow:
                shadow.on_hit(key, now_ms)
                if prefix[i]:
                    hits |= 1 << i
                    self.hits[i] += 1
            else:
                prefix[i] = False
                out = shadow.on_miss(key, now_ms)
                if i == leader:
                    leader_out = out
        self.contested = hits != 0 and not hits >> leader & 1
        weights = self._weights
        for h, decay in enumerate(self._decays):
            weights[h] /= decay
        if 0 < hits < self._all:
            hit_by, missed_by = self._members[hits], self._members[self._all ^ hits]
            for h, wins in enumerate(self._wins):
                weight = weights[h]
                for i in hit_by:
                    row = wins[i]
                    for j in missed_by:
                        row[j] += weight
        if max(weights) > 1e150:
            for h, w in enumerate(weights):
                self._wins[h] = [[x / w for x in row] for row in self._wins[h]]
                weights[h] = 1.0
        return [e.key for e in leader_out] if leader_out else []

    def lead(self, i: int, j: int, horizon: int = 0) -> float:
        """Decayed count of accesses expert i hit and j missed, minus the converse."""
        wins = self._wins[horizon]
        return (wins[i][j] - wins[j][i]) / self._weights[horizon]

    def challengers(self) -> list[tuple[int, float]]:
        """The experts with a significant lead over the leader, each with that lead.

        Significant: at some horizon the lead clears `min_lead` and `sigmas` deviations, and at no
        horizon does the challenger trail (a short burst of luck inside a losing record is no lead).
        """
        leader = self.leader
        found: list[tuple[int, float]] = []
        for i in range(len(self.names)):
            if i == leader:
                continue
            significant, trailing, lead_i = False, False, 0.0
            for wins, w, sigmas in zip(self._wins, self._weights, self.sigmas, strict=True):
                win, loss = wins[i][leader] / w, wins[leader][i] / w
                lead = win - loss
                trailing |= lead < 0
                if lead > self.min_lead and lead > sigmas * math.sqrt(win + loss):
                    significant, lead_i = True, max(lead_i, lead)
            if significant and not trailing:
                found.append((i, lead_i))
        return found

    def follow(self, expert: int) -> None:
        if expert != self.leader:
            self.leader = expert
            self.switches += 1
