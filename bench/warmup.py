"""Warmup benchmark: first-token latency (FTL) of a modelled serving engine (bench/_warmup_engine.py)
with no cache, an LRU prefix cache without warmup, the approaches tried (heat, turn-aware retention
with its LRU guard and the end signal, early warmup, layer-wise load/prefill overlap) and cachemesh as
shipped, against bounds: Belady on the GPU tier, an oracle that knows every arrival, and the floor no
cache passes (each request prefills its never-seen tokens); then the A/B table warmup off/on x
lru/heat with cold-start latency, hit rate, L2 fragmentation and health (docs/design.md §4.2). Writes
bench/results/warmup.{csv,png}.

Workloads:
- long-context (docs/design.md §4.3): conversations whose context grows by `tokens_per_turn` each turn to 32K
  tokens at turn 8, prefix-chained 512-token blocks, Poisson conversation starts, turn gaps of decode
  time plus exponential think time; every parameter is printed with the results.
- mooncake: /work/shared/data/traces/mooncake_synthetic.jsonl (timestamp ms, input_length,
  hash_ids). It carries no conversation ids, so the planner gets none (`trace_id` None); one extra
  row, labelled as such, infers a session from each request's first block.

    .venv/bin/python -m bench.warmup [--mooncake-limit N] [--conversations 48] [--seed 0] [--only NAME]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench._warmup_engine import Engine, EngineConfig, EngineRun, OracleWarmup, Request, Served
from policies.base import Policy
from services.warmup.planner import PlannerConfig, WarmupPlanner
from services.warmup.retention import LruGuarded, TurnAwareRetention

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = Path("/work/shared/data/traces/mooncake_synthetic.jsonl")
BASELINE = "lru"  # "no warmup": the LRU prefix cache, the seed's comparison
TARGET = -0.70  # the target FTL change against no warmup (the seed reports -63%)


@dataclass(frozen=True, slots=True)
class LongContext:
    conversations: int = 48
    turns: int = 8
    tokens_per_turn: int = 4_096  # 8 blocks a turn; turn 8 holds 32K tokens (64 blocks)
    arrival_mean_s: float = 4.0  # Poisson conversation starts
    output_tokens: int = 256
    tpot_ms: float = 6.0  # decode time per output token (8B on an H100, light load)
    think_mean_s: float = 20.0  # user think time after the answer: gamma with this mean ...
    think_min_s: float = 3.0  # ... never less than this ...
    think_cv: float = 1.0  # ... and this coefficient of variation (1: exponential, memoryless)
    seed: int = 0


def long_context(w: LongContext, block_tokens: int = 512) -> list[Request]:
    """Block j of conversation c is `c * 10_000 + j`: a chain, so turn t reuses turn t-1's blocks."""
    rng = np.random.default_rng(w.seed)
    per_turn = w.tokens_per_turn // block_tokens
    out: list[Request] = []
    start = 0.0
    for c in range(w.conversations):
        start += rng.exponential(w.arrival_mean_s * 1000)
        at = start
        for t in range(w.turns):
            n = (t + 1) * per_turn
            blocks = tuple(c * 10_000 + j for j in range(n))
            last = t == w.turns - 1
            out.append(Request(round(at), blocks, n * block_tokens, f"conv-{c}", t, last))
            shape = 1.0 / (w.think_cv * w.think_cv)
            think = rng.gamma(shape, w.think_mean_s * 1000 / shape)
            at += w.output_tokens * w.tpot_ms + max(w.think_min_s * 1000, think)
    return sorted(out, key=lambda r: r.at_ms)


def mooncake(path: Path, limit: int | None, sessions: bool) -> list[Request]:
    """The trace as requests; `sessions` names a session after the request's first block (an
    inference, not in the trace) and numbers its turns."""
    out: list[Request] = []
    turns: dict[int, int] = {}
    with path.open() as fh:
        for line in fh:
            if not line.strip():
                continue
            raw = json.loads(line)
            blocks = tuple(int(b) for b in raw["hash_ids"])
            turn = turns.get(blocks[0], 0)
            turns[blocks[0]] = turn + 1
            trace_id = f"root-{blocks[0]}" if sessions else None
            out.append(Request(int(raw["timestamp"]), blocks, int(raw["input_length"]), trace_id, turn))
            if limit is not None and len(out) >= limit:
                break
    return out


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    # None: no cache; "turn-aware" (+guard): services/warmup/retention.py; "opt": Belady
    policy: str | None
    warmup: bool
    sessions: bool = False  # mooncake only: session ids inferred from the first block
    overlap: bool = False  # layer-wise load/prefill pipelining (EngineConfig.layerwise_overlap)
    end_signal: bool = False  # ConversationEnded after a conversation's last turn
    oracle: bool = False  # warmup by OracleWarmup (knows every arrival) instead of the planner
    warm_to_gpu: bool = False  # conversation warmups into the GPU tier (l1) instead of L2
    warm_early: bool = False  # conversation warmups (L3 -> L2) by the earliest return seen, not the quartile


