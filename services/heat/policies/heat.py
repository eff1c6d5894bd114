"""The AI-native policy: W-TinyLFU's frame, a learned heat score choosing the victims.

Seed §1.2, DESIGN §1/§3. Every entry carries the features of `features.py`; an online MLP
(`scorer.py`) turns them into heat (how soon it will be re-used), re-scoring the whole cache in one
batch every `rescore_ms` (100 ms) of trace time; a newcomer is scored on its own for its duel.
- Frame (Einziger et al., "Adaptive Software Cache Management", Middleware 2018): new keys enter an
  LRU window; the main region is a segmented LRU (probation, protected 80%). The window size is
  chosen by miniature simulations (`minisim.py`; Caffeine's hill climber on request).
- Victim: among the `victim_candidates` (4) oldest probation entries, the one with the least heat.
  The model only reorders the tail of the queue: a key that was just admitted has no resident
  history yet, and a learned score alone throws it out before it can earn any (the burst shows it).
  Entries of ended traces and expired entries go before anything.
- Prefix chains (`AccessMeta.parent` set, e.g. KV blocks): leaves go before roots, as in a radix
  tree (a block is worthless without its parent), so the victim is the coldest main-region leaf; a
  block skips the window and is admitted whenever its parent is resident, and not at all otherwise.
- Admission (TinyLFU): a window candidate must be more frequent, by the count-min sketch, than the
  victim it would displace; a key the doorkeeper has not seen before (frequency <= 1) never displaces
  a victim with frequency >= `hot_frequency`; candidates with frequency >= 6 win 1 in 128 ties at
  random, as in Caffeine.
- Context lifecycle: entries bound to an ended trace_id are evicted (or, lazily, go first).
- Semantic distance decay: an entry inherits `cluster heat * exp(-distance / neighbour_tau)` from the
  hottest member of its cluster (kept alive); a victim whose whole cluster is colder than
  `cold_cluster` takes its cluster with it.
- Scorer: a fixed prior (`prior_recency` * recency + the rest * frequency) until `warmup_labels`
  labels have arrived, then the MLP; with `scorer="auto"` prefix chains stay on the prior, where the
  MLP lost in every configuration tried on the Mooncake trace (bench/policies.py).
Sizes are honoured (capacity and window in size units).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from services.heat.features import N_FEATURES, EntryTable
from services.heat.policies.base import AccessMeta, Eviction, EvictionReason, Policy
from services.heat.policies.minisim import WindowTuner
from services.heat.policies.sketch import FrequencySketch
from services.heat.policies.tinylfu import (
    HASHDOS_THRESHOLD,
    PROTECTED_PERCENT,
    WINDOW_PERCENT,
    HillClimber,
)
from services.heat.scorer import HeatScorer, ReuseLabeler

Decision = Literal["keep", "evict", "keep-alive"]
_EXPIRED = -2.0
_ENDED = -1.0


@dataclass(frozen=True, slots=True)
class HeatScore:
    """One entry's current heat, for publishing `heat.scores.v1`."""

    key: Hashable
    score: float
    cluster: int | None
    decision: Decision


