"""The warmup benchmark's pure parts: the engine model's FTL on toy traces (hand-computed), the
long-context generator and the health formula. The benchmark itself is not run here."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from bench._warmup_engine import Engine, EngineConfig, OracleWarmup, Request, hold_cause
from bench.warmup import LongContext, floor, health, long_context, planner_config
from policies import make_policy
from services.warmup.ftl import KvShape
from services.warmup.planner import WarmupPlanner
from services.warmup.retention import TurnAwareRetention

# 2 KiB blocks (512 tokens x 4 B); L2 loads a block in 10 ms, L3 in 100 ms; prefill 51.2 ms a block.
SHAPE = KvShape(layers=1, kv_heads=1, head_dim=1)
L2_GBPS = 2048 / 10 / 1e6
L3_GBPS = 2048 / 100 / 1e6


def toy(gpu_blocks: int, l2_blocks: int) -> EngineConfig:
    return EngineConfig(
        shape=SHAPE, gpu_blocks=gpu_blocks, l2_blocks=l2_blocks, l3_blocks=10,
        l2_gb_per_s=L2_GBPS, l3_gb_per_s=L3_GBPS, prefill_ms_per_token=0.1, base_ms=15.0,
    )  # fmt: skip


THREE = [
    Request(0, (1, 2), 1024),  # nothing cached: 15 + 1024 x 0.1
    Request(10, (3,), 512),  # a new root: 15 + 51.2; LRU pushes block 1 out to L2
    Request(20, (1, 2, 4), 1536),  # 1 from L2 (10), 2 on the GPU, 4 prefilled (51.2)
]


def test_load_times_follow_the_bandwidths() -> None:
    c = toy(2, 1)
    assert c.block_bytes == 2048
    assert c.load_ms("l2") == pytest.approx(10.0)
    assert c.load_ms("l3") == pytest.approx(100.0)


def test_three_requests_give_the_hand_computed_ftl() -> None:
    engine = Engine(toy(gpu_blocks=2, l2_blocks=1), make_policy("lru", 2))
    served = [engine.serve(r) for r in THREE]
    assert [s.ftl_ms for s in served] == pytest.approx([117.4, 66.2, 76.2])
    assert [(s.gpu_hits, s.l2_loads, s.l3_loads, s.prefilled_tokens) for s in served] == [
        (0, 0, 0, 1024),
        (0, 0, 0, 512),
        (1, 1, 0, 512),
    ]


def test_no_cache_prefills_every_token() -> None:
    engine = Engine(toy(2, 1), None)
    assert [engine.serve(r).ftl_ms for r in THREE] == pytest.approx([117.4, 66.2, 168.6])


def test_an_evicted_prefix_comes_back_from_l3() -> None:
    engine = Engine(toy(gpu_blocks=1, l2_blocks=1), make_policy("lru", 1))
    engine.serve(Request(0, (1,), 512))
    engine.serve(Request(10, (2,), 512))  # 1 -> L2
    engine.serve(Request(20, (3,), 512))  # 2 -> L2, 1 -> L3
    assert engine.serve(Request(30, (1, 5), 1024)).ftl_ms == pytest.approx(15 + 100 + 51.2)


def conversation_trace() -> list[Request]:
    return [
        Request(0, (1, 2), 1024, "a"),
        Request(10, (3, 4, 5, 6), 2048, "b"),  # fills the GPU: a's blocks go to L2
        Request(2_000, (1, 2, 7), 1536, "a", turn=1),
    ]


def test_warmup_brings_an_idle_conversation_back_before_its_next_turn() -> None:
    config = toy(gpu_blocks=4, l2_blocks=4)
    cold = Engine(config, make_policy("lru", 4))
    assert [cold.serve(r) for r in conversation_trace()][-1].ftl_ms == pytest.approx(15 + 2 * 10 + 51.2)
    # A planner that warms into the GPU tier (l1) brings a back (idle 1 s) at t=1000: 1 and 2 load
    # from L2 by t=1020.
    to_gpu = replace(planner_config(config), conversation_tier="l1")
    warm = Engine(config, make_policy("lru", 4), WarmupPlanner(to_gpu))
    last = [warm.serve(r) for r in conversation_trace()][-1]
    assert (last.ftl_ms, last.gpu_hits) == (pytest.approx(15 + 51.2), 2)
    assert warm.run.prefetch.loaded >= 2
    assert warm.run.prefetch.read == 2


def test_a_warmup_for_l2_brings_blocks_up_from_l3_and_leaves_the_gpu_alone() -> None:
    config = toy(gpu_blocks=4, l2_blocks=2)
    trace = [
        Request(0, (1, 2), 1024, "a"),
        Request(10, (3, 4, 5, 6), 2048),  # a's blocks leave the GPU for L2
        Request(20, (8, 9, 10), 1536),  # and L2 for L3
        Request(2_000, (1, 2, 7), 1536, "a", turn=1),
    ]
    cold = Engine(config, make_policy("lru", 4))
    assert [cold.serve(r) for r in trace][-1].ftl_ms == pytest.approx(15 + 2 * 100 + 51.2)
    warm = Engine(config, make_policy("lru", 4), WarmupPlanner(planner_config(config)))
    last = [warm.serve(r) for r in trace][-1]
    assert (last.ftl_ms, last.l2_loads, last.l3_loads) == (pytest.approx(15 + 2 * 10 + 51.2), 2, 0)


def test_layerwise_overlap_hides_the_load_behind_the_prefill() -> None:
    # 4 layers, same 10 ms / 100 ms per block: load and prefill overlap but for one layer's share.
    shape = KvShape(layers=4, kv_heads=1, head_dim=1)  # 16 B/token, 8 KiB a block
    config = replace(toy(2, 1), shape=shape, l2_gb_per_s=8192 / 10 / 1e6, l3_gb_per_s=8192 / 100 / 1e6)
    engine = Engine(replace(config, layerwise_overlap=True), make_policy("lru", 2))
    served = [engine.serve(r) for r in THREE]
    assert served[-1].ftl_ms == pytest.approx(15 + max(10, 51.2) + min(10, 51.2) / 4)


def test_the_floor_prefills_only_never_seen_tokens() -> None:
    assert [s.ftl_ms for s in floor(toy(2, 1), THREE).served] == pytest.approx([117.4, 66.2, 66.2])


def test_the_oracle_lands_a_conversation_on_the_gpu_as_its_turn_arrives() -> None:
    config = toy(gpu_blocks=4, l2_blocks=4)
    trace = conversation_trace()
    oracle = OracleWarmup(trace, config)
    engine = Engine(config, make_policy("lru", 4), oracle)
    oracle.engine = engine
    last = [engine.serve(r) for r in trace][-1]
    assert (last.ftl_ms, last.gpu_hits) == (pytest.approx(15 + 51.2), 2)
    assert oracle.bytes_warmed == 2 * config.block_bytes


def test_an_end_signal_reaches_the_turn_aware_gpu_tier() -> None:
    config = toy(gpu_blocks=4, l2_blocks=4)
    trace = [
        Request(0, (1, 2), 1024, "a", last=True),  # a ends: its blocks go first
        Request(10, (3, 4), 1024, "b"),
        Request(20, (5, 6), 1024, "c"),
    ]
    engine = Engine(config, TurnAwareRetention(4), end_signal=True)
    for r in trace:
        engine.serve(r)
    assert [b in engine.policy for b in range(1, 7)] == [False, False, True, True, True, True]


def test_long_context_grows_to_32k_in_8_turns() -> None:
    requests = long_context(LongContext(conversations=3, seed=1))
    assert len(requests) == 24
    assert [r.at_ms for r in requests] == sorted(r.at_ms for r in requests)
    first = [r for r in requests if r.trace_id == "conv-0"]
    assert [len(r.blocks) for r in first] == [8, 16, 24, 32, 40, 48, 56, 64]
    assert first[-1].input_tokens == 32 * 1024
    assert first[3].blocks[:24] == first[2].blocks  # each turn extends the previous context
    assert [r.last for r in first] == [False] * 7 + [True]  # the 8th turn ends the conversation
    gaps = [b.at_ms - a.at_ms for a, b in itertools.pairwise(first)]
    assert min(gaps) >= 256 * 6 + 3_000


def test_health_is_the_seed_formula() -> None:
    assert health(0.0, 1.0, 0.0) == pytest.approx(1.0)
    assert health(1000.0, 0.5, 0.25) == pytest.approx(0.25 + 0.15 + 0.15)


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("hold: qps 12.0 <= 50 (too cold to matter); conversation x", "qps <="),
        ("hold: entropy 6.90 >= 3.8 bits (too chaotic); y", "entropy >="),
        ("hold: no 1 s window yet for shard *", "no 1 s window"),
        ("hold: prefetch budget spent; z", "budget"),
        ("hold: 92% of the latest conversation prefetches were wasted; w", "backed off (waste)"),
    ],
)
def test_hold_causes_drop_the_numbers(reason: str, cause: str) -> None:
    assert hold_cause(reason) == cause
