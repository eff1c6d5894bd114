"""`cachemesh replay`: replay a cache trace through policies x capacities; print, CSV and plot."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from policies import ALL
from sim.replay import ReplayResult, run_grid
from sim.traces import TraceFormat, read_trace

CSV_FIELDS = (
    "trace",
    "policy",
    "capacity",
    "accesses",
    "hits",
    "hit_rate",
    "compulsory",
    "seconds",
    "throughput",
)


def limit_threads() -> None:
    """One BLAS/torch thread: the replayer's matrices are tiny and the cores are shared."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        pass
    import torch

    torch.set_num_threads(1)


def write_csv(results: list[ReplayResult], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in results:
            writer.writerow(
                {
                    "trace": r.trace,
                    "policy": r.policy,
                    "capacity": r.capacity,
                    "accesses": r.accesses,
                    "hits": r.hits,
                    "hit_rate": f"{r.hit_rate:.6f}",
                    "compulsory": r.compulsory,
                    "seconds": f"{r.seconds:.3f}",
                    "throughput": f"{r.throughput:.0f}",
                }
            )


def plot(results: list[ReplayResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r.policy for r in results):
        rows = sorted((r for r in results if r.policy == name), key=lambda r: r.capacity)
        ax.plot([r.capacity for r in rows], [100 * r.hit_rate for r in rows], marker="o", label=name)
    ax.set_xlabel("capacity (entries)")
    ax.set_ylabel("hit rate (%)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def results_table(results: list[ReplayResult], title: str) -> Table:
    capacities = sorted({r.capacity for r in results})
    table = Table(title=title)
    table.add_column("policy")
    for c in capacities:
        table.add_column(f"{c:,}", justify="right")
    table.add_column("accesses/s", justify="right")
    for name in dict.fromkeys(r.policy for r in results):
        rows = {r.capacity: r for r in results if r.policy == name}
        accesses = sum(r.accesses for r in rows.values())
        seconds = sum(r.seconds for r in rows.values())
        cells = [f"{100 * rows[c].hit_rate:.2f}%" if c in rows else "" for c in capacities]
        table.add_row(name, *cells, f"{accesses / seconds:,.0f}" if seconds else "")
    return table


def replay(
    trace: Annotated[Path, typer.Argument(help="LIRS (.gz ok), ARC or Mooncake JSONL trace", exists=True)],
    policy: Annotated[
        list[str], typer.Option("--policy", "-p", help=f"repeatable; one of {', '.join(ALL)}")
    ] = [  # noqa: B006
        "lru",
        "arc",
        "wtinylfu",
        "heat",
        "opt",
    ],
    capacity: Annotated[list[int], typer.Option("--capacity", "-c", help="repeatable, in entries")] = [  # noqa: B006
        1000
    ],
    out: Annotated[Path, typer.Option(help="directory for the CSV and PNG")] = Path("bench/results"),
    fmt: Annotated[TraceFormat | None, typer.Option("--format", help="lirs | arc | mooncake")] = None,
    seed: Annotated[int, typer.Option(help="seed for the sketches and the heat model")] = 0,
) -> None:
    """Replay TRACE through each policy at each capacity; print hit rates, write CSV and a plot."""
    limit_threads()
    console = Console()
    try:
        data = read_trace(trace, fmt)
    except (ValueError, KeyError, TypeError, OSError, EOFError) as exc:
        # a file in another format (or damaged): say so, no traceback; 2 like any bad argument
        kind = f"a {fmt} trace" if fmt else "a LIRS, ARC or Mooncake trace"
        Console(stderr=True).print(f"[red]cannot read {trace} as {kind}: {type(exc).__name__}: {exc}[/]")
        raise typer.Exit(2) from None
    unknown = [p for p in policy if p not in ALL]
    if unknown:
        raise typer.BadParameter(f"unknown policy {unknown}; known: {', '.join(ALL)}")
    total = len(data) * len(policy) * len(capacity)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(f"replaying {data.name}", total=total)
        results = run_grid(data, policy, capacity, seed=seed, progress=lambda n: bar.advance(task, n))
    title = f"{data.name}: {len(data):,} accesses, {data.distinct:,} keys" + (
        " (prefix hits)" if data.prefix else ""
    )
    console.print(results_table(results, title))
    csv_path = out / f"{data.name}_replay.csv"
    png_path = out / f"{data.name}_replay.png"
    write_csv(results, csv_path)
    plot(results, png_path, title)
    console.print(f"wrote {csv_path} and {png_path}")


def main() -> None:  # pragma: no cover - the lead mounts `replay` on the `cachemesh` app
    typer.run(replay)


if __name__ == "__main__":  # pragma: no cover
    main()
