"""`bench.prefix_bounds`' learned rows: the online bucket model learns which blocks come back."""

from __future__ import annotations

import numpy as np

from bench.prefix_bounds import BucketReuse, Study, bucket_of, bucket_rates, future_of
from sim.replay import replay
from sim.traces import Trace

SHARED, UNIQUE = 6, 2  # blocks per request: a shared system prompt, then the request's own


def _trace(requests: int = 400) -> Trace:
    keys: list[int] = []
    starts = [0]
    for r in range(requests):
        keys += list(range(SHARED)) + [1_000 + UNIQUE * r + j for j in range(UNIQUE)]
        starts.append(len(keys))
    return Trace(
        "synthetic",
        np.asarray(keys, dtype=np.int64),
        np.arange(len(keys), dtype=np.int64),
        np.asarray(starts, dtype=np.int64),
        prefix=True,
    )


def test_the_online_buckets_learn_that_shared_blocks_return_and_unique_ones_do_not() -> None:
    trace = _trace()
    next_use, remaining = future_of(trace.keys)
    policy = BucketReuse(50, Study(next_use, remaining))
    result = replay(trace, policy)
    shared, unique = bucket_of(4, 0), bucket_of(1, SHARED)
    learned = {b: policy._yes.get(b, 0.0) / policy._seen[b] for b in (shared, unique)}
    assert learned[shared] > 0.95 and learned[unique] < 0.05
    # Every request after the first finds its shared prompt resident: the unique blocks never crowd it out.
    assert result.hits >= SHARED * (400 - 1)
    rates = bucket_rates(trace, next_use, 3 * 50)
    assert rates[shared] > 0.95 and rates[unique] < 0.05
