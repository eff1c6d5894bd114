"""The seed §2.2 burst experiment as a replay scenario, one row per policy.

Zipf(0.9) over 10,000 keys, capacity 500, 200,000 requests; at request 100,000 the 100 hottest
ranks move to never-seen keys (see services/heat/burst.py for the metrics). Checks the issue's
targets for the AI-native policy (heat): a new hot key resident within 3 of its requests (median
over the 100 new keys), a dip without compulsory misses at most 2 points above OPT's, and a pre-shift
hit rate at least W-TinyLFU's. Writes bench/results/burst.{csv,png}.

    .venv/bin/python -m bench.burst [--seed 0]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ["lru", "lfu", "lru2", "arc", "wtinylfu", "heat", "opt"]


def main() -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from policies import make_policy
    from sim.burst import BurstScenario, burst_metrics, burst_trace
    from sim.cli import limit_threads
    from sim.replay import replay

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", action="append")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    limit_threads()
    scenario = BurstScenario(seed=args.seed)
    trace, new_keys = burst_trace(scenario)
    console = Console(width=160)
    results, windows = {}, {}
    for name in args.policy or POLICIES:
        run = replay(
            trace, make_policy(name, scenario.capacity, future=trace.keys, seed=args.seed), record=True
        )
        assert run.hit_mask is not None
        results[name] = burst_metrics(name, trace, new_keys, run.hit_mask, scenario)
        windows[name] = run.hit_mask.reshape(-1, scenario.window).mean(axis=1)
    table = Table(title="burst: Zipf(0.9), 10,000 keys, capacity 500; 100 hottest ranks move at 100,000")
    header = [
        "policy",
        "hit %",
        "pre %",
        "dip pts",
        "dip pts (no compulsory)",
        "recovery (requests)",
        "to residency: median",
        "p90",
        "max",
        "<= 3",
    ]
    for h in header:
        table.add_column(h, justify="right")
    for r in results.values():
        table.add_row(
            r.policy,
            f"{100 * r.hit_rate:.2f}",
            f"{100 * r.pre_hit_rate:.2f}",
            f"{100 * r.dip:.2f}",
            f"{100 * r.dip_warm:.2f}",
            "never" if r.recovery_requests is None else f"{r.recovery_requests:,}",
            f"{r.residency_median:g}",
            f"{r.residency_p90:g}",
            f"{r.residency_max}",
            f"{100 * r.resident_within_3:.0f}%",
        )
    console.print(table)
    if {"heat", "opt", "wtinylfu"} <= results.keys():
        heat, opt, wt = results["heat"], results["opt"], results["wtinylfu"]
        dip, bound = 100 * heat.dip_warm, 100 * opt.dip_warm + 2
        pre, pre_wt = 100 * heat.pre_hit_rate, 100 * wt.pre_hit_rate
        checks = [
            ("new hot key resident within 3 of its requests (median)", heat.residency_median <= 3),
            (f"dip without compulsory <= OPT's + 2 pts ({dip:.2f} vs {bound:.2f})", dip <= bound),
            (f"pre-shift hit rate >= W-TinyLFU's ({pre:.2f} vs {pre_wt:.2f})", pre >= pre_wt),
        ]
        for text, ok in checks:
            console.print(f"[{'green' if ok else 'red'}]{'met' if ok else 'NOT met'}[/]: {text}")
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "burst.csv").open("w", newline="") as fh:
        fields = [f.name for f in dataclasses.fields(next(iter(results.values())))]
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for r in results.values():
            writer.writerow(dataclasses.asdict(r))
    plot(windows, scenario.shift_at // scenario.window, args.out / "burst.png")
    console.print(f"wrote {args.out / 'burst.csv'} and {args.out / 'burst.png'}")


def plot(windows: dict[str, object], shift_window: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    lo, hi = shift_window - 10, shift_window + 30
    for name, series in windows.items():
        ax.plot(range(lo, hi), [100 * float(v) for v in series[lo:hi]], label=name)  # type: ignore[index]
    ax.axvline(shift_window, color="grey", linestyle="--")
    ax.set_xlabel("1,000-request window")
    ax.set_ylabel("hit rate (%)")
    ax.set_title("burst: hit rate around the shift")
    ax.grid(True, alpha=0.3)
    ax.legend(ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
