"""What to warm, when, and where (docs/design.md §2.1, §2.5, §3.3): pure decisions from the events
the warmup service hears, each carrying why (window, cluster, band, source).

Four sources, drift, penetration, conversation and neighbours, all but conversation inside the band
(docs/warmup.md, "The warmup planner"). A byte budget caps prefetching; a key warmed in the last
`rewarm_after_ms` is not warmed again.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from schemas.events import (
    MAX_KEYS_PER_EVENT,
    CacheAccessBatch,
    CacheAccessed,
    ConversationEnded,
    DriftClustered,
    Event,
    HeatScored,
    KvBlockRemoved,
    KvBlockStored,
    RequestPenetrated,
    Tier,
    WarmupDecided,
    WarmupMeasured,
    WarmupRequested,
    WindowComputed,
    heat_decisions,
)
from services.warmup.budget import ByteBudget, WarmLedger
from services.warmup.conversations import Conversations
from services.warmup.ftl import FtlModels
from services.warmup.trigger import Band, DeltaT, LatencyQuantile, judge, warm_start_ms

ALL_NODES = "*"
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    band: Band = field(default_factory=Band)
    tier: Tier = "l1"
    conversation_tier: Tier = "l2"
    # Warm conversations back into the engines too: a block a conversation lost from an engine's GPU is
    # due like one it lost from host memory, and the command names the conversation (`trace_id`) so
    # the gateway prefills its prompt on the instance it routes the conversation to.
    warm_engines: bool = False
    budget_bytes_per_s: float = 1024**3
    budget_burst_s: float = 2.0
    load_bytes_per_s: float = 2.5e9
    default_entry_bytes: int = 16 * 1024
    dependency_factor: float = 1.2
    default_dependency_ms: float = 50.0
    prefix_depth: int = 4
    turn_idle_ms: int = 1_000
    turn_lead_fraction: float = 0.75
    # Which quantile of all gaps (over their median) sets how early into a pause a warmup goes: 0 is
    # the earliest any turn has come back (for warming into a large L2: land before every return).
    turn_lead_quantile: float = 0.25
    max_conversation_blocks: int = 1_024
    rewarm_after_ms: int = 5_000
    rising_heat: float = 0.2
    ftl_batch: int = 200
    peak_horizon_ms: int = 10_000
    useful_within_ms: int = 60_000
    # A source whose latest judged prefetches were mostly wasted backs off (they evict what the cache
    # needs); one warmup in `probe_every` still goes, so the source can show it has become useful.
    max_wasted_share: float = 0.5
    probe_every: int = 10
    max_tracked: int = 100_000


class _Bounded(OrderedDict[str, V], Generic[V]):
    """An insertion-ordered dict that forgets its oldest entries past `limit`."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: str, value: V) -> None:
        self.pop(key, None)
        self[key] = value
        while len(self) > self.limit:
            self.popitem(last=False)


@dataclass(slots=True)
class _FtlBatch:
    n: int = 0
    misses: int = 0
    latency_ms: float = 0.0


