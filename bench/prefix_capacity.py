"""Prefix capacity: the cache each policy needs to reach LRU's hit rate on the Mooncake trace.

For each of `bench.prefix_bounds.CAPACITIES` (5k/10k/20k blocks): LRU's hit rate there is the
target, and for each policy the least capacity whose hit rate reaches it is found by bisection
(hit rate is taken as non-decreasing in capacity; every probe is printed in the CSV, so a
non-monotone step shows). The issue's target: heat needs at most 75% of LRU's capacity. Replays
with prefix hits through the same replayer as `bench.policies`.

    .venv/bin/python -m bench.prefix_capacity [--jobs 1] [--capacity 5000 ...] [--policy heat ...]
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.prefix_bounds import CAPACITIES, TRACE

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ["heat", "arc", "lirs", "s3fifo", "opt"]
TARGET_SHARE = 0.75
# Bisection stops when the bracket is this share of LRU's capacity wide (about 6 probes).
RESOLUTION = 0.01


def hit_rate(path: str, policy: str, capacity: int, seed: int) -> float:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from policies import make_policy
    from sim.cli import limit_threads
    from sim.replay import replay
    from sim.traces import read_trace

    limit_threads()
    trace = read_trace(Path(path))
    return replay(trace, make_policy(policy, capacity, future=trace.keys, seed=seed)).hit_rate


def capacity_to_match(
    path: str, policy: str, lru_capacity: int, target: float, seed: int
) -> tuple[int | None, float | None, list[tuple[int, float]]]:
    """The least capacity (to RESOLUTION of `lru_capacity`) at which `policy` reaches `target`;
    None when even 2x LRU's capacity does not. Returns it, its hit rate and every probe."""
    probes: list[tuple[int, float]] = []

    def probe(c: int) -> float:
        r = hit_rate(path, policy, c, seed)
        probes.append((c, r))
        return r

    lo, hi = 1, lru_capacity
    hi_rate = probe(hi)
    while hi_rate < target:
        if hi >= 2 * lru_capacity:
            return None, None, probes
        lo, hi = hi, 2 * hi
        hi_rate = probe(hi)
    step = max(1, round(RESOLUTION * lru_capacity))
    while hi - lo > step:
        mid = (lo + hi) // 2
        r = probe(mid)
        if r >= target:
            hi, hi_rate = mid, r
        else:
            lo = mid
    return hi, hi_rate, probes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--capacity", type=int, action="append")
    parser.add_argument("--policy", action="append", help=f"default: {' '.join(POLICIES)}")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    capacities = args.capacity or list(CAPACITIES)
    policies = args.policy or POLICIES
    path = str(args.trace)
    console = Console(width=160)
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        lru_jobs = {c: pool.submit(hit_rate, path, "lru", c, args.seed) for c in capacities}
        lru = {c: f.result() for c, f in lru_jobs.items()}
        futures = {
            (p, c): pool.submit(capacity_to_match, path, p, c, lru[c], args.seed)
            for c in capacities
            for p in policies
        }
        found = {k: f.result() for k, f in futures.items()}
    console.print(f"bisected in {time.perf_counter() - started:.0f} s")
    table = Table(
        "policy",
        *[f"LRU {c:,}: {100 * lru[c]:.2f}%" for c in capacities],
        title=f"{args.trace.name}: capacity needed to reach LRU's hit rate (share of LRU's capacity)",
    )
    for p in policies:
        cells = []
        for c in capacities:
            need, rate, _ = found[(p, c)]
            cells.append(
                "> 2x" if need is None else f"{need:,} ({100 * need / c:.0f}%, {100 * (rate or 0):.2f}%)"
            )
        table.add_row(p, *cells)
    console.print(table)
    if "heat" in policies:
        for c in capacities:
            need = found[("heat", c)][0]
            ok = need is not None and need <= TARGET_SHARE * c
            share = "more than 200%" if need is None else f"{100 * need / c:.0f}%"
            console.print(
                f"[{'green' if ok else 'red'}]{'met' if ok else 'NOT met'}[/]: heat at LRU {c:,}"
                f" needs {share} of LRU's capacity (target <= {100 * TARGET_SHARE:.0f}%)"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "prefix_capacity.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["policy", "lru_capacity", "lru_hit_rate", "capacity", "hit_rate"])
        for c in capacities:
            writer.writerow(["lru", c, lru[c], c, lru[c]])
            for p in policies:
                for probe_c, probe_r in found[(p, c)][2]:
                    writer.writerow([p, c, lru[c], probe_c, probe_r])
    console.print(f"wrote {args.out / 'prefix_capacity.csv'}")


if __name__ == "__main__":
    main()
