from __future__ import annotations

import numpy as np
import pytest

from policies import LRU, make_policy
from sim.replay import compulsory_mask, replay, run_grid
from sim.traces import from_keys, from_requests


@pytest.mark.parametrize(
    ("requests", "capacity", "hits"),
    [
        # The second request shares the prefix 1,2; the third only 1.
        ([[1, 2, 3], [1, 2, 4], [1, 5]], 10, 3),
        # 4 pushes out root 1, so 2 and 3, though resident, are no longer a prefix hit.
        ([[1, 2, 3], [4], [1, 2, 3]], 3, 0),
        # A full repeat hits every block.
        ([[7, 8], [7, 8]], 2, 2),
    ],
)
def test_prefix_hits_are_the_longest_resident_prefix(
    requests: list[list[int]], capacity: int, hits: int
) -> None:
    result = replay(from_requests("t", requests), LRU(capacity), record=True)
    assert result.hits == hits
    assert result.hit_mask is not None and int(result.hit_mask.sum()) == hits
    assert result.accesses == sum(len(r) for r in requests)


def test_block_replay_counts_hits_and_compulsory_misses() -> None:
    result = replay(from_keys("t", [1, 2, 1, 3, 1, 2]), LRU(2))
    assert (result.hits, result.accesses, result.compulsory) == (2, 6, 3)
    assert result.hit_rate == pytest.approx(2 / 6)
    assert result.throughput > 0


def test_compulsory_mask_marks_first_sightings() -> None:
    assert compulsory_mask(np.array([5, 6, 5, 7])).tolist() == [True, True, False, True]


def test_progress_hears_every_access() -> None:
    seen: list[int] = []
    replay(from_keys("t", list(range(25))), LRU(4), progress=seen.append, progress_every=10)
    assert sum(seen) == 25
    seen.clear()
    replay(from_requests("t", [[1, 2], [1, 2, 3]]), LRU(4), progress=seen.append, progress_every=1)
    assert sum(seen) == 5


def test_run_grid_covers_policies_by_capacities() -> None:
    trace = from_keys("t", [1, 2, 3, 1, 2, 4, 1])
    results = run_grid(trace, ["lru", "opt"], [1, 2])
    assert [(r.policy, r.capacity) for r in results] == [("lru", 1), ("lru", 2), ("opt", 1), ("opt", 2)]
    assert results[3].hits >= results[1].hits


def test_mooncake_like_replay_with_every_policy() -> None:
    trace = from_requests("t", [[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3], [5, 6, 7]])
    for name in ("lru", "lfu", "lru2", "arc", "wtinylfu", "heat", "opt"):
        result = replay(trace, make_policy(name, 4, future=trace.keys))
        assert 0 <= result.hits <= result.accesses - result.compulsory


def test_run_grid_passes_heat_options_to_the_heat_policy() -> None:
    """`bench.policies --heat-option` relies on this: a variant is really built with the options."""
    assert make_policy("heat", 8, heat_options={"experts": ["lru"]}).leader == "lru"
    with pytest.raises(TypeError):
        make_policy("heat", 8, heat_options={"no_such_option": 1})
    trace = from_keys("loop", [1, 2, 3, 4, 5] * 20)
    lru_led, lirs_led = (
        run_grid(trace, ["heat"], [4], heat_options={"experts": [e]})[0] for e in ("lru", "lirs")
    )
    assert lru_led.hits == 0  # a loop longer than the cache: LRU never hits
    assert lirs_led.hits > 0
