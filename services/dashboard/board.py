"""What the dashboard shows, kept in memory: time series (hit rate per tier, QPS/entropy, warmup Δt,
invalidations) and the latest rows (drift clusters, heat and warmup decisions, degrade/breaker state,
the gateways' engine instances and routing decisions). Pure: fed tier-node stats, gateway reports and
events by the service, the clock passed in."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from schemas.events import (
    DriftClustered,
    Event,
    InvalidationRecorded,
    TierModeChanged,
    WarmupApplied,
    WarmupDecided,
    WarmupMeasured,
    WindowComputed,
    heat_decisions,
)

TIERS = ("l1", "l2", "l3")


class Series:
    """A named group of aligned columns over time (uPlot's shape: `[[t...], [y1...], ...]`), bounded."""

    def __init__(self, columns: tuple[str, ...], max_points: int) -> None:
        self.columns = columns
        self.t: deque[float] = deque(maxlen=max_points)
        self.values: dict[str, deque[float | None]] = {c: deque(maxlen=max_points) for c in columns}

    def add(self, t_s: float, **values: float | None) -> None:
        self.t.append(t_s)
        for column in self.columns:
            self.values[column].append(values.get(column))

    def __len__(self) -> int:
        return len(self.t)

    def as_dict(self) -> dict[str, Any]:
        return {
            "columns": list(self.columns),
            "t": list(self.t),
            **{c: list(v) for c, v in self.values.items()},
        }


@dataclass
class _NodeCounts:
    lookups: int = 0
    hits_by_tier: dict[str, int] = field(default_factory=dict)


class Board:
    """Turns cumulative tier-node counters into per-interval hit rates, and events into series and rows."""

    def __init__(self, max_points: int = 600, max_rows: int = 20) -> None:
        self.hit_rate = Series(("all", *TIERS), max_points)
        self._windows: dict[int, tuple[float, float, int]] = {}  # window end -> (qps, entropy sum, n)
        self.warmup_delta = Series(("delta_t_ms",), max_points)
        self.invalidations = Series(("dependants",), max_points)
        self.nodes: dict[str, dict[str, Any]] = {}
        self.drift: dict[str, dict[str, Any]] = {}
        self.heat: deque[dict[str, Any]] = deque(maxlen=max_rows)
        self.warmups: deque[dict[str, Any]] = deque(maxlen=max_rows)
        self.mode_changes: deque[dict[str, Any]] = deque(maxlen=max_rows)
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}
        self.routes: list[dict[str, Any]] = []
        self.warms: dict[str, dict[str, Any]] = {}  # per gateway: its warm counts
        self.totals: dict[str, int] = {
            "heat_decisions": 0,
            "warmup_decisions": 0,
            "warmups_applied": 0,
            "invalidations": 0,
            "invalidated_keys": 0,
            "windows": 0,
            "drift_clusters": 0,
        }
        self.max_rows = max_rows
        self.max_points = max_points
        self._last: dict[str, _NodeCounts] = {}

    # --- tier nodes -----------------------------------------------------------------------------

    def observe_stats(self, stats: list[dict[str, Any]], now_ms: int) -> None:
        """One sample of every node's `/v1/stats`: the hit rate over the interval since the last one
        (cumulative counters differenced; a restarted node starts again from zero)."""
        lookups = 0
        hits: dict[str, int] = dict.fromkeys(TIERS, 0)
        for s in stats:
            node = str(s.get("node_id"))
            now = _NodeCounts(int(s.get("lookups") or 0), _hits_per_tier(s.get("hits_by_tier") or {}))
            before = self._last.get(node, _NodeCounts())
            if now.lookups < before.lookups:
                before = _NodeCounts()
            self._last[node] = now
            lookups += now.lookups - before.lookups
            for tier in TIERS:
                hits[tier] += now.hits_by_tier.get(tier, 0) - before.hits_by_tier.get(tier, 0)
            self.nodes[node] = _node_row(s, now_ms)
        if lookups > 0:
            rates = {tier: hits[tier] / lookups for tier in TIERS}
            self.hit_rate.add(now_ms / 1000, all=sum(hits.values()) / lookups, **rates)

    # --- gateways -------------------------------------------------------------------------------

    def observe_routing(self, reports: list[dict[str, Any]]) -> None:
        """One sample of every gateway's health report: its engine instances, its latest routing
        decisions (where, why, the blocks it predicted the instance would not compute and those the
        engine reported cached) and what its warms for conversations came to."""
        routes: list[dict[str, Any]] = []
        for report in reports:
            gateway = str(report.get("node_id"))
            routing = (report.get("gateway") or {}).get("routing") or {}
            for row in routing.get("instances") or []:
                self.instances[(gateway, str(row.get("name")))] = {"gateway": gateway, **row}
            routes += [{"gateway": gateway, **r} for r in routing.get("recent") or []]
            if routing.get("warms"):
                self.warms[gateway] = routing["warms"]
        self.routes = sorted(routes, key=lambda r: -(r.get("at_ms") or 0))[: self.max_rows]

    # --- events ---------------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        t_s = event.occurred_at_ms / 1000
        if isinstance(event, WindowComputed):
            self.totals["windows"] += 1
            # The 1 s tumbling window is the live signal (hopping windows repeat it); one point per
            # window end: QPS summed over shards and models, entropy their mean.
            if event.window == "tumbling_1s":
                qps, bits, n = self._windows.get(event.window_end_ms, (0.0, 0.0, 0))
                self._windows[event.window_end_ms] = (qps + event.qps, bits + event.entropy_bits, n + 1)
                while len(self._windows) > self.max_points:
                    del self._windows[min(self._windows)]
        elif isinstance(event, DriftClustered):
            self.totals["drift_clusters"] += 1
            self.drift[event.cluster_id] = {
                "cluster_id": event.cluster_id,
                "pattern": event.pattern,
                "shard": event.shard,
                "size": event.size,
                "keys": event.keys[:5],
                "duration_ms": event.duration_ms,
                "variance": round(event.variance, 4),
                "window_end_ms": event.window_end_ms,
            }
            if len(self.drift) > self.max_rows:
                oldest = min(self.drift, key=lambda k: self.drift[k]["window_end_ms"])
                del self.drift[oldest]
        elif (decisions := heat_decisions(event)) is not None:
            for decision in decisions:
                self.totals["heat_decisions"] += 1
                self.heat.appendleft(
                    {
                        "at_ms": decision.occurred_at_ms,
                        "key": decision.key,
                        "decision": decision.decision,
                        "score": round(decision.score, 3),
                        "model_version": decision.model_version,
                    }
                )
        elif isinstance(event, WarmupDecided):
            self.totals["warmup_decisions"] += 1
            self.warmups.appendleft(
                {
                    "at_ms": event.occurred_at_ms,
                    "action": event.action,
                    "source": event.source,
                    "keys": len(event.keys),
                    "tier": event.tier,
                    "reason": event.reason,
                }
            )
        elif isinstance(event, WarmupApplied):
            self.totals["warmups_applied"] += 1
        elif isinstance(event, WarmupMeasured):
            self.warmup_delta.add(t_s, delta_t_ms=event.delta_t_ms)
        elif isinstance(event, InvalidationRecorded):
            self.totals["invalidations"] += 1
            self.totals["invalidated_keys"] += len(event.keys)
            self.invalidations.add(t_s, dependants=event.dependants)
        elif isinstance(event, TierModeChanged):
            self.mode_changes.appendleft(
                {
                    "at_ms": event.occurred_at_ms,
                    "node_id": event.node_id,
                    "mode": event.mode,
                    "previous_mode": event.previous_mode,
                    "reason": event.reason,
                }
            )

    def _warm_totals(self) -> dict[str, int]:
        if not self.warms:
            return {}
        return {
            f"engine_warms_{k}": sum(int(w.get(k) or 0) for w in self.warms.values())
            for k in ("sent", "used", "wasted", "ttft_saved_ms")
        }

    @property
    def traffic(self) -> Series:
        series = Series(("qps", "entropy_bits"), self.max_points)
        for end_ms in sorted(self._windows):
            qps, bits, n = self._windows[end_ms]
            series.add(end_ms / 1000, qps=qps, entropy_bits=bits / n)
        return series

    def snapshot(self, now_ms: int) -> dict[str, Any]:
        return {
            "now_ms": now_ms,
            "series": {
                "hit_rate": self.hit_rate.as_dict(),
                "traffic": self.traffic.as_dict(),
                "warmup_delta": self.warmup_delta.as_dict(),
                "invalidations": self.invalidations.as_dict(),
            },
            "nodes": [self.nodes[k] for k in sorted(self.nodes)],
            "drift": sorted(self.drift.values(), key=lambda r: -r["window_end_ms"]),
            "heat": list(self.heat),
            "warmups": list(self.warmups),
            "mode_changes": list(self.mode_changes),
            "instances": [self.instances[k] for k in sorted(self.instances)],
            "routes": self.routes,
            "totals": {**self.totals, **self._warm_totals()},
        }