class HeatPolicy(Policy):
    name = "heat"

    def __init__(
        self,
        capacity: int,
        *,
        seed: int = 0,
        rescore_ms: int = 100,
        horizon: int | None = None,
        hidden: int = 16,
        window_percent: float = WINDOW_PERCENT,
        window_tuning: Literal["minisim", "climb", "fixed"] = "minisim",
        victim_candidates: int = 4,
        sample_per_rescore: int = 16,
        candidate_sample_rate: float = 0.25,
        train_steps: int = 1,
        warmup_labels: int = 256,
        hot_frequency: int = 3,
        neighbour_tau: float = 0.1,
        cold_cluster: float = 0.05,
        evict_below: float = 0.1,
        scorer: Literal["auto", "model", "prior"] = "auto",
        prior_recency: float = 0.5,
    ) -> None:
        super().__init__(capacity)
        self.rescore_ms = rescore_ms
        self.horizon = horizon if horizon is not None else max(4 * capacity, 256)
        self.victim_candidates = victim_candidates
        self.sample_per_rescore = sample_per_rescore
        self.candidate_sample_rate = candidate_sample_rate
        self.train_steps = train_steps
        self.warmup_labels = warmup_labels
        self.hot_frequency = hot_frequency
        self.neighbour_tau = neighbour_tau
        self.cold_cluster = cold_cluster
        self.evict_below = evict_below
        self.scorer_mode = scorer
        self.prior_recency = prior_recency
        self.sketch = FrequencySketch(capacity, seed=seed)
        self.scorer = HeatScorer(N_FEATURES, hidden=hidden, seed=seed)
        self.labeler = ReuseLabeler(self.horizon)
        self.window_max = min(capacity, max(1, round(window_percent * capacity)))
        self.protected_max = int(PROTECTED_PERCENT * (capacity - self.window_max))
        self.climber = HillClimber(capacity, self.sketch.sample_size) if window_tuning == "climb" else None
        self.tuner = WindowTuner(capacity, seed=seed) if window_tuning == "minisim" else None
        slots = capacity + 1  # one spare: a newcomer is staged in a slot before its duel
        self.table = EntryTable(slots, capacity)
        self.raw = np.zeros(slots, dtype=np.float32)
        self.eff = np.zeros(slots, dtype=np.float32)
        self.window: OrderedDict[Hashable, None] = OrderedDict()
        self.probation: OrderedDict[Hashable, None] = OrderedDict()
        self.protected: OrderedDict[Hashable, None] = OrderedDict()
        self._window_used = 0
        self._slot: dict[Hashable, int] = {}
        self._keys: list[Hashable | None] = [None] * slots
        self._free = list(range(slots - 1, -1, -1))
        self._doomed: dict[int, EvictionReason] = {}  # ended / expired slots, evicted first
        self._used = 0
        self._tick = 0
        self._now_ms = 0
        self._last_rescore_ms: int | None = None
        self._trace_ids: dict[str, int] = {}
        self._ended: set[int] = set()
        self._pending_attention: OrderedDict[Hashable, float] = OrderedDict()
        # Last access of recently evicted keys, so a returning key keeps its inter-access gap.
        self._ghost: OrderedDict[Hashable, int] = OrderedDict()
        self._one_cache: dict[tuple[float, ...], float] = {}
        self._rng = np.random.default_rng(seed)
        self._hashdos = np.random.default_rng(seed + 1)
        self.rescores = 0
        self._prefix_mode = False  # set by the first block that names a prefix parent
        self._windowed = np.zeros(slots, dtype=bool)

    # -- Policy interface -------------------------------------------------------------------

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slot

    def __len__(self) -> int:
        return len(self._slot)

    @property
    def used(self) -> int:
        return self._used

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        s = self._slot[key]
        self._tick += 1
        self._now_ms = now_ms
        self.sketch.increment(key)
        t = self.table
        t.gap[s] = self._tick - t.last_tick[s]
        t.last_tick[s] = self._tick
        t.hits[s] += 1
        t.freq[s] = self.sketch.frequency(key)
        t.freq_epoch[s] = self.sketch.resets
        if meta is not None:
            self._apply_meta(s, meta)
        self._heard(key)
        if key in self.window:
            self.window.move_to_end(key)
        elif key in self.probation:
            del self.probation[key]
            self.protected[key] = None
            self._demote()
        else:
            self.protected.move_to_end(key)
        self._tune(key, True)
        self._maybe_rescore(now_ms)

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        self._tick += 1
        self._now_ms = now_ms
        self.sketch.increment(key)
        self._heard(key)
        if size > self.capacity:
            return [Eviction(key, "rejected")]
        parent = -1
        if meta is not None and meta.parent is not None:
            parent = self._slot.get(meta.parent, -1)
            if parent < 0:
                return [Eviction(key, "rejected")]  # an orphan block can never be hit
        self._maybe_rescore(now_ms)
        s = self._stage(key, size, parent, meta)
        self._tune(key, False)
        if parent >= 0:
            self._prefix_mode = True
            return self._insert_main(s, key)
        return self._insert_window(s, key)

    def on_remove(self, key: Hashable) -> None:
        s = self._slot.get(key)
        if s is not None:
            self._release(s)

    # -- signals from the mesh (kv.events, context.lifecycle, clusters) ----------------------

    def observe_attention_heat(self, key: Hashable, heat: float) -> None:
        """Attention-head heat reported for `key` (kv.events.v1), in [0, 1]."""
        heat = min(max(float(heat), 0.0), 1.0)
        s = self._slot.get(key)
        if s is None:
            self._pending_attention[key] = heat
            self._pending_attention.move_to_end(key)
            if len(self._pending_attention) > self.capacity:
                self._pending_attention.popitem(last=False)
            return
        self.table.attention[s] = heat
        self.table.has_attention[s] = True

    def observe_cluster(self, key: Hashable, cluster: int, distance: float = 0.0) -> None:
        """Semantic cluster of `key` and its (cosine) distance to the cluster centre."""
        s = self._slot.get(key)
        if s is not None:
            self.table.cluster[s] = cluster
            self.table.distance[s] = distance

    def end_trace(self, trace_id: str, now_ms: int, evict: bool = True) -> list[Eviction]:
        """The conversation `trace_id` ended (context.lifecycle.v1). Its entries are evicted now,
        leaves first (a block still parenting another trace's block stays, first in line), or with
        `evict=False` only moved to the front of the eviction order."""
        tid = self._trace_ids.get(trace_id)
        if tid is None:
            return []
        self._ended.add(tid)
        t = self.table
        members = np.nonzero(t.used & (t.trace == tid))[0]
        evicted: list[Eviction] = []
        for s in members[np.argsort(-t.depth[members], kind="stable")].tolist():
            if evict and t.children[s] == 0:
                evicted.append(self._evict_one(s, "context_ended"))
            else:
                self._doom(s, "context_ended")
        return evicted

    def expire(self, now_ms: int) -> list[Eviction]:
        """Evict every entry whose TTL has run out by `now_ms` (leaves first)."""
        t = self.table
        dead = np.nonzero(t.used & (t.ttl_ms > 0) & (now_ms - t.inserted_ms >= t.ttl_ms))[0]
        out = []
        for s in dead[np.argsort(-t.depth[dead], kind="stable")].tolist():
            if t.children[s] == 0:
                out.append(self._evict_one(s, "expired"))
            else:
                self._doom(s, "expired")
        return out

    def heat(self, key: Hashable) -> float | None:
        """The current effective heat of a resident key (None if not resident)."""
        s = self._slot.get(key)
        return None if s is None else max(float(self.eff[s]), 0.0)

    def scores(self) -> Iterator[HeatScore]:
        """Current heat and decision per resident key: `evict` when colder than `evict_below` (or
        bound to an ended trace / expired), `keep-alive` when only a hot neighbour or a resident
        prefix child keeps it, `keep` otherwise."""
        t = self.table
        for key, s in self._slot.items():
            eff, raw = float(self.eff[s]), float(self.raw[s])
            if eff < self.evict_below and t.children[s] == 0:
                decision: Decision = "evict"
            elif raw < self.evict_below:
                decision = "keep-alive"
            else:
                decision = "keep"
            cluster = int(t.cluster[s])
            yield HeatScore(key, max(eff, 0.0), None if cluster < 0 else cluster, decision)

    @property
    def model_active(self) -> bool:
        """Whether the MLP (rather than the prior) scores: it is trained, and with `scorer="auto"` the
        entries are not prefix chains."""
        if self.scorer_mode == "prior" or self.scorer.labels_seen < self.warmup_labels:
            return False
        return self.scorer_mode == "model" or not self._prefix_mode

    def rescore(self, now_ms: int | None = None) -> None:
        """Learn from the labels that came due, then score every resident entry in one batch."""
        now = self._now_ms if now_ms is None else now_ms
        self._last_rescore_ms = now
        self.rescores += 1
        self.labeler.expire(self._tick, self.scorer)
        if self.scorer.train(self.train_steps) is not None:
            self._one_cache.clear()
        self._score_all(now, sample=True)

    def _score_all(self, now: int, sample: bool) -> None:
        t = self.table
        idx = np.nonzero(t.used)[0]
        if len(idx) == 0:
            return
        alive = self._alive(idx)
        x = t.features(idx, self._tick, now, alive, self.sketch.resets)
        raw = self.scorer.score(x).astype(np.float32) if self.model_active else self._prior(x)
        self.raw[idx] = raw
        eff = raw.copy()
        clusters = t.cluster[idx]
        clustered = clusters >= 0
        if clustered.any():
            eff = self._neighbour_heat(idx, raw, clusters, clustered, eff)
        self.eff[idx] = eff
        for s in idx[~alive].tolist():
            self._doom(s, "context_ended")
        ttl = t.ttl_ms[idx]
        for s in idx[(ttl > 0) & (now - t.inserted_ms[idx] >= ttl)].tolist():
            self._doom(s, "expired")
        if not sample:
            return
        k = min(self.sample_per_rescore, len(idx))
        for j in self._rng.choice(len(idx), size=k, replace=False).tolist():
            key = self._keys[idx[j]]
            if key is not None:
                self.labeler.watch(key, x[j], self._tick)

    # -- admission and eviction ----------------------------------------------------------------

    def _insert_window(self, s: int, key: Hashable) -> list[Eviction]:
        self._commit(s, key)
        self.window[key] = None
        self._windowed[s] = True
        self._window_used += int(self.table.size[s])
        evicted: list[Eviction] = []
        while self._window_used > self.window_max and len(self.window) > 1:
            candidate, _ = self.window.popitem(last=False)
            c = self._slot[candidate]
            self._windowed[c] = False
            self._window_used -= int(self.table.size[c])
            self.probation[candidate] = None
            self._set_heat(c, self._score_one(c, candidate))
            if self._used > self.capacity:
                evicted.extend(self._duel(c, candidate))
        while self._used > self.capacity:
            v = self._pick_victim()
            if v < 0:
                v = self._window_victim()
            evicted.extend(self._evict(v))
        return evicted

    def _insert_main(self, s: int, key: Hashable) -> list[Eviction]:
        heat = self._score_one(s, key)
        size = int(self.table.size[s])
        evicted: list[Eviction] = []
        while self._used + size > self.capacity:
            v = self._pick_victim()
            if v < 0:
                v = self._window_victim()
            if v < 0:
                self._unstage(s)
                return [*evicted, Eviction(key, "rejected")]
            evicted.extend(self._evict(v))
        self._commit(s, key)
        self.probation[key] = None
        self._set_heat(s, heat)
        return evicted

    def _duel(self, c: int, candidate: Hashable) -> list[Eviction]:
        """`candidate` just left the window and the cache is over capacity: it or a victim goes."""
        evicted: list[Eviction] = []
        while self._used > self.capacity:
            v = self._pick_victim(exclude=candidate)
            if v < 0 or not self._admit(c, candidate, v):
                return [*evicted, self._evict_one(c, "capacity")]
            evicted.extend(self._evict(v))
        return evicted

    def _admit(self, c: int, candidate: Hashable, v: int) -> bool:
        """TinyLFU's duel, fought against the entry that would actually leave (`v`)."""
        if v in self._doomed:
            return True
        if self.table.children[c] > 0:  # a prefix parent must outlive its resident children
            return True
        fc = self.sketch.frequency(candidate)
        fv = self.sketch.frequency(self._keys[v])
        if fc <= 1 and fv >= self.hot_frequency:
            return False
        if fc > fv:
            return True
        return fc >= HASHDOS_THRESHOLD and int(self._hashdos.integers(0, 128)) == 0

    def _pick_victim(self, exclude: Hashable | None = None) -> int:
        """Least heat among the oldest few main-region leaves; doomed entries first."""
        t = self.table
        for s in self._doomed:
            if t.children[s] == 0 and self._keys[s] != exclude and self._keys[s] not in self.window:
                return s
        if self._prefix_mode:
            return self._coldest_leaf(exclude)
        pool: list[int] = []
        for segment in (self.probation, self.protected):
            for key in segment:
                if key == exclude:
                    continue
                s = self._slot[key]
                if not t.children[s]:
                    pool.append(s)
                    if len(pool) >= self.victim_candidates:
                        break
            if pool:
                break
        if not pool:
            return -1
        return min(pool, key=self.eff.__getitem__)

    def _heard(self, key: Hashable) -> None:
        self.labeler.heard(key, self._tick, self.scorer)

    def _window_victim(self) -> int:
        """The least recent window entry without resident children (the main region is empty)."""
        for key in self.window:
            s = self._slot[key]
            if not self.table.children[s]:
                return s
        return -1

    def _coldest_leaf(self, exclude: Hashable | None) -> int:
        """Prefix chains: the least heat over every main-region leaf. The queue order says little
        here, as a chain is queued root first."""
        t = self.table
        mask = t.used & (t.children == 0) & ~self._windowed
        if exclude is not None and exclude in self._slot:
            mask[self._slot[exclude]] = False
        if not mask.any():
            return -1
        return int(np.where(mask, self.eff, np.inf).argmin())

    def _evict(self, v: int) -> list[Eviction]:
        reason = self._doomed.get(v)
        if reason is not None:
            return [self._evict_one(v, reason)]
        cluster = int(self.table.cluster[v])
        if cluster >= 0:
            t = self.table
            members = np.nonzero(t.used & (t.cluster == cluster))[0]
            if float(self.raw[members].max()) < self.cold_cluster:
                out = [self._evict_one(v, "cold_cluster")]
                for m in members[np.argsort(-t.depth[members], kind="stable")].tolist():
                    if m != v and t.used[m] and t.children[m] == 0:
                        out.append(self._evict_one(m, "cold_cluster"))
                return out
        return [self._evict_one(v, "capacity")]

    def _demote(self) -> None:
        while len(self.protected) > self.protected_max:
            key, _ = self.protected.popitem(last=False)
            self.probation[key] = None

    def _doom(self, s: int, reason: EvictionReason) -> None:
        self._doomed[s] = reason
        self.eff[s] = _ENDED if reason == "context_ended" else _EXPIRED

    # -- scoring ---------------------------------------------------------------------------------

    def _prior(self, x: np.ndarray) -> np.ndarray:
        w = self.prior_recency
        return (w * (1.0 - x[:, 0]) + (1.0 - w) * x[:, 2]).astype(np.float32)

    def _score_one(self, s: int, key: Hashable) -> float:
        """Heat of one entry, e.g. a newcomer before its duel."""
        t = self.table
        tid = int(t.trace[s])
        alive = tid < 0 or tid not in self._ended
        feats = t.features_one(s, self._tick, self._now_ms, alive, self.sketch.resets)
        if self._rng.random() < self.candidate_sample_rate:
            self.labeler.watch(key, np.asarray(feats, dtype=np.float32), self._tick)
        if not self.model_active:
            return self.prior_recency * (1.0 - feats[0]) + (1.0 - self.prior_recency) * feats[2]
        # Newcomers share few distinct feature vectors; cache their scores until the next step.
        q = tuple(round(f, 2) for f in feats)
        model = self._one_cache.get(q)
        if model is None:
            model = float(self.scorer.score(np.asarray([feats], dtype=np.float32))[0])
            self._one_cache[q] = model
        return model

    def _alive(self, idx: np.ndarray) -> np.ndarray:
        if not self._ended:
            return np.ones(len(idx), dtype=bool)
        return ~np.isin(self.table.trace[idx], np.fromiter(self._ended, dtype=np.int64))

    def _neighbour_heat(
        self, idx: np.ndarray, raw: np.ndarray, clusters: np.ndarray, clustered: np.ndarray, eff: np.ndarray
    ) -> np.ndarray:
        t = self.table
        ids, inverse = np.unique(clusters[clustered], return_inverse=True)
        hottest = np.zeros(len(ids), dtype=np.float32)
        np.maximum.at(hottest, inverse, raw[clustered])
        keep_alive = hottest[inverse] * np.exp(-t.distance[idx[clustered]] / self.neighbour_tau)
        t.neighbour[idx[clustered]] = keep_alive
        eff[clustered] = np.maximum(eff[clustered], keep_alive)
        return eff

    def _maybe_rescore(self, now_ms: int) -> None:
        if self._last_rescore_ms is None:
            self._last_rescore_ms = now_ms
        elif now_ms - self._last_rescore_ms >= self.rescore_ms:
            self.rescore(now_ms)

    # -- window sizing ---------------------------------------------------------------------------

    def _tune(self, key: Hashable, hit: bool) -> None:
        if self.tuner is not None:
            fraction = self.tuner.record(key)
            if fraction is not None:
                self._resize_window(min(self.capacity, max(1, round(fraction * self.capacity))))
        elif self.climber is not None:
            amount = self.climber.record(hit)
            if amount:
                self._resize_window(min(self.capacity, max(1, self.window_max + amount)))

    def _resize_window(self, window_max: int) -> None:
        # Growing needs no moves: main entries give way to the window as it fills.
        self.window_max = window_max
        self.protected_max = int(PROTECTED_PERCENT * (self.capacity - window_max))
        while self._window_used > self.window_max and len(self.window) > 1:
            key, _ = self.window.popitem(last=False)
            s = self._slot[key]
            self._windowed[s] = False
            self._window_used -= int(self.table.size[s])
            self.probation[key] = None
            self._set_heat(s, self._score_one(s, key))
        self._demote()

    # -- slot bookkeeping ------------------------------------------------------------------------

    def _apply_meta(self, s: int, meta: AccessMeta) -> None:
        t = self.table
        if meta.attention_heat is not None:
            t.attention[s] = min(max(meta.attention_heat, 0.0), 1.0)
            t.has_attention[s] = True
        if meta.trace_id is not None:
            t.trace[s] = self._trace_ids.setdefault(meta.trace_id, len(self._trace_ids))
        if meta.ttl_ms is not None:
            t.ttl_ms[s] = meta.ttl_ms
            t.inserted_ms[s] = self._now_ms
        if meta.cluster is not None:
            t.cluster[s] = meta.cluster

    def _stage(self, key: Hashable, size: int, parent: int, meta: AccessMeta | None) -> int:
        s = self._free.pop()
        t = self.table
        t.reset_slot(s)
        t.last_tick[s] = self._tick
        t.inserted_ms[s] = self._now_ms
        t.size[s] = size
        t.freq[s] = self.sketch.frequency(key)
        t.freq_epoch[s] = self.sketch.resets
        last = self._ghost.pop(key, None)
        if last is not None:
            t.gap[s] = self._tick - last
        if parent >= 0:
            t.parent[s] = parent
            t.depth[s] = t.depth[parent] + 1
            t.children[parent] += 1
        if meta is not None:
            self._apply_meta(s, meta)
        attention = self._pending_attention.pop(key, None)
        if attention is not None:
            t.attention[s] = attention
            t.has_attention[s] = True
        return s

    def _unstage(self, s: int) -> None:
        parent = int(self.table.parent[s])
        self.table.reset_slot(s)
        self._free.append(s)
        if parent >= 0:
            self.table.children[parent] -= 1

    def _commit(self, s: int, key: Hashable) -> None:
        self.table.used[s] = True
        self._slot[key] = s
        self._keys[s] = key
        self._used += int(self.table.size[s])
        prior = 0.5 + 0.5 * float(self.table.freq[s]) / 16.0
        self.raw[s] = self.eff[s] = prior

    def _set_heat(self, s: int, heat: float) -> None:
        if s not in self._doomed:
            self.raw[s] = self.eff[s] = heat

    def _evict_one(self, s: int, reason: EvictionReason) -> Eviction:
        key = self._keys[s]
        self._ghost[key] = int(self.table.last_tick[s])
        if len(self._ghost) > self.capacity:
            self._ghost.popitem(last=False)
        self._release(s)
        return Eviction(key, reason)

    def _release(self, s: int) -> None:
        t = self.table
        key = self._keys[s]
        del self._slot[key]
        self._keys[s] = None
        size = int(t.size[s])
        self._used -= size
        if key in self.window:
            del self.window[key]
            self._windowed[s] = False
            self._window_used -= size
        elif key in self.probation:
            del self.probation[key]
        else:
            self.protected.pop(key, None)
        self._doomed.pop(s, None)
        parent = int(t.parent[s])
        if t.children[s] > 0:
            # Removed from outside (delete / invalidation): its children lose their parent link.
            t.parent[np.nonzero(t.used & (t.parent == s))[0]] = -1
        t.reset_slot(s)
        self.raw[s] = self.eff[s] = 0.0
        self._free.append(s)
        if parent >= 0:
            t.children[parent] -= 1