# The approaches tried (a: GPU-tier retention, b: warmup timing and target, c: load/prefill overlap),
# cachemesh as shipped (the best of them together), and the bounds.
FINAL = Variant(
    "cachemesh (guard + end + early warmup + overlap)",
    "turn-aware+guard",
    True,
    overlap=True,
    end_signal=True,
    warm_early=True,
)
VARIANTS = [
    Variant("no cache", None, False),
    Variant("lru", "lru", False),
    Variant("lru + warmup", "lru", True),
    Variant("heat", "heat", False),
    Variant("heat + warmup (cachemesh before)", "heat", True),
    Variant("(a) turn-aware GPU tier", "turn-aware", False),
    Variant("(a) turn-aware + end signal", "turn-aware", False, end_signal=True),
    Variant("(a) turn-aware + LRU guard", "turn-aware+guard", False),
    Variant("(a) turn-aware + LRU guard + end", "turn-aware+guard", False, end_signal=True),
    Variant("(b) heat + early warmup", "heat", True, warm_early=True),
    Variant("(b) guard + end + warmup", "turn-aware+guard", True, end_signal=True),
    Variant("(b) guard + end + early warmup", "turn-aware+guard", True, end_signal=True, warm_early=True),
    Variant("(b) guard + end + warmup to GPU", "turn-aware+guard", True, end_signal=True, warm_to_gpu=True),
    Variant("(c) lru + layerwise overlap", "lru", False, overlap=True),
    Variant("(c) heat + warmup + overlap", "heat", True, overlap=True),
    Variant("(c) guard + end + overlap", "turn-aware+guard", False, overlap=True, end_signal=True),
    Variant(
        "(b+c) guard + end + GPU warmup + overlap",
        "turn-aware+guard",
        True,
        overlap=True,
        end_signal=True,
        warm_to_gpu=True,
    ),
    FINAL,
    Variant("oracle: Belady GPU tier", "opt", False),
    Variant("oracle: Belady GPU tier + overlap", "opt", False, overlap=True),
    Variant("oracle: arrivals known, lru", "lru", True, oracle=True),
    Variant(
        "oracle: arrivals known, turn-aware + end + overlap",
        "turn-aware",
        True,
        end_signal=True,
        oracle=True,
        overlap=True,
    ),
]
FLOOR = "bound: every seen block on the GPU"
INFERRED = replace(FINAL, name="cachemesh, sessions = first block", sessions=True)


def planner_config(c: EngineConfig, early: bool = False) -> PlannerConfig:
    # Defaults everywhere but the byte budget: the default 64 MiB/s with a 1 s burst is sized for
    # 16 KB entries and would admit one 64 MiB KV block a second. The budget is set to the fastest
    # link a warmup can use (L2), so it caps requests at what the links could move.
    lead = {"turn_lead_fraction": 0.0, "turn_lead_quantile": 0.0} if early else {}
    return PlannerConfig(
        budget_bytes_per_s=c.l2_gb_per_s * 1e9,
        default_entry_bytes=c.block_bytes,
        **lead,  # type: ignore[arg-type]
    )


@dataclass(frozen=True, slots=True)
class Row:
    workload: str
    variant: str
    requests: int
    ftl_mean_ms: float
    ftl_p50_ms: float
    ftl_p95_ms: float
    cold_start_ms: float
    hit_rate: float
    fragmentation: float
    health: float
    prefetch_commands: int
    planner_bytes_warmed: int
    bytes_loaded: int
    planner_wasted_share: float
    loaded_unread_share: float
    budget_dropped: int
    holds: str
    delta_t_ms: str


def health(latency_ms: float, hit_rate: float, fragmentation: float) -> float:
    """Seed §4.2: 0.5 (1 - latency / 2000 ms) + 0.3 hit rate + 0.2 (1 - fragmentation)."""
    return 0.5 * (1 - latency_ms / 2000) + 0.3 * hit_rate + 0.2 * (1 - fragmentation)


