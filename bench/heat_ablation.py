"""Heat ablation: the learned model against heat without it, and each feature group switched off.

Variants of `HeatPolicy`, replayed by `bench.policies` on every trace in ../shared/data/traces at its
three capacities: `model` (scorer="model": the MLP scores everything once trained, prefix chains
too), `auto` (as shipped: the MLP, except that prefix chains stay on the LRFU prior plus the learned
re-use term `chains.ChainReuse`), `auto -chain-reuse` (the same without that term), `prior`
(scorer="prior": no model at all), and `-GROUP` (scorer="model" with one group of
`features.FEATURE_GROUPS` zeroed in what the model reads and learns from). LRU, ARC and the best of
`bench.policies.BASELINES` are printed alongside. The verdict says, per trace family (prefix or
block), how many points the model adds over the prior; `--leaders` adds which expert of the panel
heat followed in each cell (the model can only matter where it picks a victim: in the heat-frame
expert, or among several keys the leader does not hold).

    .venv/bin/python -m bench.heat_ablation [--jobs 1] [--trace mooncake ...] [--variant model ...]
        [--leaders] [--report-only CSV ...]
"""

from __future__ import annotations

import argparse
import csv
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.policies import BASELINES, DATA, OUT, _has_libcachesim, _run, capacities_for, trace_paths
from policies.learned.features import FEATURE_GROUPS

VARIANTS: dict[str, dict[str, object]] = {
    "model": {"scorer": "model"},
    "auto": {"scorer": "auto"},
    "prior": {"scorer": "prior"},
    "auto -chain-reuse": {"scorer": "auto", "chain_reuse": False},
    **{f"-{g}": {"scorer": "model", "ablate": [g]} for g in FEATURE_GROUPS},
}
REFERENCE = ["lru", "arc"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--trace", action="append", help="repeatable trace name filter; default: all")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS), help="default: all")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--leaders", action="store_true", help="also: which expert heat (as shipped) follows, per cell"
    )
    parser.add_argument(
        "--report-only", type=Path, nargs="+", metavar="CSV", help="re-render (and join) earlier runs"
    )
    args = parser.parse_args()
    variants = args.variant or list(VARIANTS)
    baselines = [p for p in BASELINES if not p.startswith("lcs-") or _has_libcachesim()]
    if args.report_only:
        joined: list[dict[str, object]] = []
        for path in args.report_only:
            with path.open() as fh:
                joined.extend(csv.DictReader(fh))
        report(joined, variants, baselines, Console(width=200))
        return
    paths = [p for p in trace_paths(args.data) if not args.trace or any(t in p.name for t in args.trace)]
    console = Console(width=200)
    started = time.perf_counter()
    rows: list[dict[str, object]] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        jobs = []
        for path in paths:
            caps = capacities_for(path)
            for policy in baselines:
                jobs.append((policy, pool.submit(_run, str(path), policy, caps, args.seed, {})))
            for name in variants:
                job = pool.submit(_run, str(path), "heat", caps, args.seed, VARIANTS[name])
                jobs.append((f"heat {name}", job))
        for label, future in jobs:
            for row in future.result():
                rows.append({**row, "policy": label})
    console.print(f"replayed {len(rows)} runs in {time.perf_counter() - started:.0f} s")
    report(rows, variants, baselines, console)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "heat_ablation.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    console.print(f"wrote {args.out / 'heat_ablation.csv'}")
    if args.leaders:
        table = Table("trace", "capacity", "leader: share of accesses", title="the expert heat follows")
        for path in paths:
            for c in capacities_for(path):
                shares = leader_shares(path, c, args.seed)
                text = ", ".join(f"{name} {100 * v:.0f}%" for name, v in shares.items())
                table.add_row(path.name, f"{c:,}", text)
        console.print(table)


