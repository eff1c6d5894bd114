"""Policy benchmark: every trace in ../shared/data/traces, three capacities each, every policy.

LIRS traces run at 10 / 25 / 50% of their distinct keys; Mooncake at 5,000 / 10,000 / 20,000 blocks
(the reference replay's capacities) with prefix hits. Prints one table per trace, the AI-native
policy against the best classic policy (LRU, LFU, ARC, W-TinyLFU; LIRS, one of its experts, is shown
but not in that comparison) and its gap to Belady, and replay throughput per policy; writes
bench/results/policies.{csv,md} and a plot per trace.

    .venv/bin/python -m bench.policies [--jobs 2] [--policy heat ...] [--trace cs ...]
        [--heat-option 'experts=["lru","lirs","arc","wtinylfu","heat-frame"]' ...]

`--heat-option NAME=JSON` passes a keyword argument to `HeatPolicy` (e.g. `migration_cost=0.1`),
to try a variant against the same table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from infra.paths import shared_data_dir
from sim.replay import ReplayResult

ROOT = Path(__file__).resolve().parents[1]
DATA = shared_data_dir() / "traces"
OUT = ROOT / "bench" / "results"
POLICIES = ["lru", "lfu", "lru2", "arc", "wtinylfu", "lirs", "heat", "opt"]
CLASSIC = ["lru", "lfu", "arc", "wtinylfu"]  # the policies the AI-native one must match
LIRS_FRACTIONS = (0.10, 0.25, 0.50)
MOONCAKE_CAPACITIES = (5_000, 10_000, 20_000)


def trace_paths(data: Path) -> list[Path]:
    return sorted((data / "lirs").glob("*.trace.gz")) + sorted(data.glob("*.jsonl"))


def capacities_for(path: Path) -> list[int]:
    from sim.traces import read_trace

    trace = read_trace(path)
    if trace.prefix:
        return list(MOONCAKE_CAPACITIES)
    return [max(1, round(f * trace.distinct)) for f in LIRS_FRACTIONS]


def _run(
    path: str, policy: str, capacities: list[int], seed: int, heat_options: dict[str, object]
) -> list[dict[str, object]]:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from sim.cli import limit_threads
    from sim.replay import run_grid
    from sim.traces import read_trace

    limit_threads()
    trace = read_trace(Path(path))
    return [
        {
            "trace": r.trace,
            "policy": r.policy,
            "capacity": r.capacity,
            "accesses": r.accesses,
            "hits": r.hits,
            "hit_rate": r.hit_rate,
            "compulsory": r.compulsory,
            "seconds": r.seconds,
        }
        for r in run_grid(trace, [policy], capacities, seed=seed, heat_options=heat_options)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--policy", action="append", help="repeatable; default: all")
    parser.add_argument("--trace", action="append", help="repeatable trace name filter; default: all")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--heat-option", action="append", default=[], metavar="NAME=JSON", help="HeatPolicy kwarg"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report-only", action="store_true", help="re-render from OUT/policies.csv")
    args = parser.parse_args()
    policies = args.policy or POLICIES
    heat_options = dict(_option(o) for o in args.heat_option)
    console = Console(width=160)
    if args.report_only:
        with (args.out / "policies.csv").open() as fh:
            report(list(csv.DictReader(fh)), policies, args.out, console)
        return
    paths = [p for p in trace_paths(args.data) if not args.trace or any(t in p.name for t in args.trace)]
    started = time.perf_counter()
    tasks = [(p, capacities_for(p)) for p in paths]
    rows: list[dict[str, object]] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(_run, str(path), policy, caps, args.seed, heat_options)
            for path, caps in tasks
            for policy in policies
        ]
        for future in futures:
            rows.extend(future.result())
    console.print(f"replayed {len(rows)} runs in {time.perf_counter() - started:.0f} s")
    report(rows, policies, args.out, console)


def _option(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--heat-option wants NAME=JSON, got {text!r}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--heat-option {name}: {value!r} is not JSON ({exc.msg})") from exc


def _results(rows: list[dict[str, object]]) -> list[ReplayResult]:
    return [
        ReplayResult(
            trace=str(r["trace"]),
            policy=str(r["policy"]),
            capacity=int(str(r["capacity"])),
            accesses=int(str(r["accesses"])),
            hits=int(str(r["hits"])),
            compulsory=int(str(r["compulsory"])),
            seconds=float(str(r["seconds"])),
        )
        for r in rows
    ]


def _md_table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in body]


def report(rows: list[dict[str, object]], policies: list[str], out: Path, console: Console) -> None:
    from sim.cli import plot, write_csv

    out.mkdir(parents=True, exist_ok=True)
    results = _results(rows)
    write_csv(results, out / "policies.csv")
    details: list[str] = []
    summary_header = [
        "trace",
        "capacity",
        "best classic",
        "heat",
        "heat - best",
        "OPT",
        "gap to OPT",
        "gap closed",
    ]
    summary_rows: list[list[str]] = []
    matched = 0
    for name in dict.fromkeys(r.trace for r in results):
        mine = [r for r in results if r.trace == name]
        title = f"{name} ({mine[0].accesses:,} accesses, {mine[0].compulsory:,} distinct keys)"
        plot(mine, out / f"{name}_policies.png", title)
        capacities = sorted({r.capacity for r in mine})
        by = {(r.policy, r.capacity): r for r in mine}
        body = []
        for policy in policies:
            cells = [by.get((policy, c)) for c in capacities]
            body.append([policy] + [f"{100 * r.hit_rate:.2f}" if r else "" for r in cells])
        header = ["policy"] + [f"{c:,}" for c in capacities]
        table = Table(*header, title=title)
        for row in body:
            table.add_row(*row)
        console.print(table)
        details += ["", f"**{title}**", "", *_md_table(header, body)]
        for c in capacities:
            classic = [(by[(p, c)].hit_rate, p) for p in CLASSIC if (p, c) in by]
            if not classic or ("heat", c) not in by:
                continue
            best, best_name = max(classic)
            heat = by[("heat", c)].hit_rate
            matched += heat >= best
            opt = by[("opt", c)].hit_rate if ("opt", c) in by else None
            summary_rows.append(
                [
                    name,
                    f"{c:,}",
                    f"{100 * best:.2f} ({best_name})",
                    f"{100 * heat:.2f}",
                    f"{100 * (heat - best):+.2f}",
                    "" if opt is None else f"{100 * opt:.2f}",
                    "" if opt is None else f"{100 * (opt - heat):.2f}",
                    ""
                    if opt is None or opt <= best or heat < best
                    else f"{100 * (heat - best) / (opt - best):.0f}%",
                ]
            )
    summary = Table(*summary_header, title="heat vs the best of LRU, LFU, ARC, W-TinyLFU, and vs OPT")
    for row in summary_rows:
        summary.add_row(*row)
    console.print(summary)
    verdict = f"heat >= the best of {', '.join(CLASSIC)} in {matched} of {len(summary_rows)} cells"
    console.print(verdict)
    speed_rows = []
    for policy in policies:
        mine = [r for r in results if r.policy == policy]
        rate = sum(r.accesses for r in mine) / max(sum(r.seconds for r in mine), 1e-9)
        speed_rows.append([policy, f"{rate:,.0f}"])
    speed = Table("policy", "accesses/s", title="replay throughput (all traces and capacities)")
    for row in speed_rows:
        speed.add_row(*row)
    console.print(speed)
    md = [
        "# Policy benchmark",
        "",
        *_md_table(summary_header, summary_rows),
        "",
        verdict,
        "",
        *_md_table(["policy", "accesses/s"], speed_rows),
        *details,
    ]
    (out / "policies.md").write_text("\n".join(md) + "\n")
    console.print(f"wrote {out / 'policies.csv'}, {out / 'policies.md'} and one plot per trace")


if __name__ == "__main__":
    main()