class WarmupPlanner:
    def __init__(self, config: PlannerConfig | None = None) -> None:
        self.config = c = config or PlannerConfig()
        self.budget = ByteBudget(c.budget_bytes_per_s, c.budget_bytes_per_s * c.budget_burst_s)
        self.ledger = WarmLedger(c.useful_within_ms, c.max_tracked)
        self.delta_t = DeltaT(c.peak_horizon_ms)
        self.dependency = LatencyQuantile()
        self.ftl = FtlModels()
        self.windows: dict[str, WindowComputed] = {}  # shard -> latest 1 s window of all models
        self._sizes: _Bounded[int] = _Bounded(c.max_tracked)  # key -> size_bytes
        self._mean_size: float | None = None
        self._nodes: _Bounded[str] = _Bounded(c.max_tracked)  # key -> node that served it last
        self._children: _Bounded[Counter[str]] = _Bounded(c.max_tracked)  # parent block -> children
        self._clusters: _Bounded[list[str]] = _Bounded(c.max_tracked)  # key -> its drift cluster
        self._heat: _Bounded[float] = _Bounded(c.max_tracked)  # key -> last heat score
        self.conversations = Conversations(
            c.turn_idle_ms,
            c.max_conversation_blocks,
            c.max_tracked,
            lead_fraction=c.turn_lead_fraction,
            prior_quantile=c.turn_lead_quantile,
            # Warming into L1 (or the engines) answers any drop; into L2, only a drop out of host
            # memory or further.
            media=frozenset(
                {"gpu", "cpu", "disk"} if c.conversation_tier == "l1" or c.warm_engines else {"cpu", "disk"}
            ),
        )
        self._ftl_batches: dict[str, _FtlBatch] = {}
        self.rising: list[tuple[str, int]] = []  # (key, event ms) whose neighbours the service looks up
        self.commands = 0
        self.held = 0
        self.budget_dropped = 0
        self._backed_off: dict[str, int] = {}  # source -> warmups held for waste (probes counted)

    # -- what the planner hears ---------------------------------------------------------------

    def apply(self, event: Event) -> list[Event]:
        if isinstance(event, WindowComputed):
            return self.on_window(event)
        if isinstance(event, DriftClustered):
            return self.on_drift(event)
        if isinstance(event, RequestPenetrated):
            return self.on_penetrated(event)
        if isinstance(event, KvBlockStored):
            self.on_block_stored(event)
            return self._turns_measured(event.occurred_at_ms)
        elif isinstance(event, KvBlockRemoved):
            self.ledger.evicted(event.block_hash)
            self.conversations.removed(event.block_hash, event.medium)
        elif isinstance(event, CacheAccessed):
            self.on_access(event)
            return self._turns_measured(event.occurred_at_ms)
        elif isinstance(event, CacheAccessBatch):
            for access in event.events:
                self.on_access(access)
            return self._turns_measured(event.occurred_at_ms)
        elif (decisions := heat_decisions(event)) is not None:
            return [out for decision in decisions for out in self.on_heat(decision)]
        elif isinstance(event, ConversationEnded):
            self.conversations.ended(event.trace_id)
        return []

    def on_window(self, w: WindowComputed) -> list[Event]:
        if w.window != "tumbling_1s" or w.model is not None:
            return []
        self.windows[w.shard] = w
        if w.miss_latency_ms_p95 is not None:
            self.dependency.observe(w.miss_latency_ms_p95)
        return [
            WarmupMeasured(
                shard=s.shard,
                t_warm_ms=s.t_warm_ms,
                t_peak_ms=s.t_peak_ms,
                delta_t_ms=s.delta_t_ms,
                occurred_at_ms=w.occurred_at_ms,
            )
            for s in self.delta_t.window(w.shard, w.window_start_ms, w.window_end_ms, w.qps)
        ]

    def _turns_measured(self, at_ms: int) -> list[Event]:
        """Δt of the conversation warmups whose turn has just come (the turn is their peak)."""
        if not self.conversations.measured:
            return []
        done, self.conversations.measured = self.conversations.measured, []
        return [
            WarmupMeasured(shard=node, t_warm_ms=t_warm, t_peak_ms=t_turn, delta_t_ms=t_turn - t_warm,
                           occurred_at_ms=at_ms)
            for node, t_warm, t_turn in done
        ]  # fmt: skip

    def on_block_stored(self, e: KvBlockStored) -> None:
        if e.size_bytes is not None:
            self._heard_size(e.block_hash, e.size_bytes)
        if e.node_id is not None:
            self._nodes.put(e.block_hash, e.node_id)
        if e.parent_block_hash is not None:
            children = self._children.get(e.parent_block_hash) or Counter()
            children[e.block_hash] += 1
            self._children.put(e.parent_block_hash, children)
        if e.trace_id is not None:
            self.conversations.touch(e.trace_id, e.block_hash, e.node_id, e.occurred_at_ms)

    def on_access(self, e: CacheAccessed) -> None:
        if e.node_id is not None:
            self._nodes.put(e.key, e.node_id)
        if e.size_bytes is not None:
            self._heard_size(e.key, e.size_bytes)
        self.ledger.read(e.key)
        if not e.hit:
            self.dependency.observe(e.latency_ms)
        if e.trace_id is not None and e.kind == "kv_block":
            self.conversations.touch(e.trace_id, e.key, e.node_id, e.occurred_at_ms)
        if e.model is not None and e.latency_ms > 0:  # 0: the time was not measured
            self._observe_ftl(e.model, e.hit, e.latency_ms)

    def _observe_ftl(self, model: str, hit: bool, latency_ms: float) -> None:
        batch = self._ftl_batches.setdefault(model, _FtlBatch())
        batch.n += 1
        batch.misses += not hit
        batch.latency_ms += latency_ms
        if batch.n >= self.config.ftl_batch:
            self.ftl.observe(model, batch.misses / batch.n, batch.latency_ms / batch.n)
            self._ftl_batches[model] = _FtlBatch()

    # -- decisions ----------------------------------------------------------------------------

    def on_drift(self, d: DriftClustered) -> list[Event]:
        for key in d.keys:
            self._clusters.put(key, d.keys)
        if d.pattern == "stable":
            return []
        why = f"drift cluster {d.cluster_id} labelled {d.pattern} in the window ending {d.window_end_ms}"
        return self._predictive(
            "drift", d.shard or ALL_NODES, d.keys, d.window_end_ms, why, cluster_id=d.cluster_id
        )

    def on_penetrated(self, p: RequestPenetrated) -> list[Event]:
        chain = [p.key, *self._continuation(p.key)]
        why = f"request {p.key} penetrated all three layers; {len(chain) - 1} blocks followed it before"
        return self._predictive("penetration", p.shard, chain, p.occurred_at_ms, why)

    def _continuation(self, key: str) -> list[str]:
        out: list[str] = []
        seen = {key}
        for _ in range(self.config.prefix_depth):
            children = self._children.get(key)
            if not children:
                break
            key = children.most_common(1)[0][0]
            if key in seen:
                break
            seen.add(key)
            out.append(key)
        return out

    def on_heat(self, h: HeatScored) -> list[Event]:
        previous = self._heat.get(h.key)
        self._heat.put(h.key, h.score)
        if previous is None or h.score - previous < self.config.rising_heat:
            return []
        self.rising.append((h.key, h.occurred_at_ms))
        cluster = self._clusters.get(h.key)
        if cluster is None:
            return []
        return self.neighbours_found(h.key, cluster, h.occurred_at_ms)

    def neighbours_found(self, key: str, neighbours: Iterable[str], now_ms: int) -> list[Event]:
        """Warm the neighbours of `key`, whose heat is rising (the service adds semantic ones)."""
        keys = [k for k in neighbours if k != key]
        why = f"heat of {key} is rising; {len(keys)} neighbours"
        return self._predictive("neighbours", ALL_NODES, keys, now_ms, why) if keys else []

    def tick(self, now_ms: int) -> list[Event]:
        """Conversations whose next turn is near: bring their missing blocks up before it."""
        self.ledger.expire(now_ms)
        out: list[Event] = []
        for due in self.conversations.due(now_ms, self._load_ms_per_block()):
            backing_off = self._backing_off("conversation")
            if backing_off is not None:  # given up for this turn
                out.append(
                    self._hold("conversation", ALL_NODES, due.blocks, now_ms, f"{backing_off}; {due.why}")
                )
                self.conversations.loading(due.trace_id, due.blocks)
                continue
            events = self._warm(
                "conversation",
                ALL_NODES,
                due.blocks,
                now_ms,
                now_ms,
                due.why,
                tier=self.config.conversation_tier,
                node_id=due.node_id,
                trace_id=due.trace_id,
                deadline_ms=due.turn_at_ms,
            )
            sent = [k for e in events if isinstance(e, WarmupRequested) for k in e.keys]
            held_for_waste = any(
                isinstance(e, WarmupDecided) and e.action == "hold" and "were wasted" in e.reason
                for e in events
            )
            # Blocks held for waste are given up for this turn; those the budget could not take retry.
            self.conversations.loading(
                due.trace_id, due.blocks if held_for_waste else sent, now_ms if sent else None
            )
            out += events
        return out

    def _load_ms_per_block(self) -> float:
        mean = self._mean_size if self._mean_size is not None else self.config.default_entry_bytes
        return 1000.0 * mean / self.config.load_bytes_per_s

    def _heard_size(self, key: str, size: int) -> None:
        self._sizes.put(key, size)
        if self._mean_size is None:
            self._mean_size = float(size)
        else:
            self._mean_size += (size - self._mean_size) / 256  # a running mean over recent sizes

    def _predictive(
        self, source: str, shard: str, keys: list[str], at_ms: int, why: str, cluster_id: str | None = None
    ) -> list[Event]:
        window = self.windows.get(shard) or self.windows.get(ALL_NODES)
        if window is None:
            return [self._hold(source, shard, keys, at_ms, f"hold: no 1 s window yet for shard {shard}")]
        verdict = judge(window.qps, window.entropy_bits, self.config.band)
        if not verdict.warm:
            return [self._hold(source, shard, keys, at_ms, f"{verdict.reason}; {why}", window, cluster_id)]
        backing_off = self._backing_off(source)
        if backing_off is not None:
            return [self._hold(source, shard, keys, at_ms, f"{backing_off}; {why}", window, cluster_id)]
        start = warm_start_ms(
            at_ms,
            self.dependency.value(self.config.default_dependency_ms),
            self.config.dependency_factor,
        )
        out = self._warm(source, shard, keys, at_ms, start, f"{verdict.reason}; {why}", window, cluster_id)
        if any(isinstance(e, WarmupRequested) for e in out):
            self.delta_t.warmed(shard, start)
        return out

    def _hold(
        self,
        source: str,
        shard: str,
        keys: list[str],
        at_ms: int,
        reason: str,
        window: WindowComputed | None = None,
        cluster_id: str | None = None,
    ) -> WarmupDecided:
        self.held += 1
        return WarmupDecided(
            shard=shard,
            source=source,  # type: ignore[arg-type]
            action="hold",
            reason=reason[:1000],
            keys=keys[:MAX_KEYS_PER_EVENT],
            qps=window.qps if window else None,
            entropy_bits=window.entropy_bits if window else None,
            window_end_ms=window.window_end_ms if window else None,
            cluster_id=cluster_id,
            occurred_at_ms=at_ms,
        )

    def _warm(
        self,
        source: str,
        shard: str,
        keys: list[str],
        at_ms: int,
        start_ms: int,
        why: str,
        window: WindowComputed | None = None,
        cluster_id: str | None = None,
        *,
        tier: Tier | None = None,
        node_id: str | None = None,
        trace_id: str | None = None,
        deadline_ms: int | None = None,
    ) -> list[Event]:
        c = self.config
        fresh = [k for k in dict.fromkeys(keys) if not self._recently_warmed(k, at_ms)]
        if not fresh:
            return []
        sizes = [self._size(k) for k in fresh]
        n = self.budget.take(sizes, at_ms)
        dropped = len(fresh) - n
        self.budget_dropped += dropped
        fresh = fresh[:n]
        size_of = dict(zip(fresh, sizes, strict=False))
        if not fresh:
            return [self._hold(source, shard, keys, at_ms, f"hold: prefetch budget spent; {why}", window)]
        by_node: dict[str, list[str]] = {}
        for k in fresh:
            target = node_id or self._node(k)
            by_node.setdefault(target, []).append(k)
        out: list[Event] = []
        for target, group in by_node.items():
            for i in range(0, len(group), MAX_KEYS_PER_EVENT):
                chunk = group[i : i + MAX_KEYS_PER_EVENT]
                command = WarmupRequested(
                    node_id=target,
                    keys=chunk,
                    tier=tier or c.tier,
                    reason=f"{source}: {why}"[:1000],
                    start_at_ms=start_ms,
                    deadline_ms=deadline_ms if deadline_ms is not None else start_ms + c.peak_horizon_ms,
                    trace_id=trace_id,
                    occurred_at_ms=at_ms,
                )
                self.commands += 1
                out.append(command)
                for k in chunk:
                    self.ledger.warmed(k, at_ms, source, size_of[k])
                out.append(
                    WarmupDecided(
                        shard=shard,
                        source=source,  # type: ignore[arg-type]
                        action="warm",
                        reason=why[:1000],
                        keys=chunk,
                        node_id=target,
                        tier=command.tier,
                        bytes=sum(size_of[k] for k in chunk),
                        command_event_id=command.event_id,
                        start_at_ms=start_ms,
                        qps=window.qps if window else None,
                        entropy_bits=window.entropy_bits if window else None,
                        window_end_ms=window.window_end_ms if window else None,
                        cluster_id=cluster_id,
                        dropped_by_budget=dropped,
                        occurred_at_ms=at_ms,
                    )
                )
        return out

    def _backing_off(self, source: str) -> str | None:
        """Why `source` holds now because its prefetches keep going to waste (None: it may warm)."""
        wasted = self.ledger.recent_wasted_share(source)
        if wasted is None or wasted <= self.config.max_wasted_share:
            return None
        self._backed_off[source] = self._backed_off.get(source, 0) + 1
        if self._backed_off[source] % self.config.probe_every == 0:
            return None  # a probe
        return f"hold: {wasted:.0%} of the latest {source} prefetches were wasted"

    def _recently_warmed(self, key: str, now_ms: int) -> bool:
        at = self.ledger.warmed_at(key)
        return at is not None and now_ms - at < self.config.rewarm_after_ms

    def _size(self, key: str) -> int:
        return self._sizes.get(key, self.config.default_entry_bytes)

    def _node(self, key: str) -> str:
        return self._nodes.get(key, ALL_NODES)

    def stats(self) -> dict[str, object]:
        o = self.ledger.outcomes
        return {
            "commands": self.commands,
            "held": self.held,
            "budget_dropped": self.budget_dropped,
            "bytes_warmed": self.ledger.bytes_warmed,
            "useful": o.useful,
            "wasted_evicted": o.wasted_evicted,
            "wasted_unread": o.wasted_unread,
            "wasted_share": round(o.wasted_share(), 4),
            "conversations": len(self.conversations),
            "ftl": {
                m: dict(zip(("base_ms", "delta_ms"), f.params(), strict=True))
                for m, f in self.ftl.fits.items()
            },
        }
