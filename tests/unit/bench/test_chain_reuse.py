import numpy as np

from bench.chain_reuse import conversations, hit_rate, requests_of, sampled
from sim.traces import Trace


def test_generated_conversations_re_read_their_chain_from_the_root() -> None:
    trace = conversations(3_000, 0.9, 0.5, seed=1)
    assert trace.prefix and trace.distinct == 3_000
    firsts: set[int] = set()
    for r in range(trace.requests):
        walk = trace.keys[trace.starts[r] : trace.starts[r + 1]].tolist()
        assert len(set(walk)) == len(walk)
        firsts.add(walk[0])
    assert len(firsts) < trace.requests  # conversations come back to their root


def _requests(trace: Trace) -> list[list[int]]:
    return [trace.keys[trace.starts[r] : trace.starts[r + 1]].tolist() for r in range(trace.requests)]


def test_a_sample_keeps_whole_requests_chosen_by_their_root() -> None:
    trace = conversations(5_000, 0.9, 1.0, seed=2)
    small = sampled(trace, 8)
    assert 0 < small.requests < trace.requests
    mine = {tuple(walk) for walk in _requests(small)}
    theirs = {tuple(walk) for walk in _requests(trace)}
    assert mine <= theirs
    roots = {walk[0] for walk in mine}
    assert all(any(w[0] == root for w in mine) for root in roots)


def test_halves_and_dropped_tails_are_requests_of_the_trace() -> None:
    trace = conversations(2_000, 0.9, 1.0, seed=3)
    half = requests_of(trace, 0, trace.requests // 2)
    assert half.requests == trace.requests // 2
    dropped = requests_of(trace, 0, trace.requests, drop_tail=True)
    lengths = np.diff(trace.starts)
    assert len(dropped) == len(trace) - int((lengths > 1).sum())
    assert 0.0 < hit_rate(trace, 500, None) < hit_rate(trace, 5_000, None) <= 100.0
