"""The oracle of `bench.burst_bounds`: forgetting keys removes them from a policy and its experts."""

from __future__ import annotations

import numpy as np

from bench.burst_bounds import forget, replay_forgetting
from policies import make_policy
from sim.traces import from_keys


def test_a_forgotten_key_misses_on_its_next_access() -> None:
    trace = from_keys("t", [1, 2, 1, 2, 1])
    assert replay_forgetting(trace, make_policy("lru", 2)).tolist() == [False, False, True, True, True]
    hits = replay_forgetting(trace, make_policy("lru", 2), at=4, keys=[1])
    assert hits.tolist() == [False, False, True, True, False]


def test_forget_reaches_every_expert_of_the_heat_panel() -> None:
    policy = make_policy("heat", 8, seed=0)
    replay_forgetting(from_keys("t", np.arange(6).repeat(3)), policy)
    assert 3 in policy
    assert policy.panel is not None and policy.panel.holders(3) != []
    forget(policy, [3])
    assert 3 not in policy
    assert policy.panel.holders(3) == []
    assert not policy.panel.holds(3)
