"""The compiled heat core against the Python reference (`HeatPolicy`): the same decisions, access for
access, on the dev Mooncake trace and on generated prefix traffic with every mesh signal."""

from __future__ import annotations

import random
from collections.abc import Hashable

import numpy as np
import pytest

from infra.paths import shared_data_dir
from policies import make_policy
from policies.base import AccessMeta, Eviction, Policy
from policies.learned.compiled import CompiledHeat
from policies.learned.heat import HeatPolicy
from sim.replay import replay
from sim.traces import Trace, read_trace


def _mooncake() -> Trace:
    paths = sorted((shared_data_dir() / "traces").glob("mooncake*.jsonl"))
    assert paths, "the dev Mooncake trace is in the shared data"
    return read_trace(paths[0])


def _step_by_step(trace: Trace, policy: Policy, limit: int) -> tuple[list[bool], list[list[Eviction]]]:
    """sim.replay's prefix semantics one call at a time, keeping every decision."""
    keys, times, starts = trace.keys.tolist(), trace.times_ms.tolist(), trace.starts.tolist()
    hits: list[bool] = []
    decisions: list[list[Eviction]] = []
    for r in range(len(starts) - 1):
        if starts[r] >= limit:
            break
        parent: Hashable | None = None
        for i in range(starts[r], starts[r + 1]):
            meta = AccessMeta(parent=parent)
            if keys[i] in policy:
                policy.on_hit(keys[i], times[i], meta)
                hits.append(True)
            else:
                hits.append(False)
                decisions.append(policy.on_miss(keys[i], times[i], 1, meta))
            parent = keys[i]
    return hits, decisions


@pytest.mark.parametrize("capacity", [100, 500, 4000])  # 100: requests longer than the cache
def test_every_decision_on_the_dev_trace_is_the_reference_s(capacity: int) -> None:
    trace = _mooncake()
    ours, theirs = CompiledHeat(capacity), HeatPolicy(capacity)
    got = _step_by_step(trace, ours, 60_000)
    want = _step_by_step(trace, theirs, 60_000)
    assert ours.core is not None, "the first chained block hands the entries over to the core"
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert sum(len(d) for d in got[1]) > 1000  # it had to evict, a lot


def test_the_replayer_takes_the_trace_in_one_call_with_the_same_hits() -> None:
    trace = _mooncake()
    fast = replay(trace, make_policy("heat", 2000), record=True)
    reference = replay(trace, HeatPolicy(2000), record=True)
    assert fast.hits == reference.hits > 0
    assert fast.hit_mask is not None and reference.hit_mask is not None
    assert (fast.hit_mask == reference.hit_mask).all()


def _signals_trace(policy: Policy, seed: int, steps: int = 6000) -> list[object]:
    """Generated prefix traffic with sizes, conversations that end, TTLs, attention heat, clusters,
    removals, expiry and re-scores; returns everything the policy said and held on the way."""
    rng = random.Random(seed)
    log: list[object] = []
    chains: list[list[int]] = []
    next_key, now = 1, 0
    for step in range(steps):
        now += rng.randint(0, 20)
        roll = rng.random()
        if roll < 0.55 or not chains:  # a request: re-walk a known chain (maybe extend it) or start one
            chain = rng.choice(chains) if chains and rng.random() < 0.7 else []
            if chain:
                chain = chain[: rng.randint(1, len(chain))]
            walk = chain + list(range(next_key, next_key + rng.randint(0, 4)))
            next_key += len(walk) - len(chain)
            if not walk:
                continue
            chains.append(walk)
            trace_id = f"t{rng.randint(0, 40)}"
            parent = None
            for key in walk:
                meta = AccessMeta(
                    trace_id=trace_id,
                    parent=parent,
                    ttl_ms=rng.choice([None, None, None, 500, 5000]),
                    attention_heat=rng.choice([None, rng.random()]),
                    cluster=rng.choice([None, None, None, rng.randint(0, 5)]),
                )
                if key in policy:
                    policy.on_hit(key, now, meta)
                    log.append(("hit", key))
                else:
                    log.append(("miss", key, policy.on_miss(key, now, rng.choice([1, 1, 1, 2]), meta)))
                parent = key
        elif roll < 0.65:
            log.append(("end", policy.end_trace(f"t{rng.randint(0, 40)}", now, evict=rng.random() < 0.7)))
        elif roll < 0.72:
            log.append(("expire", policy.expire(now)))
        elif roll < 0.8:
            key = rng.randint(1, next_key)
            policy.on_remove(key)
            log.append(("remove", key, key in policy))
        elif roll < 0.88:
            policy.observe_attention_heat(rng.randint(1, next_key + 5), rng.random())  # type: ignore[attr-defined]
        elif roll < 0.94:
            policy.observe_cluster(rng.randint(1, next_key), rng.randint(0, 5), rng.random() / 5)  # type: ignore[attr-defined]
        else:
            policy.rescore(now)  # type: ignore[attr-defined]
        if step % 500 == 0:
            log.append(("state", len(policy), policy.used))  # type: ignore[attr-defined]
    return log


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generated_traffic_with_every_signal_gets_the_reference_s_decisions(seed: int) -> None:
    ours, theirs = CompiledHeat(300, seed=seed), HeatPolicy(300, seed=seed)
    got, want = _signals_trace(ours, seed), _signals_trace(theirs, seed)
    assert ours.core is not None
    assert got == want
    reasons = {e.reason for entry in got if entry[0] in ("miss", "end", "expire") for e in entry[-1]}  # type: ignore[index, attr-defined]
    assert {"capacity", "context_ended", "expired"} <= reasons
    mine = {s.key: (s.decision, s.cluster) for s in ours.scores()}
    reference = {s.key: (s.decision, s.cluster) for s in theirs.scores()}
    assert mine.keys() == reference.keys()
    agree = sum(mine[k] == reference[k] for k in mine)
    assert agree >= 0.9 * len(mine)  # heat is re-scored at another tick for some entries


