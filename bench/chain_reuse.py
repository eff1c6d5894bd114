"""Does heat's learned chain term (`policies/learned/chains.py`, `ChainReuse`) hold beyond one trace, at
which weight, and could miniatures tell where it does not?

Heat's chain mode (compiled: `cachemesh_heatcore.ChainHeat`) with the term at each of `--weights`
against the term off (LRFU alone), in points of prefix hits, on trace shapes the term was not designed
on: the dev Mooncake trace, its first and second halves (replayed cold), the whole trace with each
request's last block dropped, and generated conversations (Zipf popularity; a conversation re-reads its
chain and adds 1-4 blocks; its last, partial block is re-read with probability `tail`), and mixed
traffic (`sim/generated.py`: hot one-block prompts, conversations, one-off documents; `--mixed-seeds`
of them). The R= columns: the same comparison (shipped weight vs off) on miniatures (SHARDS: 1 request
in R by its root block, at capacity / R); "agrees" says whether the miniature's sign is the full-size
one (cells where the full-size effect is under 0.1 pt are not counted). "guarded": what ships, the
shipped weight with its online guard (`policies/learned/guard.py`), and "on": the share of the guard's
windows the term was on (the term's weight on that trace is the shipped weight times it).

    .venv/bin/python -m bench.chain_reuse [--trace PATH] [--capacity 2500 ...] [--weights 1,0.5,0.25]
        [--rates 8,32] [--mixed-seeds 3] [--out bench/results/chain_reuse.json]
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

from bench.policies import OUT
from bench.prefix_bounds import TRACE
from policies.learned.heat import HeatPolicy
from sim.generated import mixed_prefix_trace
from sim.traces import Trace, read_mooncake

SHIPPED = HeatPolicy(1).chain_reuse.weight  # type: ignore[union-attr]
_MIX = np.uint64(0x9E3779B97F4A7C15)


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
    return _trace(trace.name, keys, times, starts)


def _trace(name: str, keys: list[int], times: list[int], starts: list[int]) -> Trace:
    return Trace(
        name,
        np.asarray(keys, dtype=np.int64),
        np.asarray(times, dtype=np.int64),
        np.asarray(starts, dtype=np.int64),
        prefix=True,
    )


def conversations(n_blocks: int, skew: float, tail: float, seed: int) -> Trace:
    """Generated multi-turn traffic over `n_blocks` blocks (see the module docstring)."""
    rng = np.random.default_rng(seed)
    n_conv = max(1, n_blocks // 32)
    p = np.arange(1, n_conv + 1, dtype=np.float64) ** -skew
    chains: list[list[int]] = [[] for _ in range(n_conv)]
    keys: list[int] = []
    starts = [0]
    made = 0
    for conv, more in zip(
        rng.choice(n_conv, size=8 * n_blocks, p=p / p.sum()).tolist(),
        rng.integers(1, 5, size=8 * n_blocks).tolist(),
        strict=True,
    ):
        if made >= n_blocks:
            break
        chain = chains[conv]
        if chain and rng.random() > tail:
            chain.pop()  # the partial last block is rewritten, not re-read
        new = min(more, n_blocks - made)
        chain.extend(range(made, made + new))
        made += new
        keys.extend(chain)
        starts.append(len(keys))
    times = np.repeat(np.arange(len(starts) - 1), np.diff(starts)).tolist()
    return _trace(f"generated skew {skew}, tail {tail}", keys, times, starts)


def sampled(trace: Trace, rate: int) -> Trace:
    """The requests whose root block falls in a 1-in-`rate` spatial sample."""
    starts = trace.starts
    roots = trace.keys[starts[:-1]].astype(np.uint64)
    keep = np.nonzero(((roots * _MIX) >> np.uint64(40)) % np.uint64(rate) == 0)[0]
    keys: list[int] = []
    times: list[int] = []
    out = [0]
    for r in keep.tolist():
        a, b = int(starts[r]), int(starts[r + 1])
        keys.extend(trace.keys[a:b].tolist())
        times.extend(trace.times_ms[a:b].tolist())
        out.append(len(keys))
    return _trace(trace.name, keys, times, out)


def hit_rate(trace: Trace, capacity: int, weight: float | None) -> float:
    """Prefix hits (%) of chain-mode heat with the term at `weight` (None: off), unguarded."""
    core = ChainHeat(
        capacity, chain_reuse=weight is not None, chain_reuse_weight=weight or 0.0, chain_guard=False
    )
    return 100 * float(core.replay_prefix(trace.keys, trace.starts, trace.times_ms).mean())


def guarded(trace: Trace, capacity: int) -> tuple[float, float]:
    """Prefix hits (%) of chain-mode heat as it ships (the term guarded), and the share of the guard's
    windows the term was on (1.0 where the cache is too small for a guard, or no window closed)."""
    core = ChainHeat(capacity, chain_reuse_weight=SHIPPED)
    rate = 100 * float(core.replay_prefix(trace.keys, trace.starts, trace.times_ms).mean())
    state = core.guard_state()
    if state is None or state[1] == 0:
        return rate, 1.0
    return rate, 1.0 - state[2] / state[1]


@dataclass
class Cell:
    shape: str
    capacity: int
    off: float  # hit % with the term off
    gain: dict[str, float]  # weight -> points over off
    miniature_gain: dict[str, float]  # R -> the shipped weight's points over off, on miniatures
    guarded: float  # what ships (shipped weight, guarded): points over off
    term_on: float  # share of the guard's windows with the term on


def measure(trace: Trace, name: str, capacity: int, weights: list[float], rates: list[int]) -> Cell:
    off = hit_rate(trace, capacity, None)
    minis = {}
    for r in rates:
        small, mini = sampled(trace, r), max(16, capacity // r)
        minis[str(r)] = hit_rate(small, mini, SHIPPED) - hit_rate(small, mini, None)
    gains = {f"{w:g}": hit_rate(trace, capacity, w) - off for w in weights}
    shipped, on = guarded(trace, capacity)
    return Cell(name, capacity, off, gains, minis, shipped - off, on)


def summarise(cells: list[Cell], weights: list[float], rates: list[int]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for w in weights:
        g = [c.gain[f"{w:g}"] for c in cells]
        out[f"w={w:g}"] = {
            "mean": float(np.mean(g)),
            "worst": min(g),
            "up": sum(x > 0 for x in g),
            "of": len(g),
        }
    g = [c.guarded for c in cells]
    best = [c.guarded - max(0.0, c.gain[f"{SHIPPED:g}"]) for c in cells]
    out["guarded"] = {"mean": float(np.mean(g)), "worst": min(g), "up": sum(x > 0 for x in g), "of": len(g)}
    out["guarded vs the better of on / off"] = {"mean": float(np.mean(best)), "worst": min(best)}
    shipped = f"{SHIPPED:g}"
    counted = [c for c in cells if abs(c.gain.get(shipped, 0.0)) >= 0.1]
    for r in rates:
        agree = sum(np.sign(c.gain[shipped]) == np.sign(c.miniature_gain[str(r)]) for c in counted)
        out[f"R={r}"] = {"agrees": int(agree), "of": len(counted)}
    return out


def shapes(path: Path, mixed_seeds: int) -> dict[str, Trace]:
    """The trace shapes, by name: the dev Mooncake trace at `path`, its halves and its requests without
    their last block, generated conversations and `mixed_seeds` mixed traces."""
    full = read_mooncake(path)
    n = full.requests
    variants = {
        "dev trace": full,
        "first half": requests_of(full, 0, n // 2),
        "second half": requests_of(full, n // 2, n),
        "last block dropped": requests_of(full, 0, n, drop_tail=True),
        "generated 0.9 / 1.0": conversations(50_000, 0.9, 1.0, seed=1),
        "generated 0.9 / 0.0": conversations(50_000, 0.9, 0.0, seed=2),
        "generated 0.6 / 0.5": conversations(50_000, 0.6, 0.5, seed=3),
        "generated 1.1 / 0.3": conversations(100_000, 1.1, 0.3, seed=4),
    }
    for seed in range(mixed_seeds):
        share = (0.5, 0.3, 0.7)[seed % 3]
        variants[f"mixed {share:g} (seed {seed})"] = mixed_prefix_trace(seed, 12_000, single_share=share)
    return variants


def grouped_bars(
    labels: list[str], series: dict[str, list[float]], ylabel: str, path: Path, target: float | None = None
) -> None:
    """One group of bars per label (a shape at a capacity), one bar per series, saved to `path`;
    `target`: a dotted line at that height."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, 0.35 * len(labels)), 4))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(labels))], values, width, label=name)
    ax.axhline(0, color="black", linewidth=0.5)
    if target is not None:
        ax.axhline(target, color="red", linewidth=0.5, linestyle=":")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels, rotation=80, fontsize=6)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot(cells: list[Cell], weights: list[float], path: Path) -> None:
    labels = [f"{c.shape} @{c.capacity // 1000}k" for c in cells]
    series = {f"weight {w:g}": [c.gain[f"{w:g}"] for c in cells] for w in weights}
    grouped_bars(labels, series, "points over LRFU alone", path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--capacity", type=int, action="append")
    parser.add_argument("--weights", default=f"1,0.5,0.25,{SHIPPED}")
    parser.add_argument("--rates", default="8,32", help="miniatures' sampling factors")
    parser.add_argument("--mixed-seeds", type=int, default=3, help="mixed traffic traces (sim/generated.py)")
    parser.add_argument("--out", type=Path, default=OUT / "chain_reuse.json")
    args = parser.parse_args()
    capacities = args.capacity or [2_500, 5_000, 10_000, 20_000]
    weights = sorted({float(w) for w in args.weights.split(",")}, reverse=True)
    rates = [int(r) for r in args.rates.split(",")]
    variants = shapes(args.trace, args.mixed_seeds)
    console = Console(width=170)
    todo = [(name, trace, c) for name, trace in variants.items() for c in capacities]
    cells = [
        measure(trace, name, c, weights, rates)
        for name, trace, c in track(todo, description="replaying", console=console, transient=True)
    ]
    table = Table(
        "shape",
        "capacity",
        "off (%)",
        *[f"w={w:g}" for w in weights],
        *[f"R={r}" for r in rates],
        "guarded",
        "on",
    )
    table.title = "the chain term's gain over LRFU alone (pt); R=: the shipped weight's, on miniatures"
    for c in cells:
        gains = [f"{g:+.2f}" for g in c.gain.values()]
        table.add_row(
            c.shape,
            f"{c.capacity:,}",
            f"{c.off:.2f}",
            *gains,
            *[f"{m:+.2f}" for m in c.miniature_gain.values()],
            f"{c.guarded:+.2f}",
            f"{c.term_on:.0%}",
        )
    console.print(table)
    summary = summarise(cells, weights, rates)
    for name, figures in summary.items():
        console.print(
            f"{name}: "
            + ", ".join(
                f"{k} {v:+.2f}" if k in ("mean", "worst") else f"{k} {v:g}" for k, v in figures.items()
            )
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {"shipped_weight": SHIPPED, "cells": [asdict(c) for c in cells], "summary": summary}
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    plot(cells, weights, args.out.with_suffix(".png"))
    console.print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
