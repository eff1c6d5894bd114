"""One contract for every policy, on random sequences (hypothesis): the resident set never outgrows
the capacity, evictions agree with membership, and no policy ever beats Belady's OPT."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import ALL, AccessMeta, Policy, make_policy

ONLINE = [p for p in ALL if p != "opt"]
keys = st.lists(st.integers(min_value=0, max_value=11), min_size=1, max_size=80)
capacities = st.integers(min_value=1, max_value=6)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_access(policy: Policy, key: int, t: int, meta: AccessMeta | None = None) -> bool:
    before = {k for k in range(-1, 12) if k in policy}
    hit = key in policy
    if hit:
        policy.on_hit(key, t, meta)
        evicted = []
    else:
        evicted = policy.on_miss(key, t, 1, meta)
    for e in evicted:
        if e.reason == "rejected":
            assert e.key == key and key not in policy
        else:
            assert e.key in before and e.key not in policy
    assert len({e.key for e in evicted}) == len(evicted)
    if not hit and not any(e.key == key for e in evicted):
        assert key in policy
    if hit:
        assert key in policy
    assert len(policy) <= policy.capacity
    assert len(policy) == sum(1 for k in range(-1, 12) if k in policy)
    return hit


@pytest.mark.parametrize("name", ALL)
@SETTINGS
@given(seq=keys, capacity=capacities)
def test_membership_and_capacity(name: str, seq: list[int], capacity: int) -> None:
    policy = make_policy(name, capacity, future=seq)
    for t, key in enumerate(seq):
        check_access(policy, key, t)


@pytest.mark.parametrize("name", ONLINE)
@SETTINGS
@given(seq=keys, capacity=capacities)
def test_never_beats_opt(name: str, seq: list[int], capacity: int) -> None:
    opt = make_policy("opt", capacity, future=seq)
    policy = make_policy(name, capacity)
    opt_hits = sum(opt.access(k, t)[0] for t, k in enumerate(seq))
    hits = sum(policy.access(k, t)[0] for t, k in enumerate(seq))
    assert hits <= opt_hits


@pytest.mark.parametrize("name", ONLINE)
@SETTINGS
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["get", "get", "get", "remove"]), st.integers(0, 11)), max_size=80
    ),
    capacity=capacities,
)
def test_remove_keeps_the_books(name: str, ops: list[tuple[str, int]], capacity: int) -> None:
    policy = make_policy(name, capacity)
    for t, (op, key) in enumerate(ops):
        if op == "remove":
            policy.on_remove(key)
            assert key not in policy
        else:
            check_access(policy, key, t)


@pytest.mark.parametrize("name", ONLINE)
@SETTINGS
@given(
    chains=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=25),
    capacity=capacities,
)
def test_prefix_chains(name: str, chains: list[list[int]], capacity: int) -> None:
    """Block ids as a prefix tree (a chain's block id is its path); parents passed as meta."""
    policy = make_policy(name, capacity)
    for t, chain in enumerate(chains):
        parent: int | None = None
        path = 0
        for step in chain:
            path = path * 5 + step + 1
            key = path % 12  # keep ids in the contract's key range; collisions are fine
            if key == parent:
                continue
            check_access(policy, key, t, AccessMeta(parent=parent))
            parent = key


def test_registry_rejects_unknown_names() -> None:
    with pytest.raises(ValueError):
        make_policy("mru", 3)
    with pytest.raises(ValueError):
        make_policy("opt", 3)


Factory = Callable[[int], Policy]
