from pathlib import Path

import numpy as np

from bench.heat_cost import million_keys, ns_per_access_lcs, ns_per_access_ours, write_oracle


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
    _, ours = ns_per_access_ours(trace, "lru", 60)
    assert np.isclose(theirs, ours, atol=1e-9), (theirs, ours)
