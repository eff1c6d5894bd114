"""The warmup planner: what it warms, when it holds, where commands go, budget and waste."""

from __future__ import annotations

from schemas.events import (
    CacheAccessed,
    ConversationEnded,
    DriftClustered,
    HeatScored,
    KvBlockRemoved,
    KvBlockStored,
    RequestPenetrated,
    WarmupDecided,
    WarmupMeasured,
    WarmupRequested,
    WindowComputed,
    heat_batch,
)
from services.warmup.planner import PlannerConfig, WarmupPlanner

T = 1_767_225_600_000


def window(
    shard: str, start: int, qps: float, entropy: float = 3.0, p95: float | None = None
) -> WindowComputed:
    return WindowComputed(
        shard=shard,
        window="tumbling_1s",
        window_start_ms=start,
        window_end_ms=start + 1000,
        requests=int(qps),
        qps=qps,
        entropy_bits=entropy,
        hit_rate=0.5,
        miss_latency_ms_p95=p95,
        occurred_at_ms=start + 1000,
    )


def drift(keys: list[str], pattern: str = "pulse", shard: str = "s0", at: int = T) -> DriftClustered:
    return DriftClustered(
        cluster_id="c1",
        pattern=pattern,  # type: ignore[arg-type]
        window_end_ms=at,
        keys=keys,
        size=len(keys),
        duration_ms=4000,
        variance=0.5,
        service_spread=0.1,
        shard=shard,
        occurred_at_ms=at,
    )


def commands(out: list) -> list[WarmupRequested]:  # type: ignore[type-arg]
    return [e for e in out if isinstance(e, WarmupRequested)]


def records(out: list) -> list[WarmupDecided]:  # type: ignore[type-arg]
    return [e for e in out if isinstance(e, WarmupDecided)]


def test_a_pulse_inside_the_band_warms_its_keys_and_says_why() -> None:
    p = WarmupPlanner()
    p.apply(window("s0", T - 1000, 120, p95=100))
    out = p.apply(drift(["a", "b", "c"]))
    [cmd] = commands(out)
    assert cmd.keys == ["a", "b", "c"] and cmd.tier == "l1" and cmd.node_id == "*"
    assert cmd.start_at_ms == T + 120  # request time + 1.2 x P95 (100 ms)
    assert "pulse" in (cmd.reason or "") and "inside the band" in (cmd.reason or "")
    [rec] = records(out)
    assert rec.action == "warm" and rec.command_event_id == cmd.event_id and rec.cluster_id == "c1"
    assert rec.qps == 120 and rec.window_end_ms == T


def test_outside_the_band_it_holds_with_the_reason_and_stable_clusters_do_nothing() -> None:
    p = WarmupPlanner()
    assert [r.reason for r in records(p.apply(drift(["a"])))] == ["hold: no 1 s window yet for shard s0"]
    p.apply(window("s0", T - 1000, 300))
    [hold] = p.apply(drift(["a"]))
    assert isinstance(hold, WarmupDecided) and hold.action == "hold" and "too hot" in hold.reason
    p.apply(window("s0", T, 100, entropy=1.0))
    assert "entropy 1.00" in records(p.apply(drift(["a"], pattern="migrating")))[0].reason
    assert p.apply(drift(["a"], pattern="stable")) == []
    assert p.commands == 0 and p.held == 3


def test_commands_go_to_the_nodes_that_served_the_keys() -> None:
    p = WarmupPlanner()
    p.apply(window("s0", T - 1000, 100))
    p.apply(CacheAccessed(key="a", hit=False, node_id="n1", occurred_at_ms=T - 10))
    p.apply(CacheAccessed(key="b", hit=False, node_id="n2", occurred_at_ms=T - 10))
    out = commands(p.apply(drift(["a", "b", "c"])))
    assert {c.node_id: c.keys for c in out} == {"n1": ["a"], "n2": ["b"], "*": ["c"]}