def test_string_keys_are_interned_and_given_back() -> None:
    policy = CompiledHeat(50)
    evicted: list[Eviction] = []
    for r in range(200):
        parent = None
        for depth in range(3):
            key = f"req{r % 70}-{depth}"
            meta = AccessMeta(parent=parent, trace_id=f"c{r % 7}")
            if key in policy:
                policy.on_hit(key, r, meta)
            else:
                evicted += policy.on_miss(key, r, 1, meta)
            parent = key
    assert policy.core is not None and len(policy) == policy.used <= 50
    assert evicted and all(isinstance(e.key, str) for e in evicted)
    held = {s.key for s in policy.scores()}
    assert len(held) == len(policy) and all(k in policy for k in held)
    gone = policy.end_trace("c3", 300)
    assert gone and all(e.reason == "context_ended" and e.key not in policy for e in gone)
    assert policy.heat(next(iter(held - {e.key for e in gone}))) is not None


def test_checkpointed_chain_counts_round_trip_through_the_core() -> None:
    policy = CompiledHeat(100)
    policy.on_miss(1, 0)
    policy.on_miss(2, 0, 1, AccessMeta(parent=1))
    chain = policy.chain_reuse
    chain.load({"yes": [3.0, 5.0], "seen": [10.0, 6.0], "labels": 16})
    assert chain.to_dict() == {"yes": [3.0, 5.0], "seen": [10.0, 6.0], "labels": 16}
    assert chain.probability(True) == pytest.approx(6 / 8)
    with pytest.raises(ValueError, match="yes <= seen"):
        chain.load({"yes": [3.0, 9.0], "seen": [10.0, 6.0], "labels": 16})


def test_bad_traces_are_refused_not_crashed() -> None:
    policy = CompiledHeat(10)
    policy.on_miss(1, 0)
    policy.on_miss(2, 0, 1, AccessMeta(parent=1))
    assert policy.core is not None
    keys = np.array([3, 4], dtype=np.int64)
    with pytest.raises(ValueError, match="starts"):
        policy.core.replay_prefix(keys, np.array([0, 5], dtype=np.int64), keys)
    with pytest.raises(ValueError, match="length"):
        policy.core.replay_prefix(keys, np.array([0, 2], dtype=np.int64), keys[:1])


def test_a_policy_scored_by_the_model_keeps_the_reference() -> None:
    policy = CompiledHeat(10, scorer="model")
    policy.on_miss(1, 0)
    policy.on_miss(2, 0, 1, AccessMeta(parent=1))
    assert policy.core is None and policy.reference._prefix_mode and 2 in policy


def test_integer_keys_stay_integers_and_another_key_is_refused_clearly() -> None:
    policy = CompiledHeat(10)
    policy.on_miss(-1, 0)  # any 64-bit int is a key, -1 too
    policy.on_miss(2, 0, 1, AccessMeta(parent=-1))
    assert policy.core is not None and -1 in policy and policy.heat(-1) is not None
    assert "a" not in policy and 2**70 not in policy and policy.heat("a") is None
    with pytest.raises(TypeError, match="64-bit ints"):
        policy.on_miss("a", 1)
    orphan = policy.on_miss(3, 1, 1, AccessMeta(parent="not a key"))
    assert orphan == [Eviction(3, "rejected")] and 3 not in policy
    policy.on_remove(-1)
    assert -1 not in policy and 2 in policy  # its child stays, without a parent
