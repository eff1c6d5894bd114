"""What the mesh tells the heat policy besides accesses (kv.events attention heat, semantic clusters,
context.lifecycle ends, TTLs) and what it tells the mesh back (`scores`): a mixin of `HeatPolicy`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from policies.base import Eviction, EvictionReason
from policies.learned.features import EntryTable

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


class MeshSignals:
    """The mesh-signal half of `HeatPolicy`; the state it reads is the policy's."""

    capacity: int
    table: EntryTable
    raw: np.ndarray
    eff: np.ndarray
    evict_below: float
    _slot: dict[Hashable, int]
    _pending_attention: OrderedDict[Hashable, float]
    _trace_ids: dict[str, int]
    _ended: set[int]
    _doomed: dict[int, EvictionReason]

    def _evict_one(self, s: int, reason: EvictionReason) -> Eviction:
        raise NotImplementedError

    def _fresh_all(self) -> None:
        """Score the newcomers that have no heat yet."""

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
        if s is None:
            return None
        self._fresh_all()
        return max(float(self.eff[s]), 0.0)

    def scores(self) -> Iterator[HeatScore]:
        """Current heat and decision per resident key: `evict` when colder than `evict_below` (or
        bound to an ended trace / expired), `keep-alive` when only a hot neighbour or a resident
        prefix child keeps it, `keep` otherwise."""
        self._fresh_all()
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

    def _doom(self, s: int, reason: EvictionReason) -> None:
        self._doomed[s] = reason
        self.eff[s] = _ENDED if reason == "context_ended" else _EXPIRED