def test_a_penetrated_prefix_warms_the_blocks_that_followed_it() -> None:
    p = WarmupPlanner(PlannerConfig(prefix_depth=3))
    p.apply(window("s0", T - 1000, 100))
    for parent, child, times in [
        ("b0", "b1", 3),
        ("b1", "b2", 3),
        ("b1", "x", 1),
        ("b2", "b3", 2),
        ("b3", "b4", 1),
    ]:
        for _ in range(times):
            p.apply(KvBlockStored(block_hash=child, parent_block_hash=parent, size_bytes=4096))
    [cmd] = commands(p.apply(RequestPenetrated(shard="s0", key="b0", occurred_at_ms=T)))
    assert cmd.keys == ["b0", "b1", "b2", "b3"]
    assert "3 blocks followed it" in (cmd.reason or "")


def test_without_removal_events_a_conversation_is_warmed_once_per_turn_on_its_node() -> None:
    p = WarmupPlanner(PlannerConfig(turn_idle_ms=1000))
    for i in range(3):
        p.apply(KvBlockStored(block_hash=f"k{i}", trace_id="conv", node_id="n7", occurred_at_ms=T + i))
    assert p.tick(T + 500) == []
    [cmd] = commands(p.tick(T + 1500))
    assert cmd.keys == ["k0", "k1", "k2"] and cmd.node_id == "n7" and cmd.tier == "l2"
    assert "next turn expected" in (cmd.reason or "")
    assert p.tick(T + 3000) == []  # once per turn
    p.apply(CacheAccessed(key="k3", hit=True, kind="kv_block", trace_id="conv", occurred_at_ms=T + 9000))
    # That pause was ~9 s: the next warmup waits for 0.75 of it.
    assert commands(p.tick(T + 10_500)) == []
    assert commands(p.tick(T + 15_800))[0].keys == ["k0", "k1", "k2", "k3"]
    p.apply(CacheAccessed(key="k4", hit=True, kind="kv_block", trace_id="conv", occurred_at_ms=T + 20_000))
    p.apply(ConversationEnded(trace_id="conv", occurred_at_ms=T + 20_001))
    assert p.tick(T + 30_000) == []


def test_a_conversation_warmup_is_measured_against_the_turn_it_was_for() -> None:
    """Δt = t_turn - t_warm: the turn is the peak a conversation's warmup had to meet."""
    p = WarmupPlanner(PlannerConfig(turn_idle_ms=1000))
    p.apply(KvBlockStored(block_hash="k0", trace_id="conv", node_id="n7", occurred_at_ms=T))
    assert commands(p.tick(T + 1500))
    [first] = p.apply(
        CacheAccessed(key="k0", hit=True, kind="kv_block", trace_id="conv", occurred_at_ms=T + 1700)
    )
    assert isinstance(first, WarmupMeasured) and first.delta_t_ms == 200
    # The same turn goes on: nothing more to measure.
    assert (
        p.apply(CacheAccessed(key="k1", kind="kv_block", hit=True, trace_id="conv", occurred_at_ms=T + 1800))
        == []
    )
    out = p.apply(
        CacheAccessed(key="k2", hit=True, kind="kv_block", trace_id="conv", occurred_at_ms=T + 9000)
    )
    assert out == []  # the turn came without a warmup before it
    p.apply(KvBlockStored(block_hash="x", trace_id="other", node_id="n7", occurred_at_ms=T + 9000))
    assert commands(p.tick(T + 16_000))  # both conversations
    [m] = p.apply(KvBlockStored(block_hash="k3", trace_id="conv", node_id="n7", occurred_at_ms=T + 18_000))
    assert isinstance(m, WarmupMeasured) and m.shard == "n7"
    assert (m.t_warm_ms, m.t_peak_ms, m.delta_t_ms) == (T + 16_000, T + 18_000, 2_000)


def test_only_dropped_blocks_are_warmed_just_before_the_expected_next_turn() -> None:
    config = PlannerConfig(turn_idle_ms=1000, turn_lead_fraction=0.75, load_bytes_per_s=1e6)
    p = WarmupPlanner(config)

    def turn(at: int, blocks: range) -> None:
        for i in blocks:
            p.apply(
                KvBlockStored(
                    block_hash=f"b{i}", trace_id="c", node_id="n1", size_bytes=1000, occurred_at_ms=at
                )
            )

    turn(T, range(0, 4))
    turn(T + 20_000, range(4, 8))  # the first pause: 20 s
    end = T + 20_000
    p.apply(KvBlockRemoved(block_hash="b1", occurred_at_ms=end + 100))
    p.apply(KvBlockRemoved(block_hash="b5", occurred_at_ms=end + 200))
    # Due at 0.75 x 20 s after the last access, minus 2 blocks x 1 ms of load time.
    assert commands(p.tick(end + 14_990)) == []
    [cmd] = commands(p.tick(end + 14_999))
    assert cmd.keys == ["b1", "b5"] and cmd.node_id == "n1"
    assert commands(p.tick(end + 15_100)) == []  # sent: no longer missing
    # Dropped again before the turn came: not warmed twice in one turn (a warmup that pushes other
    # conversations' blocks out must not set off theirs, and so on).
    p.apply(KvBlockRemoved(block_hash="b5", occurred_at_ms=end + 16_000))
    assert commands(p.tick(end + 16_100)) == []
    # Blocks of an idle conversation that were never dropped are not warmed at all.
    turn(T + 100_000, range(8, 10))
    assert commands(p.tick(T + 200_000)) == []


