"""Policy benchmark: every trace in ../shared/data/traces, three capacities each, every policy.

LIRS traces run at 10 / 25 / 50% of their distinct keys; Mooncake at 5,000 / 10,000 / 20,000 blocks
(the reference replay's capacities) with prefix hits. Prints one table per trace, the AI-native
policy against the best baseline (LRU, LFU, ARC, W-TinyLFU, LIRS, S3-FIFO, SIEVE, and libCacheSim's
LIRS, S3-FIFO and SIEVE as `lcs-*` where `libcachesim` is installed) and its gap to Belady, replay
throughput per policy and, with `--memory`, bytes of policy state per resident entry; writes
bench/results/policies.{csv,md} and a plot per trace.

    .venv/bin/python -m bench.policies [--jobs 2] [--policy heat ...] [--trace cs ...] [--memory]
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
from sim.traces import Trace

ROOT = Path(__file__).resolve().parents[1]
DATA = shared_data_dir() / "traces"
OUT = ROOT / "bench" / "results"
LCS = ["lcs-lirs", "lcs-s3fifo", "lcs-sieve"]  # libCacheSim's own, replayed by bench.libcachesim_check
POLICIES = ["lru", "lfu", "lru2", "arc", "wtinylfu", "lirs", "s3fifo", "sieve", *LCS, "heat", "opt"]
# the policies the AI-native one must match (within TOLERANCE_PT in every cell)
BASELINES = ["lru", "lfu", "arc", "wtinylfu", "lirs", "s3fifo", "sieve", *LCS]
TOLERANCE_PT = 0.5
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
    if policy.startswith("lcs-"):
        return _run_libcachesim(trace, policy, capacities)
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


def _run_libcachesim(trace: Trace, policy: str, capacities: list[int]) -> list[dict[str, object]]:
    from bench.libcachesim_check import theirs
    from sim.replay import compulsory_mask

    rows: list[dict[str, object]] = []
    compulsory = int(compulsory_mask(trace.keys).sum())
    for capacity in capacities:
        hits, seconds = theirs(trace, policy.removeprefix("lcs-"), capacity)
        rows.append(
            {
                "trace": trace.name,
                "policy": policy,
                "capacity": capacity,
                "accesses": len(trace),
                "hits": hits,
                "hit_rate": hits / len(trace),
                "compulsory": compulsory,
                "seconds": seconds,
            }
        )
    return rows


def bytes_per_entry(path: Path, policy: str, capacity: int, heat_options: dict[str, object]) -> float:
    """Python heap the policy holds after replaying `path`, per resident entry (tracemalloc)."""
    import gc
    import tracemalloc

    from policies import make_policy
    from sim.replay import replay
    from sim.traces import read_trace

    trace = read_trace(path)
    make_policy(policy, 1, future=trace.keys, heat_options=heat_options)  # imports outside the count
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    built = make_policy(policy, capacity, future=trace.keys, heat_options=heat_options)
    replay(trace, built)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / max(len(built), 1)


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
    parser.add_argument("--memory", action="store_true", help="also bytes per entry (Mooncake, 10k)")
    args = parser.parse_args()
    policies = args.policy or [p for p in POLICIES if not p.startswith("lcs-") or _has_libcachesim()]
    heat_options = dict(_option(o) for o in args.heat_option)
    console = Console(width=160)
    if args.report_only:
        with (args.out / "policies.csv").open() as fh:
            report(list(csv.DictReader(fh)), policies, args.out, console)
    else:
        replay_all(args, policies, heat_options, console)
    if args.memory:
        mooncake = args.data / "mooncake_synthetic.jsonl"
        memory = Table("policy", "bytes per resident entry", title=f"policy state, {mooncake.name} at 10,000")
        for policy in (p for p in policies if not p.startswith("lcs-")):
            memory.add_row(policy, f"{bytes_per_entry(mooncake, policy, 10_000, heat_options):,.0f}")
        console.print(memory)


def replay_all(
    args: argparse.Namespace, policies: list[str], heat_options: dict[str, object], console: Console
) -> None:
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


def _has_libcachesim() -> bool:
    import importlib.util

    return importlib.util.find_spec("libcachesim") is not None


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
        "best baseline",
        "heat",
        "heat - best",
        "OPT",
        "gap to OPT",
        "gap closed",
    ]
    summary_rows: list[list[str]] = []
    matched = within = 0
    gaps: list[float] = []
    trailing: list[str] = []
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
            baselines = [(by[(p, c)].hit_rate, p) for p in BASELINES if (p, c) in by]
            if not baselines or ("heat", c) not in by:
                continue
            best, best_name = max(baselines)
            heat = by[("heat", c)].hit_rate
            matched += heat >= best
            within += 100 * (heat - best) >= -TOLERANCE_PT
            gaps.append(100 * (heat - best))
            if 100 * (heat - best) < -TOLERANCE_PT:
                trailing.append(f"{name} @ {c:,}: heat {100 * heat:.2f}, {best_name} {100 * best:.2f}")
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
    summary = Table(*summary_header, title=f"heat vs the best of {', '.join(BASELINES)}, and vs OPT")
    for row in summary_rows:
        summary.add_row(*row)
    console.print(summary)
    mean = sum(gaps) / len(gaps) if gaps else 0.0
    verdict = (
        f"heat >= the best baseline in {matched} of {len(summary_rows)} cells, within {TOLERANCE_PT} pt"
        f" in {within}; mean heat - best {mean:+.2f} pt"
    )
    console.print(verdict)
    for line in trailing:
        console.print(f"  more than {TOLERANCE_PT} pt below: {line}")
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
        *[f"- more than {TOLERANCE_PT} pt below: {line}" for line in trailing],
        "",
        *_md_table(["policy", "accesses/s"], speed_rows),
        *details,
    ]
    (out / "policies.md").write_text("\n".join(md) + "\n")
    console.print(f"wrote {out / 'policies.csv'}, {out / 'policies.md'} and one plot per trace")


if __name__ == "__main__":
    main()
