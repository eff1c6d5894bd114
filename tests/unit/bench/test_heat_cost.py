from pathlib import Path

import numpy as np

from bench.heat_cost import million_chains, million_keys, ns_per_access_lcs, ns_per_access_ours, write_oracle
from policies import make_policy


def test_the_generated_trace_touches_every_key_first() -> None:
    trace = million_keys(500, 2_000, seed=1)
    assert len(trace) == 2_000 and trace.distinct == 500
    assert sorted(trace.keys[:500].tolist()) == list(range(500))


def test_libcachesim_reads_the_written_trace_as_our_replayer_does(tmp_path: Path) -> None:
    # libCacheSim's LRU and ours agree hit for hit (bench/libcachesim_check.py): the file it reads in C
    # must hold the same accesses, or its timing is of another trace.
    trace = million_keys(300, 5_000, seed=2)
    oracle = tmp_path / "t.oracleGeneral"
    write_oracle(trace, oracle)
    assert oracle.stat().st_size == 24 * len(trace)
    _, theirs = ns_per_access_lcs(trace, "LRU", 60, oracle)
    _, ours = ns_per_access_ours(trace, make_policy("lru", 60))
    assert np.isclose(theirs, ours, atol=1e-9), (theirs, ours)


def test_the_generated_chains_have_every_key_and_walk_from_the_root() -> None:
    trace = million_chains(3_000, seed=1)
    assert trace.prefix and trace.distinct == 3_000
    starts = trace.starts.tolist()
    assert starts[0] == 0 and starts[-1] == len(trace)
    # a request walks its conversation's chain in order: no block before its parent
    seen: set[int] = set()
    for r in range(len(starts) - 1):
        walk = trace.keys[starts[r] : starts[r + 1]].tolist()
        assert walk and len(set(walk)) == len(walk) <= 35
        seen.update(walk)
    assert len(seen) == 3_000