def summarise(workload: str, variant: str, run: EngineRun, planner_stats: dict[str, object] | None) -> Row:
    ftl = np.array([s.ftl_ms for s in run.served])
    blocks = sum(s.blocks for s in run.served)
    hits = sum(s.gpu_hits for s in run.served)
    cold = cold_start(run)
    frag = float(np.mean(run.fragmentation)) if run.fragmentation else 0.0
    hit_rate = hits / blocks if blocks else 0.0
    p = run.prefetch
    judged = p.read + p.evicted_unread
    deltas = [m.delta_t_ms for m in run.measured]
    st = planner_stats or {}
    return Row(
        workload=workload,
        variant=variant,
        requests=len(ftl),
        ftl_mean_ms=float(ftl.mean()),
        ftl_p50_ms=float(np.percentile(ftl, 50)),
        ftl_p95_ms=float(np.percentile(ftl, 95)),
        cold_start_ms=cold,
        hit_rate=hit_rate,
        fragmentation=frag,
        health=health(cold, hit_rate, frag),
        prefetch_commands=p.commands,
        planner_bytes_warmed=int(str(st.get("bytes_warmed", 0))),
        bytes_loaded=p.bytes_loaded,
        planner_wasted_share=float(str(st.get("wasted_share", 0.0))),
        loaded_unread_share=p.evicted_unread / judged if judged else 0.0,
        budget_dropped=int(str(st.get("budget_dropped", 0))),
        holds=", ".join(f"{k}: {v:,}" for k, v in run.holds.most_common(3)),
        delta_t_ms=_spread(deltas),
    )


def cold_start(run: EngineRun) -> float:
    """Mean FTL of the first 10% of requests (the engine starts empty)."""
    n = max(1, len(run.served) // 10)
    return float(np.mean([s.ftl_ms for s in run.served[:n]]))


def _spread(values: list[int]) -> str:
    if not values:
        return ""
    a = np.array(values)
    p5, p50, p95 = (np.percentile(a, q) for q in (5, 50, 95))
    return f"n={len(a)} p5={p5:.0f} p50={p50:.0f} p95={p95:.0f}"


def replay(
    config: EngineConfig, variant: Variant, requests: list[Request], seed: int, step: Callable[[], None]
) -> tuple[EngineRun, dict[str, object] | None]:
    from policies import make_policy

    config = replace(config, layerwise_overlap=variant.overlap)
    pc = planner_config(config, variant.warm_early)
    if variant.warm_to_gpu:
        pc = replace(pc, conversation_tier="l1")
    policy: Policy | None
    if variant.policy == "turn-aware":
        policy = TurnAwareRetention(config.gpu_blocks, turn_idle_ms=pc.turn_idle_ms)
    elif variant.policy == "turn-aware+guard":
        policy = LruGuarded(config.gpu_blocks, turn_idle_ms=pc.turn_idle_ms)
    elif variant.policy == "opt":  # reads the future: one on_hit / on_miss per block, in order
        assert not variant.warmup, "Belady cannot take warmup admissions it has not seen coming"
        future = [b for r in requests for b in r.blocks]
        policy = make_policy("opt", config.gpu_blocks, future=future)
    else:
        policy = make_policy(variant.policy, config.gpu_blocks, seed=seed) if variant.policy else None
    planner: WarmupPlanner | OracleWarmup | None = None
    if variant.oracle:
        planner = OracleWarmup(requests, config)
    elif variant.warmup:
        planner = WarmupPlanner(pc)
    engine = Engine(config, policy, planner, end_signal=variant.end_signal)
    if isinstance(planner, OracleWarmup):
        planner.engine = engine
    for r in requests:
        engine.serve(r)
        step()
    return engine.run, planner.stats() if planner is not None else None


def floor(config: EngineConfig, requests: list[Request]) -> EngineRun:
    """The bound no cache or predictor passes: every block seen before sits on the GPU (unbounded
    capacity, nothing to load), so a request pays only base + prefill of its never-seen suffix."""
    run = EngineRun()
    seen: set[int] = set()
    for r in requests:
        reused = next((i for i, b in enumerate(r.blocks) if b not in seen), len(r.blocks))
        tokens = max(0, r.input_tokens - reused * config.block_tokens)
        ftl = config.base_ms + tokens * config.prefill_ms_per_token
        run.served.append(Served(r.at_ms, ftl, len(r.blocks), reused, 0, 0, tokens, r.turn))
        seen.update(r.blocks)
    return run


def main() -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from sim.cli import limit_threads

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mooncake", type=Path, default=MOONCAKE)
    parser.add_argument("--mooncake-limit", type=int, default=None, help="first N requests only")
    parser.add_argument("--conversations", type=int, default=LongContext().conversations)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--regular-think-cv", type=float, default=0.1, help="think-time CV of the regular workload"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--only", action="append", default=None, help="run variants whose name holds this (repeatable)"
    )
    args = parser.parse_args()
    limit_threads()
    console = Console(width=200)
    config = EngineConfig()
    scenario = LongContext(conversations=args.conversations, seed=args.seed)
    regular = replace(scenario, think_cv=args.regular_think_cv)
    workloads = {
        "long-context": (long_context(scenario, config.block_tokens), VARIANTS),
        # The same conversations with regular pauses (agents, scripted clients): a turn's time can be
        # predicted, where the memoryless default leaves nothing to predict beyond the minimum pause.
        f"long-context, think cv {args.regular_think_cv:g}": (
            long_context(regular, config.block_tokens),
            VARIANTS,
        ),
        "mooncake": (mooncake(args.mooncake, args.mooncake_limit, False), VARIANTS),
    }
    inferred = mooncake(args.mooncake, args.mooncake_limit, True)
    describe(console, config, scenario, workloads["mooncake"][0], args.mooncake_limit)
    jobs = [(w, v, reqs) for w, (reqs, vs) in workloads.items() for v in vs] + [
        ("mooncake", INFERRED, inferred)
    ]
    if args.only:  # the baseline stays: every table is relative to it
        jobs = [j for j in jobs if j[1].name == BASELINE or any(o in j[1].name for o in args.only)]
    rows: list[Row] = []
    ftls: dict[tuple[str, str], list[float]] = {}
    for workload, (reqs, _) in workloads.items():
        rows.append(summarise(workload, FLOOR, floor(config, reqs), None))
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("replaying", total=sum(len(reqs) for _, _, reqs in jobs))
        for workload, variant, reqs in jobs:
            progress.update(task, description=f"{workload}: {variant.name}")
            run, stats = replay(config, variant, reqs, args.seed, lambda: progress.advance(task))
            rows.append(summarise(workload, variant.name, run, stats))
            ftls[(workload, variant.name)] = [s.ftl_ms for s in run.served]
    report(console, rows)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "warmup.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[f.name for f in fields(Row)])
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))
    plot(ftls, args.out / "warmup.png")
    console.print(f"wrote {args.out / 'warmup.csv'} and {args.out / 'warmup.png'}")


