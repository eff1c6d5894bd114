"""The cross-check replays libCacheSim with the replayer's own semantics: same hits for the same
policy, prefix traces counted within the resident prefix, truncation at request boundaries."""

from __future__ import annotations

import random

import pytest

from bench.libcachesim_check import NEVER, next_uses, replay_theirs, truncate, variant
from policies import LRU
from sim.replay import replay
from sim.traces import from_keys, from_requests


def _chains(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4) * 100 + depth for depth in range(rng.randint(1, 6))] for _ in range(200)]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_theirs_loop_counts_what_the_replayer_counts(seed: int) -> None:
    for trace in (from_requests("p", _chains(seed)), from_keys("b", [k for c in _chains(seed) for k in c])):
        lru = LRU(7)

        def get(key: int, i: int, lru: LRU = lru) -> bool:
            return lru.access(key, i)[0]

        assert replay_theirs(trace, get) == replay(trace, LRU(7)).hits


def test_truncate_keeps_whole_requests() -> None:
    trace = from_requests("p", [[1, 2, 3], [1, 2], [4]])
    cut = truncate(trace, 4)
    assert cut.keys.tolist() == [1, 2, 3] and cut.starts.tolist() == [0, 3]
    assert truncate(trace, None) is trace


def test_next_uses() -> None:
    assert next_uses(from_keys("b", [5, 6, 5, 5]).keys) == [2, NEVER, 3, NEVER]


@pytest.mark.parametrize("label", ["lru", "arc", "sieve", "lirs@lcs", "s3fifo@lcs", "opt"])
def test_ours_and_libcachesim_agree_on_a_prefix_trace(label: str) -> None:
    pytest.importorskip("libcachesim")
    from bench.libcachesim_check import theirs

    trace = from_requests("p", _chains(3))
    ours = replay(trace, variant(label, 40, trace.keys)).hits
    their_hits, _ = theirs(trace, label, 40)
    if label == "opt":
        assert ours >= their_hits  # ours may bypass the newcomer, libCacheSim's never does
    else:
        assert ours == their_hits
