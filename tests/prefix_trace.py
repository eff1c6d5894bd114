"""The Mooncake dev trace's prefix chains for the KV-prefix route's tests: a slice of requests (read in
place), the prefix hit of each request in the simulator's replay (sim/replay.py, with a cache that never
evicts), and the value stored for each block (distinct bytes per block, so a fetch can be compared)."""

from __future__ import annotations

import numpy as np
import pytest

from infra.paths import shared_data_dir
from policies.recency.lru import LRU
from services.tiers.entry import encode_array
from sim.replay import replay
from sim.traces import Trace, read_mooncake

TRACE = shared_data_dir() / "traces" / "mooncake_synthetic.jsonl"
MODEL = "mooncake-kv"
BLOCK_TOKENS = 512


def requests(offset: int, count: int) -> Trace:
    """Requests offset..offset+count-1 of the trace, as a prefix trace of their own."""
    if not TRACE.exists():
        pytest.skip(f"{TRACE} is not here")
    whole = read_mooncake(TRACE, limit=offset + count)
    lo, hi = int(whole.starts[offset]), int(whole.starts[min(offset + count, len(whole.starts) - 1)])
    return Trace(
        name=f"{whole.name}[{offset}:{offset + count}]",
        keys=whole.keys[lo:hi],
        times_ms=whole.times_ms[lo:hi],
        starts=whole.starts[offset : offset + count + 1] - lo,
        prefix=True,
    )


def chains(trace: Trace) -> list[list[int]]:
    starts = trace.starts.tolist()
    keys = trace.keys.tolist()
    return [keys[starts[r] : starts[r + 1]] for r in range(len(starts) - 1)]


def replay_prefix_hits(trace: Trace) -> list[int]:
    """Per request, how many leading blocks the simulator's prefix replay found resident."""
    result = replay(trace, LRU(len(np.unique(trace.keys)) + 1), record=True)
    assert result.hit_mask is not None
    starts = trace.starts.tolist()
    return [int(result.hit_mask[starts[r] : starts[r + 1]].sum()) for r in range(len(starts) - 1)]


def block_key(block: int, run: str = "") -> str:
    """`run` keeps one test's blocks apart from another's in a shared L3."""
    return f"mooncake/{run}{block}"


def block_value(block: int) -> bytes:
    return encode_array(
        np.arange(block, block + 16, dtype=np.int32),
        kind="kv_block",
        model=MODEL,
        token_range=(0, BLOCK_TOKENS),
    )
