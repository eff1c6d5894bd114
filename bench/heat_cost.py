"""What heat costs per access and per tracked entry, beside libCacheSim's own ARC, LRU and S3-FIFO (timed
over the whole trace inside their C code: `process_trace` on an oracleGeneral file) and the project's
Python ARC, in one run, on the dev traces and on two generated traces of 1M distinct keys (Zipf, and
prefix chains). Heat runs compiled (`policies/learned/compiled.py`: on prefix traces the chain core,
elsewhere the Python policy around the compiled panel, `panel_core.py`), timed beside the all-Python
reference (up to 300k accesses).

Bytes per entry are Python's allocations (tracemalloc) held by a policy after it has taken the trace,
plus what heat's compiled core holds, divided by the entries it holds; libCacheSim's C allocations are
not visible to tracemalloc and are not reported. Writes bench/results/heat_cost.json
(`{"<trace>": {"heat_ns_per_access": .., ...}}`) and heat_cost.png.

    .venv/bin/python -m bench.heat_cost [--trace cs --trace mooncake] [--limit 200000]
        [--million-keys 1000000] [--out bench/results/heat_cost.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.libcachesim_check import truncate
from bench.policies import DATA, LIRS_FRACTIONS, MOONCAKE_CAPACITIES, OUT, trace_paths
from policies import make_policy
from policies.base import Policy
from policies.learned.heat import HeatPolicy
from sim.replay import replay
from sim.traces import Trace, from_keys, read_trace

LCS = {"lcs_arc": "ARC", "lcs_lru": "LRU", "lcs_s3fifo": "S3FIFO"}
# oracleGeneral: uint32 clock time, uint64 object id, uint32 size, int64 next access (-1: unknown)
ORACLE = np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])


def capacity_of(trace: Trace) -> int:
    """The middle capacity bench/policies.py replays the trace at."""
    if trace.prefix:
        return MOONCAKE_CAPACITIES[1]
    return max(1, round(LIRS_FRACTIONS[1] * trace.distinct))


def million_keys(n_keys: int, accesses: int, seed: int = 0) -> Trace:
    """Every key once (a scan that fills the tracked set), then a Zipf(0.9) stream over them."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, n_keys + 1, dtype=np.float64)
    p = ranks**-0.9
    zipf = rng.choice(n_keys, size=max(0, accesses - n_keys), p=p / p.sum())
    return from_keys(f"zipf-{n_keys // 1000}k", np.concatenate([rng.permutation(n_keys), zipf]))