def describe(
    console: Console, c: EngineConfig, w: LongContext, moon: list[Request], limit: int | None
) -> None:
    def gib(blocks: int) -> str:
        return f"{blocks * c.block_bytes / 2**30:.0f} GiB"

    console.print(
        f"engine: KV {c.shape.bytes_per_token() // 1024} KiB/token, block {c.block_tokens} tokens = "
        f"{c.block_bytes / 2**20:.0f} MiB; GPU {c.gpu_blocks} blocks ({gib(c.gpu_blocks)}), "
        f"L2 {c.l2_blocks} ({gib(c.l2_blocks)}) at {c.l2_gb_per_s:g} GB/s "
        f"({c.load_ms('l2'):.2f} ms/block), L3 {c.l3_blocks} ({gib(c.l3_blocks)}) at "
        f"{c.l3_gb_per_s:g} GB/s ({c.load_ms('l3'):.1f} ms/block); prefill {c.prefill_ms_per_token} ms/token "
        f"({c.prefill_ms_per_token * c.block_tokens:.1f} ms/block); base {c.base_ms:g} ms "
        "(sources: bench/_warmup_engine.py EngineConfig)"
    )
    console.print(f"long-context: {asdict(w)}")
    span = (moon[-1].at_ms - moon[0].at_ms) / 1000 if moon else 0
    subset = f"first {limit} requests" if limit else "all requests"
    console.print(
        f"mooncake: {subset} ({len(moon):,}, {sum(len(r.blocks) for r in moon):,} blocks, {span:.0f} s)"
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def report(console: Console, rows: list[Row]) -> None:
    for workload in dict.fromkeys(r.workload for r in rows):
        mine = [r for r in rows if r.workload == workload]
        base = next(r for r in mine if r.variant == BASELINE)
        table = Table(title=f"{workload}: FTL per variant, ratio to no warmup ({BASELINE})")
        for h in ["variant", "mean ms", "p50 ms", "p95 ms", "vs no warmup", "Δ mean", "GPU hit",
                  "warmup cmds", "bytes warmed (planner)", "bytes loaded", "wasted (planner)",
                  "loaded, evicted unread"]:  # fmt: skip
            table.add_column(h, justify="left" if h == "variant" else "right")
        for r in mine:
            ratio = r.ftl_mean_ms / base.ftl_mean_ms
            table.add_row(
                r.variant, f"{r.ftl_mean_ms:,.0f}", f"{r.ftl_p50_ms:,.0f}", f"{r.ftl_p95_ms:,.0f}",
                f"{ratio:.2f}x", f"{100 * (ratio - 1):+.0f}%", _pct(r.hit_rate),
                f"{r.prefetch_commands:,}" if r.prefetch_commands else "",
                _gib(r.planner_bytes_warmed), _gib(r.bytes_loaded),
                _pct(r.planner_wasted_share) if r.prefetch_commands else "",
                _pct(r.loaded_unread_share) if r.bytes_loaded else "",
            )  # fmt: skip
        console.print(table)
        cm = next((r for r in mine if r.variant.startswith("cachemesh (")), None)
        if cm is not None:
            change = cm.ftl_mean_ms / base.ftl_mean_ms - 1
            verdict = "[green]met[/]" if change <= TARGET else "[red]NOT met[/]"
            console.print(
                f"{verdict}: cachemesh FTL {100 * change:+.0f}% vs no warmup ({base.ftl_mean_ms:,.0f} -> "
                f"{cm.ftl_mean_ms:,.0f} ms; target {100 * TARGET:.0f}%, seed reports 1,242 -> 463 ms, -63%)"
            )
        bound = next((r for r in mine if r.variant == FLOOR), None)
        if bound is not None:
            console.print(
                f"ceiling: no cache or predictor goes below {bound.ftl_mean_ms:,.0f} ms here "
                f"({100 * (bound.ftl_mean_ms / base.ftl_mean_ms - 1):+.0f}% vs {BASELINE}): each request "
                "still prefills the tokens never seen before"
            )
        cold = next((r for r in mine if r.variant == "no cache"), None)
        if cm is not None and cold is not None:
            # Seed §4.3's 1,242 ms baseline reuses no KV (39 of its 63 points are KV reuse; 21 come from
            # attending to the last 2,048 tokens only, which changes the output and is no cache's doing).
            change = cm.ftl_mean_ms / cold.ftl_mean_ms - 1
            verdict = "[green]met[/]" if change <= TARGET else "[red]NOT met[/]"
            console.print(
                f"{verdict} against the seed's own baseline (no KV reuse): cachemesh {100 * change:+.0f}% vs "
                f"no cache ({cold.ftl_mean_ms:,.0f} -> {cm.ftl_mean_ms:,.0f} ms)"
            )
        ab = Table(title=f"{workload}: A/B warmup off/on x lru/heat (docs/design.md §4.2)")
        for h in ["variant", "cold start ms", "GPU hit", "L2 fragmentation", "health",
                  "budget dropped", "planner holds", "Δt ms (WarmupMeasured)"]:  # fmt: skip
            ab.add_column(h, justify="left" if h in ("variant", "planner holds") else "right")
        for r in mine:
            if r.variant == "no cache":
                continue
            ab.add_row(
                r.variant, f"{r.cold_start_ms:,.0f}", _pct(r.hit_rate), f"{r.fragmentation:.3f}",
                f"{r.health:.3f}", f"{r.budget_dropped:,}" if r.prefetch_commands else "",
                r.holds, r.delta_t_ms or ("none" if r.prefetch_commands or r.holds else ""),
            )  # fmt: skip
        console.print(ab)
    console.print(
        "cold start = mean FTL of the first 10% of requests; health = 0.5 (1 - cold start / 2000) + 0.3 hit "
        "+ 0.2 (1 - fragmentation); fragmentation = services/tiers/l2/block_pool.py's formula over a scaled "
        "L2 pool (one 64 MiB KV block = one 2 KB pool block), mean over requests. 'wasted (planner)' is "
        "planner.stats()['wasted_share'] (it counts a warmed block read later as useful even when it was "
        "already resident); 'loaded, evicted unread' counts blocks the engine actually loaded. Δt needs a "
        "predictive warmup (drift / penetration / neighbours, inside the QPS/entropy band); conversation "
        "warmups carry none, so without one Δt is measured in the live service only."
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:,.0f} GiB" if n else ""


def plot(ftls: dict[tuple[str, str], list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(w for w, _ in ftls))
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.5), squeeze=False)
    for ax, workload in zip(axes[0], workloads, strict=True):
        for (w, variant), values in ftls.items():
            if w != workload:
                continue
            v = np.sort(np.asarray(values))
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=variant)
        ax.set_xscale("log")
        ax.set_xlabel("first-token latency (ms)")
        ax.set_ylabel("share of requests")
        ax.set_title(f"{workload}: FTL CDF")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
