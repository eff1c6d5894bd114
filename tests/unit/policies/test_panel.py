"""The expert panel: honest shadow hit counts, pairwise evidence, and prefix-hit accounting."""

from __future__ import annotations

import pytest

from policies import LRU
from policies.learned.panel import ExpertPanel


def feed(panel: ExpertPanel, keys: list[int]) -> None:
    for t, key in enumerate(keys):
        panel.access(key, t)


def test_shadows_count_the_hits_they_would_have_had() -> None:
    panel = ExpertPanel(8, ("lru", "lirs"))
    loop = list(range(12)) * 10
    feed(panel, loop)
    lru_alone = LRU(8)
    assert panel.hits[0] == sum(lru_alone.access(k, t)[0] for t, k in enumerate(loop)) == 0
    assert panel.hits[1] > 0
    assert panel.lead(1, 0) > 0 > panel.lead(0, 1)


def test_a_significant_lead_names_a_challenger_and_ties_do_not() -> None:
    panel = ExpertPanel(8, ("lru", "lirs"))
    feed(panel, list(range(8)) * 5)  # fits: both experts hit alike
    assert panel.challengers() == []
    feed(panel, list(range(12)) * 10)  # a loop: LIRS hits, LRU does not
    [(expert, lead)] = panel.challengers()
    assert expert == 1 and lead >= panel.lead(1, 0) > 0
    panel.follow(1)
    assert panel.leader_name == "lirs" and panel.switches == 1
    assert panel.challengers() == []


def test_access_returns_what_the_leader_evicted() -> None:
    panel = ExpertPanel(2, ("lru", "lirs"))
    assert panel.access(1, 0) == [] and panel.access(2, 1) == []
    assert panel.access(3, 2) == [1]  # LRU leads: its victim is the least recent key
    assert panel.holds(3) and not panel.holds(1)


def test_prefix_hits_need_the_whole_prefix() -> None:
    panel = ExpertPanel(4, ("lru",))
    for t, (key, chained) in enumerate([(1, False), (2, True), (3, True)]):
        panel.access(key, t, chained)
    panel.shadows[0].on_remove(1)  # the root goes; 2 and 3 stay resident
    for t, (key, chained) in enumerate([(1, False), (2, True), (3, True)], start=3):
        panel.access(key, t, chained)
    assert panel.hits == [0]  # resident, but not reachable through their prefix


def test_unknown_experts_are_refused() -> None:
    with pytest.raises(ValueError):
        ExpertPanel(4, ("lru", "mru"))
    with pytest.raises(ValueError):
        ExpertPanel(4, ())


def test_the_fifo_experts_shadow_their_policies() -> None:
    from policies import S3FIFO, SIEVE

    panel = ExpertPanel(6, ("sieve", "s3fifo", "s3fifo-lcs"))
    keys = [k % 9 for k in range(0, 300, 7)] + [1, 2, 3] * 5
    feed(panel, keys)
    for i, policy in enumerate((SIEVE(6), S3FIFO(6), S3FIFO(6, fill_main_first=True))):
        assert panel.hits[i] == sum(policy.access(k, t)[0] for t, k in enumerate(keys))
