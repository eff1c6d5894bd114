"""Which LRFU half-life should heat's chain mode use, and could miniatures pick it online?

Heat's chain mode (compiled: `cachemesh_heatcore.ChainHeat`, as it ships: the learned term at its
weight, guarded) evicts the leaf of least combined recency-frequency, which halves every
`chain_half_life` capacities of accesses (3 ships). This replays it at each of `--half-lives` on the
trace shapes of `bench.chain_reuse` (the dev Mooncake trace, its halves, its requests without their last
block, generated conversations, mixed traffic) against the best of LRU, ARC, LIRS, W-TinyLFU, S3-FIFO and
SIEVE (the project's replayer, prefix hits: a request hits up to its first missing block), in points of
prefix hits. "mini picks": the half-life a miniature (SHARDS: 1 request in `--rate` by its root block, at
capacity / rate) finds best, and the full-size hits at that half-life, what an online choice by
miniatures could reach; "hindsight": the best half-life at full size; "ships": what heat does, its
guard's miniatures moving the half-life online among 3, 10 and 30 (`policies/learned/guard.py`), with the
half-life it ended at and how often it moved. (The fixed columns keep the half-life fixed.)

    .venv/bin/python -m bench.chain_half_life [--trace PATH] [--capacity 2500 ...]
        [--half-lives 1,3,10,30] [--rate 10] [--mixed-seeds 3] [--out bench/results/chain_half_life.json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from cachemesh_heatcore import ChainHeat
from rich.console import Console
from rich.progress import track
from rich.table import Table

from bench.chain_reuse import SHIPPED, grouped_bars, sampled, shapes
from bench.policies import OUT
from bench.prefix_bounds import TRACE
from sim.replay import run_grid
from sim.traces import Trace

BASELINES = ["lru", "arc", "lirs", "wtinylfu", "s3fifo", "sieve"]


@dataclass
class Cell:
    shape: str
    capacity: int
    heat: dict[str, float]  # half-life -> prefix hits (%)
    best: float  # the best baseline's prefix hits (%)
    best_policy: str
    mini_pick: float  # the half-life the miniature found best
    hindsight: float  # the half-life best at full size
    ships: float  # prefix hits (%) with the half-life moved online, as heat ships
    ships_half_life: float  # ... the half-life it ended at
    ships_switches: int  # ... and how often it moved


def heat_hits(trace: Trace, capacity: int, half_life: float) -> float:
    """Prefix hits (%) of chain-mode heat as it ships, at a fixed `half_life`."""
    core = ChainHeat(capacity, chain_reuse_weight=SHIPPED, chain_half_life=half_life, chain_half_lives=[])
    return 100 * float(core.replay_prefix(trace.keys, trace.starts, trace.times_ms).mean())


def shipped_hits(trace: Trace, capacity: int) -> tuple[float, float, int]:
    """Prefix hits (%) of chain-mode heat as it ships (the half-life moved online), the half-life it
    ended at and how many times it moved."""
    core = ChainHeat(capacity, chain_reuse_weight=SHIPPED)
    hits = 100 * float(core.replay_prefix(trace.keys, trace.starts, trace.times_ms).mean())
    state = core.guard_state()
    return (hits, 3.0, 0) if state is None else (hits, state[6], state[7])


def measure(trace: Trace, name: str, capacity: int, half_lives: list[float], rate: int) -> Cell:
    heat = {f"{h:g}": heat_hits(trace, capacity, h) for h in half_lives}
    small, mini = sampled(trace, rate), max(16, capacity // rate)
    on_mini = [heat_hits(small, mini, h) for h in half_lives]
    results = run_grid(trace, BASELINES, [capacity])
    best = max(results, key=lambda r: r.hit_rate)
    full = [heat[f"{h:g}"] for h in half_lives]
    ships = shipped_hits(trace, capacity)
    return Cell(
        name,
        capacity,
        heat,
        100 * best.hit_rate,
        best.policy,
        half_lives[int(np.argmax(on_mini))],
        half_lives[int(np.argmax(full))],
        *ships,
    )


def plot(cells: list[Cell], half_lives: list[float], path: Path) -> None:
    labels = [f"{c.shape} @{c.capacity // 1000}k" for c in cells]
    series = {f"half-life {h:g}": [c.heat[f"{h:g}"] - c.best for c in cells] for h in half_lives}
    series["moved online (ships)"] = [c.ships - c.best for c in cells]
    grouped_bars(labels, series, "points over the best baseline", path, target=-0.5)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--capacity", type=int, action="append")
    parser.add_argument("--half-lives", default="1,3,10,30")
    parser.add_argument("--rate", type=int, default=10, help="the miniatures' sampling factor")
    parser.add_argument("--mixed-seeds", type=int, default=3, help="mixed traffic traces (sim/generated.py)")
    parser.add_argument("--out", type=Path, default=OUT / "chain_half_life.json")
    args = parser.parse_args()
    capacities = args.capacity or [2_500, 5_000, 10_000, 20_000]
    half_lives = sorted({float(h) for h in args.half_lives.split(",")})
    variants = shapes(args.trace, args.mixed_seeds)
    console = Console(width=170)
    todo = [(name, trace, c) for name, trace in variants.items() for c in capacities]
    cells = [
        measure(trace, name, c, half_lives, args.rate)
        for name, trace, c in track(todo, description="replaying", console=console, transient=True)
    ]
    table = Table(
        "shape", "capacity", "best baseline (%)", *[f"hl={h:g}" for h in half_lives], "mini picks", "ships"
    )
    table.title = "heat's chain mode at each half-life: points over the best baseline (-0.5: the target)"
    for c in cells:
        picked = c.heat[f"{c.mini_pick:g}"] - c.best
        table.add_row(
            c.shape,
            f"{c.capacity:,}",
            f"{c.best:.2f} ({c.best_policy})",
            *[f"{c.heat[f'{h:g}'] - c.best:+.2f}" for h in half_lives],
            f"{c.mini_pick:g}: {picked:+.2f}",
            f"{c.ships - c.best:+.2f} (hl {c.ships_half_life:g}, {c.ships_switches} moves)",
        )
    console.print(table)
    summary: dict[str, dict[str, float]] = {}
    for h in half_lives:
        gaps = [c.heat[f"{h:g}"] - c.best for c in cells]
        summary[f"hl={h:g}"] = {
            "mean": float(np.mean(gaps)),
            "worst": min(gaps),
            "cells_below_target": sum(g < -0.5 for g in gaps),
        }
    picks = {
        "mini picks": [c.heat[f"{c.mini_pick:g}"] - c.best for c in cells],
        "hindsight": [c.heat[f"{c.hindsight:g}"] - c.best for c in cells],
        "ships": [c.ships - c.best for c in cells],
    }
    for name, gaps in picks.items():
        summary[name] = {
            "mean": float(np.mean(gaps)),
            "worst": min(gaps),
            "cells_below_target": sum(g < -0.5 for g in gaps),
        }
    for name, figures in summary.items():
        console.print(
            f"{name}: "
            + ", ".join(
                f"{k} {v:+.2f}" if k != "cells_below_target" else f"{k} {v}" for k, v in figures.items()
            )
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "half_lives": half_lives,
        "rate": args.rate,
        "cells": [asdict(c) for c in cells],
        "summary": summary,
    }
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    plot(cells, half_lives, args.out.with_suffix(".png"))
    console.print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
