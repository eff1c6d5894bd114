"""A panel of replacement experts simulated side by side, and which of them currently leads.

Reference: follow-the-leader over expert caches, as in ACME (Ari et al., WDAS 2002), with miniature
simulations (Waldspurger et al., ATC'17, after SHARDS, FAST'15) as in Caffeine's adaptive window.
Parameters: the pairwise lead evidence decays over `horizons` (32 and 512 times the capacity); a
challenger takes the lead once, at some horizon, its lead clears `min_lead` (8) accesses and `sigmas`
(3 short, 2 long) standard deviations, and it trails at neither; the experts that only give evidence
run at capacity / `sample`, R capped so a miniature holds at least `MIN_MINIATURE` entries.
How the evidence, prefix chains and miniatures work: docs/heat.md ("The panel of experts").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

from policies.adaptive.arc import ARC
from policies.adaptive.lirs import LIRS
from policies.adaptive.wtinylfu import WTinyLFU
from policies.admission.sketch import FrequencySketch, stable_hash
from policies.base import Eviction, Policy
from policies.fifo.s3fifo import S3FIFO
from policies.fifo.sieve import SIEVE
from policies.frequency.lfu import LFU
from policies.recency.lru import LRU

EXPERTS: tuple[str, ...] = ("lirs", "lru", "arc", "wtinylfu")
HORIZONS: tuple[float, ...] = (32, 512)
SIGMAS: tuple[float, ...] = (3.0, 2.0)
MIN_LEAD = 8.0

MIN_MINIATURE = 32  # entries: a miniature simulation smaller than this is too noisy to trust

ExpertFactory = Callable[[int, int], Policy]
# Experts that count frequencies get the sketch of the accesses they hear (capacity, sketch).
SketchedFactory = Callable[[int, FrequencySketch], Policy]
_NONE: list[Eviction] = []
_MIX = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1


def sample_rate(capacity: int, wanted: int, min_miniature: int = MIN_MINIATURE) -> int:
    """The sampling factor R actually used: `wanted`, but no miniature under `min_miniature`."""
    return max(1, min(wanted, capacity // max(1, min_miniature)))


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
    expert leads until another one wins. `sketched` builds the experts that count frequencies over
    a sketch (W-TinyLFU, the heat frame): full-size ones get `sketch` (counted by the caller before
    each access), miniatures one of their own that the panel counts."""

    def __init__(
        self,
        capacity: int,
        experts: Sequence[str] = EXPERTS,
        *,
        sketched: Mapping[str, SketchedFactory] | None = None,
        sketch: FrequencySketch | None = None,
        seed: int = 0,
        sample: int = 1,
        min_miniature: int = MIN_MINIATURE,
        horizons: Sequence[float] = HORIZONS,
        sigmas: float | Sequence[float] = SIGMAS,
        min_lead: float = MIN_LEAD,
    ) -> None:
        self._sketched = dict(sketched or {})
        unknown = [e for e in experts if e not in FACTORIES and e not in self._sketched]
        if unknown or not experts:
            known = ", ".join([*FACTORIES, *self._sketched])
            raise ValueError(f"unknown experts {unknown}; known: {known}")
        self.names = list(experts)
        self.capacity = capacity
        self.seed = seed
        self.sample = sample_rate(capacity, sample, min_miniature)
        mini = max(1, round(capacity / self.sample))
        # A caller that shares its sketch counts it; without one the panel keeps (and counts) its own.
        self._counts = sketch is None and bool(self._sketched)
        self.sketch = sketch if sketch is not None else FrequencySketch(capacity if self._counts else 1)
        # The miniatures' own sketch (R > 1), counted here on every sampled access.
        self._mini_sketch = self.sketch if self.sample == 1 else FrequencySketch(mini, seed=seed)
        self.minis = [self._build(name, mini, self._mini_sketch) for name in self.names]
        self.leader = 0
        self.driver = self.minis[0] if self.sample == 1 else self._build(self.names[0], capacity, self.sketch)
        self.sigmas = [sigmas] * len(horizons) if isinstance(sigmas, int | float) else list(sigmas)
        self.min_lead = min_lead
        n = len(self.names)
        # Decay without touching every counter: each access is worth 1/decay more than the last.
        self._decays = [1.0 - 1.0 / max(h * mini, 512.0) for h in horizons]
        self._weights = [1.0] * len(horizons)
        # _wins[h][i][j]: accesses expert i hit and j missed, decayed over horizon h
        self._wins = [[[0.0] * n for _ in range(n)] for _ in horizons]
        self._prefix = [True] * n
        self._fresh = [True] * n
        self._all = (1 << n) - 1
        self._members = [[i for i in range(n) if mask >> i & 1] for mask in range(1 << n)]
        self.hits = [0] * n  # hits of each expert (of its miniature: sampled accesses, R > 1)
        self.switches = 0
        # Whether the last access was hit by some expert and missed by the leader.
        self.contested = False

    def _build(self, name: str, capacity: int, sketch: FrequencySketch) -> Policy:
        if name in self._sketched:
            return self._sketched[name](capacity, sketch)
        return FACTORIES[name](capacity, self.seed)

    @property
    def shadows(self) -> list[Policy]:
        """Every expert this panel runs: the miniatures (full shadows at R = 1) and the driver."""
        return self.minis if self.sample == 1 else [*self.minis, self.driver]

    @property
    def leader_name(self) -> str:
        return self.names[self.leader]

    def holds(self, key: Hashable) -> bool:
        """Whether the expert the resident set follows has `key` resident."""
        return key in self.driver

    def sampled(self, key: Hashable) -> bool:
        """Whether `key` is in the miniatures' spatial sample (always, at R = 1)."""
        if self.sample == 1:
            return True
        h = key if type(key) is int else stable_hash(key, self.seed)
        return (((h * _MIX) & _M64) >> 32) % self.sample == 0

    def access(self, key: Hashable, now_ms: int, chained: bool = False) -> list[Hashable]:
        """Replay one access in the experts; returns the keys the driver evicted (or rejected)."""
        if self._counts:
            self.sketch.increment(key)
        if self.sample == 1:
            return self._evidence(key, now_ms, chained, True)
        driver = self.driver
        if key in driver:
            driver.on_hit(key, now_ms)
            out = _NONE
        else:
            out = driver.on_miss(key, now_ms)
        if self.sampled(key):
            self._mini_sketch.increment(key)
            self._evidence(key, now_ms, chained, False)
        else:
            self.contested = False
        return [e.key for e in out] if out else []

    def _evidence(self, key: Hashable, now_ms: int, chained: bool, drives: bool) -> list[Hashable]:
        """One access in every miniature (the leader's one drives when `drives`), and the
        pairwise evidence it gives."""
        prefix = self._prefix
        if not chained:
            prefix[:] = self._fresh
        hits = 0  # bit i: expert i hit (within its prefix)
        leader, leader_out = self.leader, _NONE
        for i, shadow in enumerate(self.minis):
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
        return [e.key for e in leader_out] if drives and leader_out else []

    def forget(self, key: Hashable) -> None:
        """`key` left for a reason outside the experts: every expert (the driver too) drops it."""
        for shadow in self.shadows:
            if key in shadow:
                shadow.on_remove(key)

    def holders(self, key: Hashable) -> list[int]:
        """The experts (`names` order) whose miniature holds `key`."""
        return [i for i, shadow in enumerate(self.minis) if key in shadow]

    def invalidate(self) -> None:
        """The owner's model changed: experts that cache its heat (the frame) forget it."""
        for shadow in self.shadows:
            forget = getattr(shadow, "invalidate", None)
            if forget is not None:
                forget()

    def missing(self, expert: int, resident: Iterable[Hashable]) -> float:
        """About how many of the `resident` keys `expert` does not hold: counted in its shadow at
        R = 1, estimated from the sampled keys missing from its miniature (times R) otherwise."""
        shadow = self.minis[expert]
        if self.sample == 1:
            return float(sum(1 for k in resident if k not in shadow))
        return float(self.sample * sum(1 for k in resident if self.sampled(k) and k not in shadow))

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

    def follow(self, expert: int, resident: Iterable[Hashable] = (), now_ms: int = 0) -> None:
        """Lead with `expert`. At R > 1 a full-size one of it is built to drive and is handed the
        `resident` keys (oldest first), so it holds what the cache holds."""
        if expert == self.leader:
            return
        self.leader = expert
        self.switches += 1
        if self.sample == 1:
            self.driver = self.minis[expert]
            return
        self.driver = driver = self._build(self.names[expert], self.capacity, self.sketch)
        for key in resident:
            if key not in driver:
                driver.on_miss(key, now_ms)
