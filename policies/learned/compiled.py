"""The heat policy with its prefix-chain mode compiled (`heatcore/`, Rust through PyO3).

`CompiledHeat` is `HeatPolicy`, its panel compiled (`panel_core.py`), until the first block that
names a resident parent. There the Python
policy would retire its panel and evict leaf by leaf (chains.py); instead its state moves into
`cachemesh_heatcore.ChainHeat`, which decides from then on as `HeatPolicy` does, decision for decision
(tests/unit/policies/test_heatcore.py replays both). Keys that are not 64-bit ints are interned.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

import numpy as np
from cachemesh_heatcore import REASONS, ChainHeat

from policies.base import AccessMeta, Eviction, EvictionReason, Policy
from policies.learned.chains import reuse_counts
from policies.learned.guard import HALF_LIVES, GuardState
from policies.learned.heat import HeatPolicy
from policies.learned.panel_core import CompiledPanel
from policies.learned.signals import Decision, HeatScore

_I64 = (-(2**63), 2**63)
_REASONS: tuple[EvictionReason, ...] = ("capacity", "rejected", "expired", "context_ended", "cold_cluster")
assert _REASONS == REASONS, "the core's reason codes"
_CODES: dict[str, int] = {reason: code for code, reason in enumerate(_REASONS)}
_NONE = -1  # no interned key has this id (they count up from 0)
_DECISIONS: dict[int, Decision] = {1: "keep", 2: "keep-alive", 3: "evict"}  # the core's codes


class CompiledReuse:
    """`chains.ChainReuse`'s face (probability, labels, to_dict, load) over the core's counts."""

    def __init__(self, core: ChainHeat) -> None:
        self._core = core

    def _counts(self) -> tuple[list[float], list[float], int]:
        counts = self._core.reuse_counts()
        assert counts is not None
        return counts

    @property
    def labels(self) -> int:
        return self._counts()[2]

    def probability(self, extended: bool) -> float:
        yes, seen, _ = self._counts()
        return (yes[extended] + 1.0) / (seen[extended] + 2.0)

    def to_dict(self) -> dict[str, list[float] | int]:
        yes, seen, labels = self._counts()
        return {"yes": yes, "seen": seen, "labels": labels}

    def load(self, data: dict[str, list[float] | int]) -> None:
        self._core.load_reuse(*reuse_counts(data))


class CompiledGuard:
    """`guard.ChainGuard`'s `state()` over the core's guard."""

    def __init__(self, core: ChainHeat) -> None:
        self._core = core

    def state(self) -> GuardState:
        state = self._core.guard_state()
        assert state is not None
        return GuardState(*state)


class CompiledHeat(Policy):
    name = "heat"
    size_aware = True
    prefix_aware = True

    def __init__(self, capacity: int, **options: Any) -> None:
        super().__init__(capacity)
        # Until its chains begin, the reference decides, with its panel compiled (panel_core.py).
        self.reference = HeatPolicy(capacity, **{"compiled_panel": True, **options})
        self.chain_half_life = float(options.get("chain_half_life", 3.0))
        self.chain_half_lives = [float(h) for h in options.get("chain_half_lives", HALF_LIVES)]
        self.core: ChainHeat | None = None
        self._interned = False  # keys are ids of the core as they are (ints), or interned here
        self._ids: dict[Hashable, int] = {}
        self._keys: dict[int, Hashable] = {}
        self._next_id = 0
        self._reuse: CompiledReuse | None = None

    def __getattr__(self, name: str) -> Any:
        # What is not the policy interface (scorer, panel, leader, ...) is the reference's.
        reference = self.__dict__.get("reference")
        if reference is None:
            raise AttributeError(name)
        return getattr(reference, name)

    # -- keys -----------------------------------------------------------------------------------

    def _id(self, key: Hashable) -> int:
        if not self._interned:
            if not (isinstance(key, int) and _I64[0] <= key < _I64[1]):
                raise TypeError(f"this policy's keys are 64-bit ints (as when its chains began), not {key!r}")
            return key
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = self._next_id
            self._keys[got] = key
            self._next_id += 1
        return got

    def _known(self, key: Hashable | None) -> int | None:
        """The id of `key` (None for None); a key that cannot be held gets an id the core does not hold."""
        if key is None:
            return None
        if self._interned:
            return self._ids.get(key, _NONE)  # ids are >= 0
        if isinstance(key, int) and _I64[0] <= key < _I64[1]:
            return key
        assert self.core is not None
        absent = _NONE
        while absent in self.core:
            absent -= 1
        return absent

    def _key(self, i: int) -> Hashable:
        return self._keys[i] if self._interned else i

    def _gone(self, evicted: list[tuple[int, int]]) -> list[Eviction]:
        out = []
        for i, code in evicted:
            key = self._key(i)
            out.append(Eviction(key, _REASONS[code]))
            if self._interned and i not in self.core:  # type: ignore[operator]
                self._forget(i)
        return out

    def _forget(self, i: int) -> None:
        key = self._keys.pop(i, None)
        if key is not None:
            self._ids.pop(key, None)

    # -- Policy interface -----------------------------------------------------------------------

    def __contains__(self, key: Hashable) -> bool:
        if self.core is None:
            return key in self.reference
        if self._interned:
            i = self._ids.get(key)
            return i is not None and i in self.core
        return isinstance(key, int) and _I64[0] <= key < _I64[1] and key in self.core

    def __len__(self) -> int:
        return len(self.reference) if self.core is None else len(self.core)

    @property
    def used(self) -> int:
        return self.reference.used if self.core is None else self.core.used

    @property
    def leader(self) -> str | None:
        return self.reference.leader if self.core is None else None

    @property
    def chain_reuse(self) -> Any:
        return self.reference.chain_reuse if self.core is None else self._reuse

    @property
    def chain_guard(self) -> Any:
        if self.core is None:
            return self.reference.chain_guard
        return None if self.core.guard_state() is None else CompiledGuard(self.core)

    @property
    def rescores(self) -> int:
        return self.reference.rescores if self.core is None else self.core.rescores

    def _meta(self, meta: AccessMeta | None) -> tuple[int | None, int | None, int | None, int | None]:
        """(parent, trace, ttl_ms, cluster) as the core takes them, positionally."""
        if meta is None:
            return None, None, None, None
        trace = None
        if meta.trace_id is not None:
            ids = self.reference._trace_ids
            trace = ids.setdefault(meta.trace_id, len(ids))
        # (attention heat is read by the model only, which does not score prefix chains)
        return self._known(meta.parent), trace, meta.ttl_ms, meta.cluster

    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        if self.core is None:
            self.reference.on_hit(key, now_ms, meta)
        else:
            self.core.on_hit(self._id(key), now_ms, *self._meta(meta))

    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        if self.core is None:
            ref = self.reference
            if meta is None or meta.parent is None or ref._prefix_mode or meta.parent not in ref:
                return ref.on_miss(key, now_ms, size, meta)
            if ref.scorer_mode == "model":
                # The core scores chains by the prior; with scorer="model" the MLP does (cold clusters
                # read it), so the reference keeps deciding.
                return ref.on_miss(key, now_ms, size, meta)
            if size > self.capacity:
                return ref.on_miss(key, now_ms, size, meta)
            self._hand_over()
        core = self.core
        assert core is not None
        return self._gone(core.on_miss(self._id(key), now_ms, size, *self._meta(meta)))

    def start_half_life(self, half_life: float) -> bool:
        """The LRFU half-life the chains begin at (a checkpoint's: where the guard had moved it); the
        guard starts from it. False, and nothing changes, once the chains have begun."""
        if self.core is not None:
            return False
        self.chain_half_life = half_life
        self.reference.set_half_life(half_life)
        return True

    def on_remove(self, key: Hashable) -> None:
        if self.core is None:
            self.reference.on_remove(key)
            return
        if key in self:
            i = self._id(key)
            self.core.remove(i)
            if self._interned:
                self._forget(i)

    def replay_prefix(self, keys: np.ndarray, starts: np.ndarray, times: np.ndarray) -> np.ndarray:
        """`sim.replay`'s prefix replay, the requests after the hand-over in one call to the core."""
        mask = np.zeros(len(keys), dtype=bool)
        bounds = starts.tolist()
        r = 0
        while r < len(bounds) - 1 and (self.core is None or self._interned):
            lo, hi = bounds[r], bounds[r + 1]
            in_prefix, parent = True, None
            for i, key, now in zip(range(lo, hi), keys[lo:hi].tolist(), times[lo:hi].tolist(), strict=True):
                access = AccessMeta(parent=parent)
                if key in self:
                    self.on_hit(key, now, access)
                    mask[i] = in_prefix
                else:
                    in_prefix = False
                    self.on_miss(key, now, 1, access)
                parent = key
            r += 1
        if r < len(bounds) - 1 and self.core is not None:
            rest = self.core.replay_prefix(
                np.ascontiguousarray(keys, dtype=np.int64),
                np.ascontiguousarray(starts[r:], dtype=np.int64),
                np.ascontiguousarray(times, dtype=np.int64),
            )
            lo = bounds[r]
            mask[lo:] = rest[lo:]
        return mask

    @property
    def native_bytes(self) -> int:
        """Bytes the compiled core (or, before chains, the compiled panel) holds outside Python's
        allocator."""
        if self.core is not None:
            return self.core.nbytes()
        panel = self.reference.panel
        return panel.native_bytes if isinstance(panel, CompiledPanel) else 0

    # -- mesh signals -----------------------------------------------------------------------------

    def observe_attention_heat(self, key: Hashable, heat: float) -> None:
        """Before the hand-over as `HeatPolicy`; after it not read (a feature of the model, which does
        not score prefix chains)."""
        if self.core is None:
            self.reference.observe_attention_heat(key, heat)

    def observe_cluster(self, key: Hashable, cluster: int, distance: float = 0.0) -> None:
        if self.core is None:
            self.reference.observe_cluster(key, cluster, distance)
            return
        if key in self:
            self.core.observe_cluster(self._id(key), cluster, distance)

    def end_trace(self, trace_id: str, now_ms: int, evict: bool = True) -> list[Eviction]:
        if self.core is None:
            return self.reference.end_trace(trace_id, now_ms, evict)
        tid = self.reference._trace_ids.get(trace_id)
        return [] if tid is None else self._gone(self.core.end_trace(tid, evict))

    def expire(self, now_ms: int) -> list[Eviction]:
        if self.core is None:
            return self.reference.expire(now_ms)
        return self._gone(self.core.expire(now_ms))

    def rescore(self, now_ms: int | None = None) -> None:
        if self.core is None:
            self.reference.rescore(now_ms)
        else:
            self.core.rescore(now_ms)

    def heat(self, key: Hashable) -> float | None:
        if self.core is None:
            return self.reference.heat(key)
        return self.core.heat(self._id(key)) if key in self else None

    def scores(self) -> Iterator[HeatScore]:
        """As `HeatPolicy.scores`: `evict` below `evict_below` (a leaf), `keep-alive` when only a
        neighbour or a child keeps it, `keep` otherwise."""
        if self.core is None:
            yield from self.reference.scores()
            return
        below = self.reference.evict_below
        columns = [column.tolist() for column in self.core.table()]
        for i, e, r, c, p in zip(*columns, strict=True):
            decision: Decision = "evict" if e < below and not p else "keep-alive" if r < below else "keep"
            yield HeatScore(self._key(i), max(e, 0.0), None if c < 0 else c, decision)

    def changed_scores(self) -> Iterator[HeatScore]:
        """`scores()` of the entries whose decision differs from the one this last gave for them (an
        `evict` is given every time): what a re-score round publishes, found in the core (before
        chains, every score)."""
        if self.core is None:
            yield from self.reference.scores()
            return
        keys, eff, clusters, codes = self.core.changed(self.reference.evict_below)
        for i, e, c, code in zip(keys.tolist(), eff.tolist(), clusters.tolist(), codes.tolist(), strict=True):
            yield HeatScore(self._key(i), max(e, 0.0), None if c < 0 else c, _DECISIONS[code])

    # -- the hand-over --------------------------------------------------------------------------------

    def _hand_over(self) -> None:
        """Move the reference's state into a `ChainHeat`, as `HeatPolicy._enter_prefix_mode` would
        start from it."""
        ref = self.reference
        self._interned = not all(isinstance(k, int) and _I64[0] <= k < _I64[1] for k in ref._slot)
        core = ChainHeat(
            self.capacity,
            seed=ref.sketch.seed,
            chain_reuse=ref.chain_reuse is not None,
            chain_reuse_weight=1.0 if ref.chain_reuse is None else ref.chain_reuse.weight,
            chain_half_life=self.chain_half_life,
            chain_half_lives=self.chain_half_lives,
            rescore_ms=ref.rescore_ms,
            rescore_accesses=ref.rescore_accesses,
            neighbour_tau=ref.neighbour_tau,
            cold_cluster=ref.cold_cluster,
            prior_recency=ref.prior_recency,
            chain_guard=ref.guarded,
        )
        t = ref.table
        for s in np.nonzero(t.used)[0].tolist():
            key = ref._keys[s]
            core.load_slot(
                s, self._id(key), int(t.last_tick[s]), float(ref.crf[s]), int(t.size[s]),
                int(t.inserted_ms[s]), int(t.ttl_ms[s]), int(t.trace[s]), int(t.depth[s]), int(t.parent[s]),
                int(t.children[s]), int(t.freq[s]), int(t.freq_epoch[s]), int(t.cluster[s]),
                float(t.distance[s]), float(ref.raw[s]), float(ref.eff[s]), bool(ref.extended[s]),
                s in ref._unscored,
            )  # fmt: skip
        core.load_state(
            list(ref._free),
            [(s, _CODES[reason]) for s, reason in ref._doomed.items()],
            list(ref._ended),
            ref._tick,
            ref._now_ms,
            ref._last_rescore_ms,
            ref._last_rescore_tick,
            ref.rescores,
        )
        ghost = ref._ghost
        core.load_ghosts(
            np.frombuffer(ghost._tag, dtype=np.int64),
            np.frombuffer(ghost._last, dtype=np.int64),
            np.frombuffer(ghost._crf, dtype=np.float32),
        )
        core.load_sketch(*ref.sketch.state())
        reuse = ref.chain_reuse
        if reuse is not None:
            core.load_reuse((reuse.yes[0], reuse.yes[1]), (reuse.seen[0], reuse.seen[1]), reuse.labels)
            core.load_reuse_pending(
                [(self._id(k), v) for k, v in reuse._pending.items()],
                [(tick, self._id(k)) for tick, k in reuse._order],
            )
            self._reuse = CompiledReuse(core)
        core.start_chains()
        self.core = core
        ref.retire_table()
