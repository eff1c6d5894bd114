"""Trace replay: drive one policy through one trace and count hits (block or prefix semantics).

Block traces: every access is a read that admits on a miss. Prefix traces (Mooncake, see
`traces.Trace`): a request hits the longest prefix of its blocks that is resident; then every block is
touched (resident) or inserted (missing) in order, its prefix parent passed as `AccessMeta.parent`.
The hit rate is hit blocks / all blocks, the figure the Mooncake reference numbers use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from policies.base import AccessMeta, Policy
from sim.traces import Trace

ProgressFn = Callable[[int], None]


@dataclass
class ReplayResult:
    trace: str
    policy: str
    capacity: int
    accesses: int
    hits: int
    compulsory: int
    seconds: float
    hit_mask: np.ndarray | None = field(default=None, repr=False)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    @property
    def throughput(self) -> float:
        """Accesses per second of wall time."""
        return self.accesses / self.seconds if self.seconds > 0 else float("inf")


def compulsory_mask(keys: np.ndarray) -> np.ndarray:
    """True where a key is accessed for the first time (a miss no policy can avoid)."""
    _, first = np.unique(keys, return_index=True)
    mask = np.zeros(len(keys), dtype=bool)
    mask[first] = True
    return mask


def replay(
    trace: Trace,
    policy: Policy,
    *,
    record: bool = False,
    progress: ProgressFn | None = None,
    progress_every: int = 10_000,
    clock: Callable[[], float] = time.perf_counter,
) -> ReplayResult:
    """Replay `trace` through `policy`. `progress(n)` hears how many accesses were done since its
    last call; `record` keeps the per-access hit mask (burst metrics need it)."""
    keys = trace.keys.tolist()
    times = trace.times_ms.tolist()
    mask = np.zeros(len(keys), dtype=bool) if record else None
    started = clock()
    hits = 0
    native = getattr(policy, "replay_prefix", None) if trace.prefix else None
    if native is not None:
        # A compiled policy takes the whole trace in one call (policies/learned/compiled.py).
        got = native(trace.keys, trace.starts, trace.times_ms)
        hits = int(got.sum())
        if mask is not None:
            mask[:] = got
        if progress is not None:
            progress(len(keys))
    elif trace.prefix:
        hits = _replay_prefix(trace, policy, keys, times, mask, progress, progress_every)
    else:
        contains, on_hit, on_miss = policy.__contains__, policy.on_hit, policy.on_miss
        reported = 0
        for i, key in enumerate(keys):
            if contains(key):
                on_hit(key, times[i], None)
                hits += 1
                if mask is not None:
                    mask[i] = True
            else:
                on_miss(key, times[i], 1, None)
            if progress is not None and i - reported >= progress_every:
                progress(i - reported)
                reported = i
        if progress is not None:
            progress(len(keys) - reported)
    seconds = clock() - started
    return ReplayResult(
        trace=trace.name,
        policy=policy.name,
        capacity=policy.capacity,
        accesses=len(keys),
        hits=hits,
        compulsory=int(compulsory_mask(trace.keys).sum()),
        seconds=seconds,
        hit_mask=mask,
    )


def _replay_prefix(
    trace: Trace,
    policy: Policy,
    keys: list[int],
    times: list[int],
    mask: np.ndarray | None,
    progress: ProgressFn | None,
    progress_every: int,
) -> int:
    contains, on_hit, on_miss = policy.__contains__, policy.on_hit, policy.on_miss
    starts = trace.starts.tolist()
    hits = 0
    reported = 0
    for r in range(len(starts) - 1):
        lo, hi = starts[r], starts[r + 1]
        in_prefix = True
        parent: int | None = None
        for i in range(lo, hi):
            key = keys[i]
            meta = AccessMeta(parent=parent)
            if contains(key):
                on_hit(key, times[i], meta)
                if in_prefix:
                    hits += 1
                    if mask is not None:
                        mask[i] = True
            else:
                in_prefix = False
                on_miss(key, times[i], 1, meta)
            parent = key
        if progress is not None and hi - reported >= progress_every:
            progress(hi - reported)
            reported = hi
    if progress is not None:
        progress(len(keys) - reported)
    return hits


def run_grid(
    trace: Trace,
    policies: list[str],
    capacities: list[int],
    *,
    seed: int = 0,
    progress: ProgressFn | None = None,
    record: bool = False,
    heat_options: Mapping[str, object] | None = None,
) -> list[ReplayResult]:
    """Replay `trace` once per (policy, capacity), in that order."""
    from policies import make_policy

    results = []
    for name in policies:
        for capacity in capacities:
            policy = make_policy(name, capacity, future=trace.keys, seed=seed, heat_options=heat_options)
            results.append(replay(trace, policy, record=record, progress=progress))
    return results