def million_chains(n_keys: int, seed: int = 0) -> Trace:
    """Prefix traffic over `n_keys` blocks: conversations (Zipf(0.9) over them) re-walk their chain from
    its root and extend it by 1-4 new blocks per request, until every block exists; a conversation of 32
    blocks or more starts over with new ones. A request is one millisecond."""
    rng = np.random.default_rng(seed)
    n_conv = max(1, n_keys // 32)
    p = np.arange(1, n_conv + 1, dtype=np.float64) ** -0.9
    chains: list[list[int]] = [[] for _ in range(n_conv)]
    keys: list[int] = []
    starts = [0]
    made = 0
    picks = rng.choice(n_conv, size=4 * n_keys, p=p / p.sum()).tolist()
    grow = rng.integers(1, 5, size=len(picks)).tolist()
    for conv, more in zip(picks, grow, strict=True):
        if made >= n_keys:
            break
        chain = chains[conv]
        if len(chain) >= 32:
            chain.clear()
        new = min(more, n_keys - made)
        chain.extend(range(made, made + new))
        made += new
        keys.extend(chain)
        starts.append(len(keys))
    times = np.repeat(np.arange(len(starts) - 1, dtype=np.int64), np.diff(starts))
    return Trace(
        f"chains-{n_keys // 1000}k", np.asarray(keys, dtype=np.int64), times, np.asarray(starts), True
    )


def ns_per_access_ours(trace: Trace, policy: Policy) -> tuple[float, float]:
    """(ns per access, hit rate) of the project's `policy` replayed in process."""
    gc.collect()
    result = replay(trace, policy)
    return result.seconds * 1e9 / max(1, result.accesses), result.hits / max(1, result.accesses)


def ns_per_access_lcs(trace: Trace, name: str, capacity: int, oracle: Path) -> tuple[float, float]:
    """(ns per access, hit rate) of libCacheSim's `name` over the whole trace, inside its C code."""
    import libcachesim as lcs

    hashpower = max(12, math.ceil(math.log2(max(trace.distinct, 2))) + 1)
    cache: Any = getattr(lcs, name)(cache_size=capacity, hashpower=hashpower)
    reader = lcs.TraceReader(str(oracle), lcs.TraceType.ORACLE_GENERAL_TRACE)
    started = time.perf_counter()
    miss_ratio, _ = cache.process_trace(reader)
    took = time.perf_counter() - started
    return took * 1e9 / max(1, len(trace)), 1.0 - float(miss_ratio)


def write_oracle(trace: Trace, path: Path) -> None:
    records = np.zeros(len(trace), dtype=ORACLE)
    records["t"] = np.arange(len(trace), dtype=np.uint32) // 1000 + 1
    records["id"] = trace.keys.astype(np.uint64) + 1  # 0 is not an object id there
    records["size"] = 1
    records["next"] = -1
    records.tofile(path)


def bytes_per_entry(trace: Trace, build: Callable[[], Policy]) -> float:
    """Python allocations held by a policy after taking `trace`, plus what a compiled core holds
    (`native_bytes`), per entry it holds."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    built = build()
    replay(trace, built)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before + getattr(built, "native_bytes", 0)
    tracemalloc.stop()
    return held / max(1, len(built))


def measure(
    trace: Trace, capacity: int, console: Console, reference_limit: int = 300_000
) -> dict[str, float]:
    row: dict[str, float] = {"accesses": len(trace), "distinct": trace.distinct, "capacity": capacity}
    with tempfile.TemporaryDirectory() as scratch:
        oracle = Path(scratch) / "trace.oracleGeneral"
        write_oracle(trace, oracle)
        for label, name in LCS.items():
            row[f"{label}_ns_per_access"], row[f"{label}_hit_rate"] = ns_per_access_lcs(
                trace, name, capacity, oracle
            )
    row["py_arc_ns_per_access"], row["py_arc_hit_rate"] = ns_per_access_ours(
        trace, make_policy("arc", capacity)
    )
    heat = make_policy("heat", capacity)  # what the service and the replayer run (compiled.CompiledHeat)
    row["heat_ns_per_access"], row["heat_hit_rate"] = ns_per_access_ours(trace, heat)
    row["heat_compiled"] = float(getattr(heat, "core", None) is not None)
    if len(trace) <= reference_limit:
        # The all-Python reference (the differential tests' oracle: chains and panel), on the same trace.
        row["heat_reference_ns_per_access"], _ = ns_per_access_ours(trace, HeatPolicy(capacity))
    row["heat_bytes_per_entry"] = bytes_per_entry(trace, lambda: make_policy("heat", capacity))
    row["py_arc_bytes_per_entry"] = bytes_per_entry(trace, lambda: make_policy("arc", capacity))
    row["heat_over_lcs_arc"] = row["heat_ns_per_access"] / row["lcs_arc_ns_per_access"]
    console.log(
        f"{trace.name}: heat {row['heat_ns_per_access']:.0f} ns/access, {row['heat_over_lcs_arc']:.1f}x ARC"
        f" ({'chain core' if row['heat_compiled'] else 'compiled panel'})"
    )
    return row


def table(results: dict[str, dict[str, float]]) -> Table:
    out = Table(title="cost per access (ns) and per tracked entry (bytes)")
    for col in (
        "trace",
        "capacity",
        "lcs ARC",
        "lcs LRU",
        "lcs S3-FIFO",
        "py ARC",
        "heat",
        "core",
        "python heat",
        "heat / lcs ARC",
        "heat B/entry",
        "py ARC B/entry",
    ):
        out.add_column(col, justify="right")
    for name, r in results.items():
        out.add_row(
            name,
            f"{int(r['capacity']):,}",
            f"{r['lcs_arc_ns_per_access']:.0f}",
            f"{r['lcs_lru_ns_per_access']:.0f}",
            f"{r['lcs_s3fifo_ns_per_access']:.0f}",
            f"{r['py_arc_ns_per_access']:.0f}",
            f"{r['heat_ns_per_access']:.0f}",
            "chains" if r.get("heat_compiled") else "panel",
            f"{r['heat_reference_ns_per_access']:.0f}" if "heat_reference_ns_per_access" in r else "-",
            f"{r['heat_over_lcs_arc']:.1f}x",
            f"{r['heat_bytes_per_entry']:.0f}",
            f"{r['py_arc_bytes_per_entry']:.0f}",
        )
    return out


def plot(results: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    systems = [
        ("lcs_arc", "libCacheSim ARC"),
        ("lcs_lru", "libCacheSim LRU"),
        ("lcs_s3fifo", "libCacheSim S3-FIFO"),
        ("py_arc", "Python ARC"),
        ("heat", "heat"),
    ]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(names)), 4))
    width = 0.8 / len(systems)
    for i, (key, label) in enumerate(systems):
        xs = [j + i * width for j in range(len(names))]
        ax.bar(xs, [results[n][f"{key}_ns_per_access"] for n in names], width, label=label)
    ax.set_yscale("log")
    ax.set_ylabel("ns per access (log)")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=20)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    # One core, as the heat service runs (`threads` = 1): the model's training steps are tiny, and
    # torch's second thread only contends with the first on these machines.
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", action="append", help="dev trace names (default: all)")
    parser.add_argument("--limit", type=int, default=200_000, help="accesses per dev trace")
    parser.add_argument("--million-keys", type=int, default=1_000_000, help="distinct keys of the big trace")
    parser.add_argument("--million-accesses", type=int, default=0, help="its accesses (default 2x the keys)")
    parser.add_argument("--out", type=Path, default=OUT / "heat_cost.json")
    args = parser.parse_args()
    console = Console(width=170)
    paths = [p for p in trace_paths(DATA) if not args.trace or any(t in p.name for t in args.trace)]
    results: dict[str, dict[str, float]] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("traces", total=len(paths) + (2 if args.million_keys else 0))
        for path in paths:
            trace = truncate(read_trace(path), args.limit)
            results[trace.name] = measure(trace, capacity_of(trace), console)
            progress.advance(task)
        if args.million_keys:
            big = million_keys(args.million_keys, args.million_accesses or 2 * args.million_keys)
            results[big.name] = measure(big, args.million_keys, console)
            progress.advance(task)
            chains = million_chains(args.million_keys)
            results[chains.name] = measure(chains, args.million_keys, console)
            progress.advance(task)
    console.print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    plot(results, args.out.with_suffix(".png"))
    console.print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