def test_blocks_the_budget_could_not_take_are_retried() -> None:
    config = PlannerConfig(budget_bytes_per_s=2000, budget_burst_s=1.0, load_bytes_per_s=1e9)
    p = WarmupPlanner(config)
    for i in range(4):
        p.apply(KvBlockStored(block_hash=f"b{i}", trace_id="c", size_bytes=1000, occurred_at_ms=T))
        p.apply(KvBlockRemoved(block_hash=f"b{i}", occurred_at_ms=T + 1))
    first = commands(p.tick(T + 5_000))[0].keys
    second = commands(p.tick(T + 6_000))[0].keys
    assert first == ["b0", "b1"] and second == ["b2", "b3"]


def test_a_key_warmed_recently_is_not_warmed_twice_and_the_budget_caps_bytes() -> None:
    p = WarmupPlanner(
        PlannerConfig(
            budget_bytes_per_s=10_000, budget_burst_s=1, default_entry_bytes=4_000, rewarm_after_ms=5_000
        )
    )
    p.apply(window("s0", T - 1000, 100))
    first = commands(p.apply(drift(["a", "b", "c"])))
    assert first[0].keys == ["a", "b"]  # 8,000 of 10,000 bytes; "c" would overrun
    assert p.budget_dropped == 1
    assert commands(p.apply(drift(["a", "b"], at=T + 100))) == []
    later = commands(p.apply(drift(["a", "c"], at=T + 1000)))
    assert later[0].keys == ["c"]  # refilled by 1 s of budget; "a" is still fresh


def test_useful_and_wasted_prefetches_are_counted() -> None:
    p = WarmupPlanner(PlannerConfig(useful_within_ms=10_000))
    p.apply(window("s0", T - 1000, 100))
    p.apply(drift(["a", "b", "c"]))
    p.apply(CacheAccessed(key="a", hit=True, occurred_at_ms=T + 200))
    p.apply(KvBlockRemoved(block_hash="b", occurred_at_ms=T + 300))
    p.tick(T + 20_000)
    s = p.stats()
    assert (s["useful"], s["wasted_evicted"], s["wasted_unread"]) == (1, 1, 1)
    assert s["wasted_share"] == round(2 / 3, 4)


def test_rising_heat_warms_the_cluster_neighbours_and_asks_for_semantic_ones() -> None:
    p = WarmupPlanner()
    p.apply(window("*", T - 1000, 100))
    p.apply(drift(["h", "n1", "n2"], pattern="stable", shard="*"))
    assert p.apply(HeatScored(key="h", score=0.2, decision="keep", occurred_at_ms=T)) == []
    out = commands(p.apply(HeatScored(key="h", score=0.7, decision="keep", occurred_at_ms=T + 100)))
    assert out[0].keys == ["n1", "n2"]
    assert p.rising == [("h", T + 100)]
    assert commands(p.neighbours_found("h", ["h", "s1"], T + 200))[0].keys == ["s1"]


def test_a_heat_batch_is_planned_as_its_decisions_in_order() -> None:
    def planner() -> WarmupPlanner:
        p = WarmupPlanner()
        p.apply(window("*", T - 1000, 100))
        p.apply(drift(["h", "n1", "n2"], pattern="stable", shard="*"))
        return p

    decisions = [
        HeatScored(key="h", score=0.2, decision="keep", occurred_at_ms=T),
        HeatScored(key="x", score=0.9, decision="keep", occurred_at_ms=T + 50),
        HeatScored(key="h", score=0.7, decision="keep", occurred_at_ms=T + 100),
    ]
    one_by_one, batched = planner(), planner()
    alone = [e for d in decisions for e in one_by_one.apply(d)]
    together = batched.apply(heat_batch(decisions))
    assert [c.keys for c in commands(together)] == [c.keys for c in commands(alone)] == [["n1", "n2"]]
    assert batched.rising == one_by_one.rising == [("h", T + 100)]


