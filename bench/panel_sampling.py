"""How much heat's panel changes its choices when the experts that do not lead run as miniatures on a
spatial sample of the keys (SHARDS: Waldspurger et al., ATC '17): every expert at full size (R = 1)
against 1 key in R (the shipped R = 4, 10%, 1%), on the dev block traces and a generated Zipf trace big
enough for 1% miniatures.

Per cell: the hit rate, the share of accesses where the expert the cache follows is the one it
follows at R = 1 ("same leader"), leader switches, and seconds. R is capped so that a miniature holds
at least `--min-miniature` entries (the effective R is printed). Prefix traces are left out: on chains
the panel retires (`policies/learned/heat.py`). Writes bench/results/panel_sampling.json and .png.

    .venv/bin/python -m bench.panel_sampling [--limit 100000] [--rates 1,4,10,100] [--min-miniature 8]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.heat_cost import capacity_of
from bench.libcachesim_check import truncate
from bench.policies import DATA, OUT, trace_paths
from policies.learned.heat import HeatPolicy
from sim.traces import Trace, from_keys, read_trace


def zipf_trace(n_keys: int, accesses: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    p = np.arange(1, n_keys + 1, dtype=np.float64) ** -0.8
    return from_keys(f"zipf-{n_keys // 1000}k", rng.choice(n_keys, size=accesses, p=p / p.sum()))


def run(trace: Trace, capacity: int, rate: int, min_miniature: int) -> tuple[dict[str, float], list[str]]:
    """One replay; returns the cell and the leader at every access."""
    policy = HeatPolicy(capacity, shadow_sample=rate, shadow_min=min_miniature)
    leaders: list[str] = []
    hits = 0
    keys, times = trace.keys.tolist(), trace.times_ms.tolist()
    started = time.perf_counter()
    for key, now in zip(keys, times, strict=True):
        if key in policy:
            policy.on_hit(key, now)
            hits += 1
        else:
            policy.on_miss(key, now)
        leaders.append(policy.leader or "none")
    seconds = time.perf_counter() - started
    assert policy.panel is not None
    cell = {
        "rate": rate,
        "effective_rate": policy.panel.sample,
        "hit_rate": hits / max(1, len(keys)),
        "switches": policy.panel.switches,
        "seconds": seconds,
    }
    return cell, leaders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=100_000, help="accesses per trace")
    parser.add_argument("--rates", default="1,4,10,100", help="sampling factors R (1 in R keys)")
    parser.add_argument("--min-miniature", type=int, default=8, help="entries a miniature keeps at least")
    parser.add_argument("--zipf-keys", type=int, default=100_000, help="distinct keys of the Zipf trace")
    parser.add_argument("--out", type=Path, default=OUT / "panel_sampling.json")
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    if rates[0] != 1:
        rates = [1, *rates]
    console = Console(width=150)
    traces = [truncate(read_trace(p), args.limit) for p in trace_paths(DATA)]
    traces = [t for t in traces if not t.prefix]
    if args.zipf_keys:
        traces.append(zipf_trace(args.zipf_keys, max(args.limit, 3 * args.zipf_keys)))
    results: dict[str, dict[str, dict[str, float]]] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("replaying", total=len(traces) * len(rates))
        for trace in traces:
            capacity = capacity_of(trace) if not trace.name.startswith("zipf") else args.zipf_keys // 10
            full: list[str] = []
            for rate in rates:
                cell, leaders = run(trace, capacity, rate, args.min_miniature)
                if rate == 1:
                    full = leaders
                cell["same_leader"] = float(np.mean([a == b for a, b in zip(leaders, full, strict=True)]))
                cell["capacity"] = capacity
                results.setdefault(trace.name, {})[str(rate)] = cell
                progress.advance(task)
    table = Table(title="heat's panel: every expert at full size (R = 1) against miniatures on 1 key in R")
    for col in ("trace", "capacity", "R (effective)", "hit %", "vs R=1 (pt)", "same leader", "switches", "s"):
        table.add_column(col, justify="right")
    for name, cells in results.items():
        base = cells["1"]["hit_rate"]
        for rate, c in cells.items():
            table.add_row(
                name,
                f"{int(c['capacity']):,}",
                f"{rate} ({int(c['effective_rate'])})",
                f"{100 * c['hit_rate']:.2f}",
                f"{100 * (c['hit_rate'] - base):+.2f}",
                f"{100 * c['same_leader']:.0f}%",
                f"{int(c['switches'])}",
                f"{c['seconds']:.1f}",
            )
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    plot(results, rates, args.out.with_suffix(".png"))
    console.print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def plot(results: dict[str, dict[str, dict[str, float]]], rates: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(names)), 4))
    width = 0.8 / len(rates)
    for i, rate in enumerate(rates):
        xs = [j + i * width for j in range(len(names))]
        gain = [100 * (results[n][str(rate)]["hit_rate"] - results[n]["1"]["hit_rate"]) for n in names]
        left.bar(xs, gain, width, label=f"R = {rate}")
        right.bar(xs, [100 * results[n][str(rate)]["same_leader"] for n in names], width, label=f"R = {rate}")
    for ax, label in ((left, "hit rate vs R = 1 (pt)"), (right, "same leader as R = 1 (%)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=25, fontsize=8)
        ax.set_ylabel(label)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