def leader_shares(path: Path, capacity: int, seed: int) -> dict[str, float]:
    """Share of accesses after which each expert led heat's panel (block traces; a prefix trace
    retires the panel at its first chained block: "chains")."""
    from collections import Counter

    from policies.learned.heat import HeatPolicy
    from sim.traces import read_trace

    trace = read_trace(path)
    if trace.prefix:
        return {"chains (no panel)": 1.0}
    policy = HeatPolicy(capacity, seed=seed)
    led: Counter[str] = Counter()
    for key, t in zip(trace.keys.tolist(), trace.times_ms.tolist(), strict=True):
        policy.access(key, t)
        led[policy.leader or "none"] += 1
    return {name: n / len(trace) for name, n in led.most_common()}


def report(
    rows: list[dict[str, object]], variants: list[str], baselines: list[str], console: Console
) -> None:
    rate = {
        (str(r["trace"]), str(r["policy"]), int(str(r["capacity"]))): float(str(r["hit_rate"])) for r in rows
    }
    hits = {(str(r["trace"]), str(r["policy"]), int(str(r["capacity"]))): int(str(r["hits"])) for r in rows}
    traces = list(dict.fromkeys(str(r["trace"]) for r in rows))
    heat = [f"heat {v}" for v in variants]
    # gains[variant][family] = per-cell (variant - prior) in points; vs_best likewise vs best baseline
    gains: dict[str, dict[str, list[float]]] = {h: {"prefix": [], "block": []} for h in heat}
    vs_best: dict[str, dict[str, list[float]]] = {h: {"prefix": [], "block": []} for h in heat}
    same = dict.fromkeys(heat, 0)  # cells hit for hit the same as heat prior
    table = Table(
        "trace",
        "capacity",
        *REFERENCE,
        "best classic",
        *variants,
        title="heat ablation: hit % (heat variants: in brackets, minus heat prior)",
    )
    for trace in traces:
        caps = sorted({c for (t, _, c) in rate if t == trace})
        family = "prefix" if "mooncake" in trace else "block"
        short = trace.removesuffix(".gz").removesuffix(".trace").removesuffix(".jsonl")
        for c in caps:
            best, best_name = max((rate[(trace, p, c)], p) for p in baselines if (trace, p, c) in rate)
            cells = [f"{100 * rate[(trace, p, c)]:.2f}" for p in REFERENCE]
            prior = rate.get((trace, "heat prior", c))
            for h in heat:
                value = rate[(trace, h, c)]
                mark = "" if prior is None else f" ({100 * (value - prior):+.2f})"
                cells.append(f"{100 * value:.2f}{mark if h != 'heat prior' else ''}")
                if prior is not None:
                    gains[h][family].append(100 * (value - prior))
                    same[h] += hits[(trace, h, c)] == hits[(trace, "heat prior", c)]
                vs_best[h][family].append(100 * (value - best))
            table.add_row(short, f"{c:,}", *cells[:2], f"{100 * best:.2f} ({best_name})", *cells[2:])
    console.print(table)
    summary = Table(
        "variant",
        "prefix: mean vs prior",
        "prefix: mean vs best",
        "block: mean vs prior",
        "block: min vs prior",
        "block: max vs prior",
        "block: mean vs best",
        "cells = prior, hit for hit",
        title="heat ablation: mean difference in points over the cells of each trace family",
    )

    def fmt(values: list[float], how: str = "mean") -> str:
        if not values:
            return ""
        pick = {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}[how]
        return f"{pick:+.2f}"

    for h in heat:
        g, b = gains[h], vs_best[h]
        summary.add_row(
            h,
            fmt(g["prefix"]),
            fmt(b["prefix"]),
            fmt(g["block"]),
            fmt(g["block"], "min"),
            fmt(g["block"], "max"),
            fmt(b["block"]),
            f"{same[h]} of {len(g['prefix']) + len(g['block'])}",
        )
    console.print(summary)
    for h in ("heat model", "heat auto"):
        for family in ("prefix", "block"):
            diffs = gains.get(h, {}).get(family)
            if diffs:
                mean = sum(diffs) / len(diffs)
                verdict = "carries its weight" if mean > 0 else "does not carry its weight"
                console.print(f"{h} on {family} traces: {mean:+.2f} pt over heat prior: the model {verdict}")


if __name__ == "__main__":
    main()