def test_delta_t_is_measured_against_the_peak_after_the_warmup() -> None:
    p = WarmupPlanner(PlannerConfig(peak_horizon_ms=3000))
    p.apply(window("s0", T - 1000, 60, p95=0))
    cmd = commands(p.apply(drift(["a"])))[0]
    measured = []
    for i, q in enumerate([80, 190, 120, 90, 50]):
        measured += [e for e in p.apply(window("s0", T + i * 1000, q)) if isinstance(e, WarmupMeasured)]
    assert [(m.t_warm_ms, m.delta_t_ms) for m in measured] == [(cmd.start_at_ms, 1000)]


def test_ftl_pairs_are_fitted_per_model_from_accesses() -> None:
    p = WarmupPlanner(PlannerConfig(ftl_batch=100))
    for m_rate, n_batches in [(0.1, 3), (0.5, 3)]:
        for _ in range(n_batches):
            misses = int(100 * m_rate)
            for i in range(100):
                hit = i >= misses
                p.apply(CacheAccessed(key=f"k{i}", hit=hit, model="7b", latency_ms=100.0 if hit else 700.0))
    base, delta = p.ftl.fits["7b"].params()
    assert round(base) == 100 and round(delta) == 600


def test_a_source_whose_prefetches_go_to_waste_backs_off_and_probes() -> None:
    p = WarmupPlanner(PlannerConfig(max_wasted_share=0.5, probe_every=10, rewarm_after_ms=0))
    p.apply(window("s0", T - 1000, 100))
    # 50 pulses whose keys are evicted unread: the drift source's latest outcomes are all waste.
    for i in range(50):
        [cmd] = commands(p.apply(drift([f"k{i}"], at=T + i)))
        p.apply(KvBlockRemoved(block_hash=cmd.keys[0], occurred_at_ms=T + i))
    outcomes = [p.apply(drift([f"n{i}"], at=T + 100 + i)) for i in range(20)]
    held = [r for out in outcomes for r in records(out) if r.action == "hold"]
    sent = [c for out in outcomes for c in commands(out)]
    assert len(held) == 18 and len(sent) == 2  # one probe in ten
    assert "100% of the latest drift prefetches were wasted" in held[0].reason
    # Useful probes bring it back once they outnumber the waste among the latest outcomes.
    for i in range(600):
        for c in commands(p.apply(drift([f"u{i}"], at=T + 1000 + i))):
            p.apply(CacheAccessed(key=c.keys[0], hit=True, occurred_at_ms=T + 1000 + i))
    assert commands(p.apply(drift(["last"], at=T + 5000)))


def test_warming_engines_answers_a_drop_from_the_gpu_and_names_the_conversation() -> None:
    def run(warm_engines: bool) -> list[WarmupRequested]:
        p = WarmupPlanner(PlannerConfig(turn_idle_ms=1000, warm_engines=warm_engines))
        for i in range(3):
            p.apply(CacheAccessed(key=f"k{i}", hit=False, kind="kv_block", trace_id="conv", occurred_at_ms=T))
        p.apply(KvBlockRemoved(block_hash="k0", medium="cpu", node_id="engine-a", occurred_at_ms=T + 10))
        p.apply(KvBlockRemoved(block_hash="k1", medium="gpu", node_id="engine-a", occurred_at_ms=T + 10))
        return commands(p.tick(T + 60_000))

    # Into L2 only, a block that left the GPU is still in L2: only the one that left host memory.
    assert [c.keys for c in run(False)] == [["k0"]]
    [cmd] = run(True)
    assert cmd.keys == ["k0", "k1"] and cmd.trace_id == "conv" and cmd.tier == "l2"
    # The command says when the turn is expected (no gaps seen yet: after turn_idle_ms), so a gateway
    # can time its prefill to outlast the engine's evictions.
    assert cmd.deadline_ms == T + 1000
