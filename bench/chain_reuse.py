"""Does heat's learned chain term (`policies/learned/chains.py`, `ChainReuse`) hold beyond one trace?

Heat as shipped against heat with `chain_reuse=False` (LRFU alone) and the best of LRU, ARC, LIRS and
S3-FIFO, on variants of the Mooncake trace the term was not designed on: its first and second halves
(replayed cold), and the whole trace with each request's last block dropped (so no request ends in a
partial block: the blocks that are never extended are then whole blocks some later turn may re-read).
Replayed with prefix hits by the same replayer as `bench.policies`.

    .venv/bin/python -m bench.chain_reuse [--trace PATH] [--capacity 2500 ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import track
from rich.table import Table

from bench.prefix_bounds import TRACE
from policies.learned.heat import HeatPolicy
from policies.registry import make_policy
from sim.replay import replay
from sim.traces import Trace, read_mooncake

CLASSICS = ("lru", "arc", "lirs", "s3fifo")


def requests_of(trace: Trace, first: int, last: int, drop_tail: bool = False) -> Trace:
    """Requests [first, last) of a prefix trace; `drop_tail` drops each request's last block (of
    requests longer than one block)."""
    keys: list[int] = []
    times: list[int] = []
    starts = [0]
    for r in range(first, last):
        a, b = int(trace.starts[r]), int(trace.starts[r + 1])
        if drop_tail and b - a > 1:
            b -= 1
        keys.extend(trace.keys[a:b].tolist())
        times.extend(trace.times_ms[a:b].tolist())
        starts.append(len(keys))
    return Trace(
        trace.name,
        np.asarray(keys, dtype=np.int64),
        np.asarray(times, dtype=np.int64),
        np.asarray(starts, dtype=np.int64),
        prefix=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--capacity", type=int, action="append")
    args = parser.parse_args()
    capacities = args.capacity or [2_500, 5_000, 10_000]
    full = read_mooncake(args.trace)
    n = full.requests
    variants = {
        "first half": requests_of(full, 0, n // 2),
        "second half": requests_of(full, n // 2, n),
        "last block dropped": requests_of(full, 0, n, drop_tail=True),
    }
    console = Console(width=140)
    table = Table(
        "variant",
        "capacity",
        "heat",
        "without the term",
        "difference",
        "best classic",
        "heat - best",
        title=f"{full.name}: heat's learned chain term on trace variants (hit %)",
    )
    diffs: list[float] = []
    cells = [(name, trace, c) for name, trace in variants.items() for c in capacities]
    for name, trace, c in track(cells, description="replaying", console=console, transient=True):
        on = 100 * replay(trace, HeatPolicy(c)).hit_rate
        off = 100 * replay(trace, HeatPolicy(c, chain_reuse=False)).hit_rate
        best, best_name = max((100 * replay(trace, make_policy(p, c)).hit_rate, p) for p in CLASSICS)
        diffs.append(on - off)
        table.add_row(
            name,
            f"{c:,}",
            f"{on:.2f}",
            f"{off:.2f}",
            f"{on - off:+.2f}",
            f"{best:.2f} ({best_name})",
            f"{on - best:+.2f}",
        )
    console.print(table)
    up, mean = sum(d > 0 for d in diffs), sum(diffs) / len(diffs)
    console.print(f"the term: {up} of {len(diffs)} cells up, mean {mean:+.2f} pt")


if __name__ == "__main__":
    main()
