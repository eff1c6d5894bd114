"""The AI-native policy: a resident set that follows the best of a panel of experts, a learned heat
score for every entry, and the mesh's lifecycle signals (docs/design.md §1.2).

On a miss the panel's leader decides (`panel.py`, miniatures on a 1/`shadow_sample` (4) sample of the
keys): a key is admitted when the leader admits it; the victim is an ended conversation's or an expired
entry, else a key the leader does not hold, the coldest by heat (a new leader is followed once its lead
outweighs `migration_cost` (1.0) per key it lacks). Heat: an online MLP (`scorer.py`) re-scoring every
`rescore_ms` (100 ms), a prior until `warmup_labels` labels, spread over clusters (`neighbour_tau`,
`cold_cluster`). Prefix chains retire the panel: LRFU (`chains.py`, half-life `chain_half_life` (3)
capacities) times `chains.ChainReuse`; `guard.ChainGuard` stands the term down where it does not pay and
moves the half-life among `chain_half_lives` (3, 10, 30). Step by step: docs/heat.md.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Literal

import numpy as np

from policies.admission.sketch import FrequencySketch
from policies.base import AccessMeta, Eviction, EvictionReason, Policy
from policies.learned.chains import ChainReuse, LeafQueue
from policies.learned.features import N_FEATURES, EntryTable, keep_mask, view
from policies.learned.frame import HeatFrame, prior_heat
from policies.learned.ghosts import GhostTable
from policies.learned.guard import HALF_LIVES, ChainGuard
from policies.learned.panel import EXPERTS, MIN_MINIATURE
from policies.learned.panel_core import CompiledPanel, PanelSketch, heat_panel
from policies.learned.scorer import HeatScorer, ReuseLabeler
from policies.learned.signals import MeshSignals

FRAME = "heat-frame"
DEFAULT_EXPERTS = (*EXPERTS, FRAME)
# Up to this many foreign keys the coldest is found in Python; beyond, with one numpy pass.
_SMALL_FOREIGN = 32


class HeatPolicy(MeshSignals, Policy):
    name = "heat"
    size_aware = True
    prefix_aware = True

    def __init__(
        self,
        capacity: int,
        *,
        seed: int = 0,
        experts: Sequence[str] = DEFAULT_EXPERTS,
        migration_cost: float = 1.0,
        chain_half_life: float = 3.0,
        chain_half_lives: Sequence[float] = HALF_LIVES,  # the guard's candidates (guard.py)
        rescore_ms: int = 100,
        horizon: int | None = None,
        hidden: int = 16,
        sample_per_rescore: int = 16,
        candidate_sample_rate: float = 0.25,
        train_steps: int = 1,
        warmup_labels: int = 256,
        neighbour_tau: float = 0.1,
        cold_cluster: float = 0.05,
        evict_below: float = 0.1,
        scorer: Literal["auto", "model", "prior"] = "auto",
        prior_recency: float = 0.5,
        shadow_sample: int = 4,
        shadow_min: int = MIN_MINIATURE,
        rescore_accesses: int | None = None,
        ablate: Sequence[str] = (),
        chain_reuse: bool = True,
        # The learned chain term at half weight: why, docs/heat.md ("How the AI-native policy decides").
        chain_reuse_weight: float = 0.5,
        chain_guard: bool = True,  # `guard.ChainGuard`: the term stands down where it does not pay
        # The panel compiled (`panel_core.py`) where every expert is; False: Python's (the oracle)
        compiled_panel: bool = False,
    ) -> None:
        super().__init__(capacity)
        self.seed, self.chain_half_life, self.guarded = seed, chain_half_life, chain_guard
        self.chain_half_lives = tuple(chain_half_lives)
        self.chain_guard: ChainGuard | None = None
        self.rescore_ms = rescore_ms
        # ... but no more often than every `rescore_accesses` (capacity / 8) accesses: a batch
        # re-score costs the whole cache, so this bounds it at 8 entries' worth per access.
        self.rescore_accesses = capacity // 8 if rescore_accesses is None else rescore_accesses
        self.horizon = horizon if horizon is not None else max(4 * capacity, 256)
        self.sample_per_rescore = sample_per_rescore
        self.candidate_sample_rate = candidate_sample_rate
        self.train_steps = train_steps
        self.warmup_labels = warmup_labels
        self.neighbour_tau = neighbour_tau
        self.cold_cluster = cold_cluster
        self.evict_below = evict_below
        self.scorer_mode = scorer
        self.prior_recency = prior_recency
        self.migration_cost = migration_cost
        # Prefix chains: combined recency-frequency halves every `chain_half_life` capacities of
        # accesses (LRFU's lambda).
        self._lambda = 1.0 / (chain_half_life * capacity)
        sketch = FrequencySketch(capacity, seed=seed)
        # `ablate`: feature groups (`features.FEATURE_GROUPS`) the model sees as zeros (benches only)
        self.scorer = HeatScorer(N_FEATURES, hidden=hidden, seed=seed, keep=keep_mask(ablate))
        self.panel = heat_panel(  # W-TinyLFU and the frame read `sketch` (the miniatures their own)
            capacity,
            experts,
            compiled=compiled_panel,
            sketch=sketch,
            frame=lambda c, sketch: HeatFrame(c, sketch, self._frame_heat, seed=seed),
            seed=seed,
            sample=shadow_sample,
            min_miniature=shadow_min,
            prior_recency=prior_recency,
        )
        self.sketch: FrequencySketch | PanelSketch = sketch if self.panel is None else self.panel.sketch
        self.labeler = ReuseLabeler(self.horizon)
        slots = capacity + 1  # one spare: a newcomer is staged in a slot before room is made
        self.table = EntryTable(slots, capacity)
        self.raw = np.zeros(slots, dtype=np.float32)
        self.eff = np.zeros(slots, dtype=np.float32)
        self.crf = np.zeros(slots, dtype=np.float64)  # combined recency-frequency at the last access
        # ... and memoryviews of them for one slot at a time (see `EntryTable.v`)
        self._raw_v, self._eff_v, self._crf_v = view(self.raw), view(self.eff), view(self.crf)
        # The learned re-use term of the chain priority (`chains.ChainReuse`); off with scorer="prior"
        # or chain_reuse=False.
        self.chain_reuse = (
            ChainReuse(3 * capacity, weight=chain_reuse_weight) if chain_reuse and scorer != "prior" else None
        )
        self.extended = np.zeros(slots, dtype=bool)  # the block was ever a prefix parent
        self.sampled = np.zeros(slots, dtype=bool)  # the block's chain is in the guard's sample
        self._leaves = LeafQueue(
            self.table, self.crf, self._lambda, capacity, reuse=self.chain_reuse, extended=self.extended
        )
        self._slot: dict[Hashable, int] = {}
        self._keys: list[Hashable | None] = [None] * slots
        self._free = list(range(slots - 1, -1, -1))
        self._doomed: dict[int, EvictionReason] = {}  # ended / expired slots, evicted first
        self._foreign: dict[int, None] = {}  # slots the leading expert does not hold
        self._used = 0
        self._tick = 0
        self._now_ms = 0
        self._last_rescore_ms: int | None = None
        self._last_rescore_tick = 0
        self._unscored: dict[int, None] = {}  # newcomers not scored yet
        self._trace_ids: dict[str, int] = {}
        self._ended: set[int] = set()
        self._pending_attention: OrderedDict[Hashable, float] = OrderedDict()
        # Last access and CRF of recently evicted keys (about 4 capacities of them), so a returning
        # key keeps its inter-access gap and its history.
        self._ghost = GhostTable(4 * capacity)
        self._one_cache: dict[tuple[float, ...], float] = {}
        self._rng = np.random.default_rng(seed)
        self._checked: dict[int, int] = {}  # challenger -> tick its migration cost was last weighed
        self.rescores = 0
        self._prefix_mode = False  # set by the first block that names a prefix parent
        self._model_heat = False  # the compiled frame's heat is the model's (else the core's prior)

    # -- Policy interface -------------------------------------------------------------------

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slot

    def __len__(self) -> int:
        return len(self._slot)

    @property
    def used(self) -> int:
        return self._used

    @property
    def leader(self) -> str | None:
        """The expert the resident set follows (None without a panel)."""
        return None if self.panel is None else self.panel.leader_name

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        s = self._slot[key]
        self._tick += 1
        self._now_ms = now_ms
        self.sketch.increment(key)
        v, tick = self.table.v, self._tick
        last = v.last_tick[s]
        v.gap[s] = tick - last
        crf = self._crf_v
        crf[s] = 1.0 + crf[s] * 2.0 ** (-self._lambda * (tick - last))
        v.last_tick[s] = tick
        v.hits[s] += 1
        if self._prefix_mode:
            self._hear_chain(key, meta, bool(self.sampled[s]), int(v.size[s]))
            if v.children[s] == 0:
                self._leaves.push(s)
        v.freq[s] = self.sketch.frequency(key)
        v.freq_epoch[s] = self.sketch.resets
        if meta is not None:
            self.table.apply_meta(s, meta, self._trace_ids, self._now_ms)
        self.labeler.heard(key, self._tick, self.scorer)
        self._consult(key, now_ms, meta)
        self._maybe_rescore(now_ms)

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        self._tick += 1
        self._now_ms = now_ms
        self.sketch.increment(key)
        self.labeler.heard(key, self._tick, self.scorer)
        self._consult(key, now_ms, meta)
        if size > self.capacity:
            return [Eviction(key, "rejected")]
        parent = -1
        if meta is not None and meta.parent is not None:
            parent = self._slot.get(meta.parent, -1)
            if parent < 0:
                return [Eviction(key, "rejected")]  # an orphan block can never be hit
            if not self._prefix_mode:
                self._enter_prefix_mode()
        sampled = self.chain_guard is not None and self.chain_guard.admits(key, parent, self.sampled)
        if self._prefix_mode:
            self._hear_chain(key, meta, sampled, size)
        bypassed = self.panel is not None and not self.panel.holds(key)
        if bypassed and self._used + size > self.capacity:
            return [Eviction(key, "rejected")]  # the leader bypassed it: so does the cache
        self._maybe_rescore(now_ms)
        s = self._stage(key, size, parent, meta)
        evicted: list[Eviction] = []
        while self._used + size > self.capacity:
            v = self._pick_victim(exclude=parent)
            if v < 0:
                self._unstage(s)
                return [*evicted, Eviction(key, "rejected")]
            evicted.extend(self._evict(v))
        self._commit(s, key)
        self.sampled[s] = sampled
        self._sample_newcomer(s, key)
        self._unscored[s] = None  # scored when its heat is first compared (or by the next batch)
        if bypassed:
            self._foreign[s] = None
        if self._prefix_mode:
            self._leaves.push(s)
        return evicted

    def _hear_chain(self, key: Hashable, meta: AccessMeta | None, sampled: bool, size: int) -> None:
        """The chain re-use model hears a block's access, and that its parent was extended; the guard
        hears it (and the block's size) when the block's chain is in its sample."""
        if self.chain_reuse is not None:
            self.chain_reuse.heard(key, self._tick)
            parent = None if meta is None else meta.parent
            if parent is not None:
                self.chain_reuse.extended(parent)
            if sampled and self.chain_guard is not None:
                self.chain_guard.heard(key, parent, self._now_ms, size)

    def set_half_life(self, half_life: float) -> None:
        """LRFU's half-life, in capacities of accesses: the leaf queue is rebuilt at the new rate."""
        self.chain_half_life, self._lambda = half_life, 1.0 / (half_life * self.capacity)
        self._leaves.rebuild(self._lambda)

    def on_remove(self, key: Hashable) -> None:
        s = self._slot.get(key)
        if s is not None:
            self._release(s)

    # -- following the panel ---------------------------------------------------------------------

    def _consult(self, key: Hashable, now_ms: int, meta: AccessMeta | None) -> None:
        """Replay the access in the experts; what the leader evicted becomes foreign here."""
        panel = self.panel
        if panel is None:
            return
        chained = meta is not None and meta.parent is not None
        if isinstance(panel, CompiledPanel):
            if not self._model_heat and self.model_active:
                panel.use_heat(self._frame_heat)
                self._model_heat = True
            left = panel.access_slots(key, chained, self._slot)
        else:
            left = [s for k in panel.access(key, now_ms, chained) if (s := self._slot.get(k)) is not None]
        for s in left:
            self._foreign[s] = None
        here = self._slot.get(key)
        if here is not None and here in self._foreign and panel.holds(key):
            del self._foreign[here]
        if panel.contested:
            self._weigh_challenger()

    def _weigh_challenger(self) -> None:
        """Switch to the challenger whose lead best outweighs its migration: each resident key it
        does not hold is an entry the cache gives up without evidence (`migration_cost` apiece).
        Among equally good challengers this prefers the one closest to the resident set."""
        panel = self.panel
        assert panel is not None
        best, best_net = -1, 0.0
        recheck = max(64, self.capacity // 16)
        for challenger, lead in panel.challengers():
            if self.migration_cost <= 0:
                net = lead
            else:
                last = self._checked.get(challenger)
                if last is not None and self._tick - last < recheck:
                    continue
                self._checked[challenger] = self._tick
                net = lead - self.migration_cost * panel.missing(challenger, self._slot)
            if net > best_net:
                best, best_net = challenger, net
        if best < 0:
            return
        panel.follow(best, self._oldest_first() if panel.sample > 1 else (), self._now_ms)
        self._checked.clear()
        holds = panel.holds
        self._foreign = {s: None for k, s in self._slot.items() if not holds(k)}

    def _oldest_first(self) -> list[Hashable]:
        """The resident keys, least recently heard first (how a new driver is handed them)."""
        t = self.table
        idx = np.nonzero(t.used)[0]
        return [self._keys[s] for s in idx[np.argsort(t.last_tick[idx], kind="stable")].tolist()]

    @property
    def model_active(self) -> bool:
        """Whether the MLP (rather than the prior) scores: it is trained, and with `scorer="auto"` the
        entries are not prefix chains."""
        if self.scorer_mode == "prior" or self.scorer.labels_seen < self.warmup_labels:
            return False
        return self.scorer_mode == "model" or not self._prefix_mode

    @property
    def learning(self) -> bool:
        """Whether the model trains: it scores this cache's entries, or will once trained (with
        `scorer="auto"` prefix chains stay on the prior, so there it does not)."""
        return self.scorer_mode == "model" or (self.scorer_mode == "auto" and not self._prefix_mode)

    def rescore(self, now_ms: int | None = None) -> None:
        """Learn from the labels that came due, then score every resident entry in one batch."""
        now = self._now_ms if now_ms is None else now_ms
        self._last_rescore_ms = now
        self._last_rescore_tick = self._tick
        self.rescores += 1
        self.labeler.expire(self._tick, self.scorer)
        if self.learning and self.scorer.train(self.train_steps) is not None:
            self._one_cache.clear()
            if self.panel is not None:
                self.panel.invalidate()
        self._score_all(now)

    def _score_all(self, now: int) -> None:
        t = self.table
        self._unscored.clear()  # every resident entry is scored here
        idx = np.nonzero(t.used)[0]
        if len(idx) == 0:
            return
        alive = self._alive(idx)
        x: np.ndarray | None = None
        if self.model_active:
            x = t.features(idx, self._tick, now, alive, self.sketch.resets)
            raw = self.scorer.score(x).astype(np.float32)
        else:
            rf = t.recency_frequency(idx, self._tick, self.sketch.resets)
            w = self.prior_recency
            raw = (w * (1.0 - rf[:, 0]) + (1.0 - w) * rf[:, 1]).astype(np.float32)
        self.raw[idx] = raw
        eff = raw.copy()
        clusters = t.cluster[idx]
        clustered = clusters >= 0
        if clustered.any():
            eff = t.neighbour_keep_alive(idx, raw, clusters, clustered, eff, self.neighbour_tau)
        self.eff[idx] = eff
        for s in idx[~alive].tolist():
            self._doom(s, "context_ended")
        ttl = t.ttl_ms[idx]
        for s in idx[(ttl > 0) & (now - t.inserted_ms[idx] >= ttl)].tolist():
            self._doom(s, "expired")
        if not self.learning:
            return
        k = min(self.sample_per_rescore, len(idx))
        picks = self._rng.choice(len(idx), size=k, replace=False)
        if x is None:
            x = t.features(idx[picks], self._tick, now, alive[picks], self.sketch.resets)
        else:
            x = x[picks]
        for j, row in zip(picks.tolist(), x, strict=True):
            key = self._keys[idx[j]]
            if key is not None:
                self.labeler.watch(key, row, self._tick)

    # -- eviction ----------------------------------------------------------------------------------

    def _pick_victim(self, exclude: int = -1) -> int:
        """Doomed leaves first, then the coldest foreign leaf, then the coldest leaf of all (by
        combined recency-frequency for prefix chains)."""
        t = self.table
        for s in self._doomed:
            if t.children[s] == 0 and s != exclude:
                return s
        if self._prefix_mode:
            return self._leaves.least(exclude)
        foreign = self._foreign
        if foreign:
            if len(foreign) <= _SMALL_FOREIGN:
                if len(foreign) > 1:
                    self._fresh(list(foreign))
                eff = self.eff
                best, best_heat = -1, np.inf
                for s in foreign:
                    if s != exclude and t.children[s] == 0 and eff[s] < best_heat:
                        best, best_heat = s, eff[s]
                if best >= 0:
                    return best
            else:
                mask = np.zeros(t.slots, dtype=bool)
                mask[np.fromiter(foreign, dtype=np.int64, count=len(foreign))] = True
                v = self._coldest_leaf(mask, exclude)
                if v >= 0:
                    return v
        return self._coldest_leaf(t.used.copy(), exclude)

    def retire_table(self) -> None:
        """A compiled core took the entries over (compiled.py): free what held them."""
        self.table = EntryTable(1, 1)
        self.raw, self.eff = np.zeros(1, dtype=np.float32), np.zeros(1, dtype=np.float32)
        self.crf, self.extended, self.sampled = np.zeros(1), np.zeros(1, dtype=bool), np.zeros(1, dtype=bool)
        self._raw_v, self._eff_v, self._crf_v = view(self.raw), view(self.eff), view(self.crf)
        self._slot, self._keys, self._free = {}, [None], [0]
        self._ghost = GhostTable(2)
        self._leaves = LeafQueue(self.table, self.crf, self._lambda, 1)
        self.sketch = FrequencySketch(1)
        self.panel = self.chain_guard = None

    def _enter_prefix_mode(self) -> None:
        """The first block that names a parent: chains are evicted leaf by leaf by combined
        recency-frequency, so the panel (whose experts know no chains) retires."""
        self._prefix_mode = True
        self.panel = None
        self.chain_guard = ChainGuard.around(self) if self.guarded else None
        self._foreign.clear()
        t = self.table
        for s in np.nonzero(t.used & (t.children == 0))[0].tolist():
            self._leaves.push(s)

    def _coldest_leaf(self, mask: np.ndarray, exclude: int) -> int:
        """The least heat over the leaves in `mask` (staged newcomers are not `used` yet)."""
        t = self.table
        mask &= t.used & (t.children == 0)
        if exclude >= 0:
            mask[exclude] = False
        if not mask.any():
            return -1
        self._fresh_all()
        return int(np.where(mask, self.eff, np.inf).argmin())

    def _evict(self, v: int) -> list[Eviction]:
        reason = self._doomed.get(v)
        if reason is not None:
            return [self._evict_one(v, reason)]
        cluster = int(self.table.cluster[v])
        if cluster >= 0:
            t = self.table
            members = np.nonzero(t.used & (t.cluster == cluster))[0]
            self._fresh(members.tolist())
            if float(self.raw[members].max()) < self.cold_cluster:
                out = [self._evict_one(v, "cold_cluster")]
                for m in members[np.argsort(-t.depth[members], kind="stable")].tolist():
                    if m != v and t.used[m] and t.children[m] == 0:
                        out.append(self._evict_one(m, "cold_cluster"))
                return out
        return [self._evict_one(v, "capacity")]

    # -- scoring ---------------------------------------------------------------------------------

    def _frame_heat(self, x: np.ndarray) -> np.ndarray:
        return self.scorer.score(x) if self.model_active else prior_heat(x, self.prior_recency)

    def _features_one(self, s: int) -> tuple[float, ...]:
        t = self.table
        tid = int(t.trace[s])
        alive = tid < 0 or tid not in self._ended
        return t.features_one(s, self._tick, self._now_ms, alive, self.sketch.resets)

    def _sample_newcomer(self, s: int, key: Hashable) -> None:
        """A `candidate_sample_rate` share of newcomers is watched for a re-use label."""
        if self.learning and self._rng.random() < self.candidate_sample_rate:
            feats = self._features_one(s)
            self.labeler.watch(key, np.asarray(feats, dtype=np.float32), self._tick)

    def _fresh(self, slots: list[int]) -> None:
        """Score the newcomers among `slots` that have no heat yet (a newcomer's heat is needed
        only when it is compared: most are scored by the next batch first)."""
        unscored = self._unscored
        if not unscored:
            return
        for s in slots:
            if s in unscored:
                del unscored[s]
                if s not in self._doomed:
                    self.raw[s] = self.eff[s] = self._score_one(s)

    def _fresh_all(self) -> None:
        if self._unscored:
            self._fresh(list(self._unscored))

    def _score_one(self, s: int, key: Hashable | None = None) -> float:
        """Heat of one entry, e.g. a newcomer until the next batch re-score (`key` is not read)."""
        feats = self._features_one(s)
        if not self.model_active:
            return self.prior_recency * (1.0 - feats[0]) + (1.0 - self.prior_recency) * feats[2]
        # Newcomers share few distinct feature vectors; cache their scores until the next step.
        q = tuple([round(f, 2) for f in feats])
        model = self._one_cache.get(q)
        if model is None:
            model = float(self.scorer.score(np.asarray([feats], dtype=np.float32))[0])
            self._one_cache[q] = model
        return model

    def _alive(self, idx: np.ndarray) -> np.ndarray:
        if not self._ended:
            return np.ones(len(idx), dtype=bool)
        return ~np.isin(self.table.trace[idx], np.fromiter(self._ended, dtype=np.int64))

    def _maybe_rescore(self, now_ms: int) -> None:
        if self._last_rescore_ms is None:
            self._last_rescore_ms, self._last_rescore_tick = now_ms, self._tick
        elif now_ms - self._last_rescore_ms >= self.rescore_ms and (
            self._tick - self._last_rescore_tick >= self.rescore_accesses
        ):
            self.rescore(now_ms)

    # -- slot bookkeeping ------------------------------------------------------------------------

    def _stage(self, key: Hashable, size: int, parent: int, meta: AccessMeta | None) -> int:
        s = self._free.pop()  # free slots are reset when they are released
        t, v = self.table, self.table.v
        v.last_tick[s] = self._tick
        v.inserted_ms[s] = self._now_ms
        v.size[s] = size
        v.freq[s] = self.sketch.frequency(key)
        v.freq_epoch[s] = self.sketch.resets
        ghost = self._ghost.pop(key)
        if ghost is None:
            self._crf_v[s] = 1.0
        else:
            last, crf = ghost
            v.gap[s] = self._tick - last
            self._crf_v[s] = 1.0 + crf * 2.0 ** (-self._lambda * (self._tick - last))
        if parent >= 0:
            v.parent[s] = parent
            v.depth[s] = v.depth[parent] + 1
            v.children[parent] += 1
            self.extended[parent] = True
        if meta is not None:
            self.table.apply_meta(s, meta, self._trace_ids, self._now_ms)
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
            if self._prefix_mode and self.table.children[parent] == 0:
                self._leaves.push(parent)  # a leaf again: queued, or no search would find it

    def _commit(self, s: int, key: Hashable) -> None:
        v = self.table.v
        v.used[s] = True
        self._slot[key] = s
        self._keys[s] = key
        self._used += v.size[s]
        if isinstance(self.panel, CompiledPanel):
            self.panel.admitted(key, s)

    def _evict_one(self, s: int, reason: EvictionReason) -> Eviction:
        key = self._keys[s]
        self._ghost.put(key, self.table.v.last_tick[s], self._crf_v[s])
        self._release(s)
        return Eviction(key, reason)

    def _release(self, s: int) -> None:
        t, v = self.table, self.table.v
        key = self._keys[s]
        del self._slot[key]
        self._keys[s] = None
        if isinstance(self.panel, CompiledPanel):
            self.panel.released(key)
        self._used -= v.size[s]
        self._doomed.pop(s, None)
        self._foreign.pop(s, None)
        self._unscored.pop(s, None)
        parent = v.parent[s]
        if v.children[s] > 0:
            # Removed from outside (delete / invalidation): its children lose their parent link.
            t.parent[np.nonzero(t.used & (t.parent == s))[0]] = -1
        t.reset_slot(s)
        self.extended[s] = self.sampled[s] = False
        self._raw_v[s] = self._eff_v[s] = self._crf_v[s] = 0.0
        self._free.append(s)
        if parent >= 0:
            t.children[parent] -= 1
            if self._prefix_mode and t.children[parent] == 0:
                self._leaves.push(parent)