def _hits_per_tier(hits_by_kind: dict[str, Any]) -> dict[str, int]:
    """`{"l1:exact": 3, "l1:semantic": 1, "l2:exact:remote": 2}` -> `{"l1": 4, "l2": 2}`."""
    out: dict[str, int] = {}
    for kind, n in hits_by_kind.items():
        tier = kind.split(":", 1)[0]
        out[tier] = out.get(tier, 0) + int(n)
    return out


def _node_row(s: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """The degrade/breaker facts of one node's stats, flat for a table."""
    l3 = s.get("l3") or {}
    breaker = l3.get("breaker") or {}
    local = s.get("local_only") or {}
    why_not = local.get("off_because")
    return {
        "node_id": s.get("node_id"),
        "seen_ms": now_ms,
        # A node that cannot go local-only (no peers, or disabled) says so beside its mode.
        "mode": f"{s.get('mode')} ({why_not})" if why_not else s.get("mode"),
        "serving": s.get("serving"),
        "degraded": s.get("degraded"),
        "breaker": breaker.get("state"),
        "window_hit_rate": local.get("window_hit_rate"),
        "lookups": s.get("lookups"),
        "hit_rate": s.get("hit_rate"),
        "l1_entries": (s.get("l1") or {}).get("entries"),
        "pending_writes": l3.get("pending_writes"),
    }
