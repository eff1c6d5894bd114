"""The registry builds every policy by name and reports what each declares; admission stands alone."""

from __future__ import annotations

import numpy as np
import pytest

from policies import ALL, REGISTRY, capabilities, make_policy
from policies.admission import HASHDOS_THRESHOLD, FrequencySketch, TinyLFU


@pytest.mark.parametrize("name", ALL)
def test_every_registered_name_builds_a_policy_of_that_name(name: str) -> None:
    policy = make_policy(name, 8, future=np.arange(20))
    assert policy.name == name
    assert policy.capacity == 8
    assert capabilities(name) == {"size_aware": policy.size_aware, "prefix_aware": policy.prefix_aware}


def test_families_and_declared_capabilities() -> None:
    families = {name: spec.family for name, spec in REGISTRY.items()}
    assert families == {
        "lru": "recency",
        "lru2": "recency",
        "lfu": "frequency",
        "arc": "adaptive",
        "wtinylfu": "adaptive",
        "lirs": "adaptive",
        "s3fifo": "fifo",
        "sieve": "fifo",
        "heat": "learned",
        "opt": "offline",
    }
    assert {n for n in ALL if capabilities(n)["prefix_aware"]} == {"heat"}
    assert {n for n in ALL if capabilities(n)["size_aware"]} == {"lru", "lru2", "lfu", "heat"}


def test_a_size_aware_policy_honours_sizes_and_an_entry_counting_one_does_not() -> None:
    lru, arc = make_policy("lru", 10), make_policy("arc", 10)
    for policy in (lru, arc):
        policy.on_miss("big", 0, size=8)
        policy.on_miss("small", 0, size=4)
    assert "big" not in lru and "small" in lru
    assert "big" in arc and "small" in arc


def test_unknown_names_and_opt_without_a_future_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope", 4)
    with pytest.raises(ValueError, match="future"):
        make_policy("opt", 4)


def test_tinylfu_admits_the_more_frequent_and_rarely_a_flooding_candidate() -> None:
    sketch = FrequencySketch(64, doorkeeper=False)
    admission = TinyLFU(sketch, seed=1)
    for _ in range(3):
        sketch.increment("hot")
    sketch.increment("cold")
    assert admission.admit("hot", "cold")
    assert not admission.admit("cold", "hot")
    # Equal counts at or above the threshold: admitted about 1 time in 128, never always.
    wins = sum(admission.admit_counts(HASHDOS_THRESHOLD, HASHDOS_THRESHOLD) for _ in range(12_800))
    assert 40 <= wins <= 200
    assert sum(admission.admit_counts(HASHDOS_THRESHOLD - 1, HASHDOS_THRESHOLD - 1) for _ in range(1000)) == 0
