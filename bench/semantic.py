"""Semantic match benchmark: a cache simulation over paraphrase pairs and near-miss traps, real MiniLM.

Data: ../shared/data/semantic/gptcache_mock_pairs.json (paraphrase pairs, positives) and the labelled
question pairs shipped by fow-cache (paraphrases and near repeats that should hit; negation, entity
swap, number/date and scope traps that should not). Each prompt is asked once, in a shuffled stream;
a miss (or an exploration) asks the model and caches the prompt with its answer. Two prompts share an
answer when a positive pair links them. Feedback reaches the learner only for served answers (at
`--feedback-rate`) and for explorations, as in production. The pairs are split in two halves by a hash
of their texts (a pair and its linked pairs stay together); defaults were set looking at the dev half
only. The dev half starts cold; the test half keeps the pooled model learned (from feedback only) on
the dev half, as a node's pool persists (`--cold-test` starts it cold).

Methods: fixed cosine thresholds (0.60 is GPTCache's default, 0.92 the tier node's), 0.92 with the
guards, and the learned decision (matching/) at δ = 1%, 2%, 5% with guards for each pooled model
(tail count bound, pooled sigmoid, pointwise sigmoid), and the tail at 2% without guards. The
"ceiling" rows are no method: per δ, the lowest fixed threshold (+ guards, grid 0.86-0.99) whose error
on that half is <= δ, picked knowing the labels: what any similarity rule could at best reach there.

    .venv/bin/python -m bench.semantic [--seeds 5] [--feedback-rate 0.5] [--candidates 3] [--embedder onnx]

Writes bench/results/semantic.{csv,md} and semantic.png; embeddings are cached in
bench/results/semantic_embeddings.npz (torch; semantic_embeddings_<backend>.npz for the others).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import random
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from infra.paths import shared_data_dir
from matching import guards
from matching.decision import Candidate, MatchDecision, Verdict
from matching.threshold import POOLED_MODELS, EntryThreshold, ThresholdLearner
from services.tiers.node.refine import unsettled

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results"
GPTCACHE = shared_data_dir() / "semantic" / "gptcache_mock_pairs.json"


@dataclass(frozen=True)
class Pair:
    source: str  # gptcache | fow
    category: str
    same_answer: bool
    a: str
    b: str


def load_pairs(gptcache: Path = GPTCACHE) -> tuple[list[Pair], int]:
    """The pairs, and how many GPTCache pairs were left out as ambiguous (see `_ambiguous`)."""
    from fow_cache.data import load_questions

    mock = [
        Pair("gptcache", "paraphrase", True, p["origin"], p["similar"])
        for p in json.loads(gptcache.read_text())
    ]
    drop = _ambiguous(mock)
    pairs = [p for i, p in enumerate(mock) if i not in drop]
    pairs += [Pair("fow", q["category"], bool(q["same_answer"]), q["a"], q["b"]) for q in load_questions()]
    return [p for p in pairs if p.a != p.b], len(drop)


def _content(text: str) -> frozenset[str]:
    return frozenset(w for w in re.findall(r"[a-z0-9_]+", text.lower()) if len(w) > 2)


def _ambiguous(pairs: list[Pair], jaccard: float = 0.5) -> set[int]:
    """GPTCache's mock set states many facts in several pairs ("the `download_config` parameter is used
    to ..." twice), so "a different pair" is no label of a different answer. Pairs sharing most of their
    words (Jaccard >= 0.5, by words, not embeddings) with another pair are left out rather than guessed."""
    words = [(_content(p.a), _content(p.b)) for p in pairs]
    drop: set[int] = set()
    for i in range(len(pairs)):
        for j in range(i + 1, len(pairs)):
            if any(len(x & y) >= jaccard * max(len(x | y), 1) for x in words[i] for y in words[j]):
                drop.update((i, j))
    return drop


def embed(
    texts: list[str],
    out: Path,
    backend: str = "torch",
    encode: Callable[[list[str]], np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Unit-norm MiniLM embeddings from `backend` (or from `encode`, named `backend`), cached per text
    in OUT/semantic_embeddings[_backend].npz (only texts not seen before are embedded)."""
    path = out / ("semantic_embeddings.npz" if backend == "torch" else f"semantic_embeddings_{backend}.npz")
    known: dict[str, np.ndarray] = {}
    if path.exists():
        cached = np.load(path)
        known = dict(zip(cached["texts"].tolist(), cached["emb"], strict=True))
    missing = [t for t in texts if t not in known]
    if missing:
        if encode is None:
            from services.tiers.edge.embedder import Embedder

            encode = Embedder(threads=2, backend=backend).embed_blocking  # type: ignore[arg-type]
        started = time.perf_counter()
        known.update(zip(missing, encode(missing), strict=True))
        print(f"embedded {len(missing)} texts in {time.perf_counter() - started:.0f} s")
        out.mkdir(parents=True, exist_ok=True)
        np.savez(path, texts=np.array(list(known)), emb=np.stack(list(known.values())))
    return {t: known[t] for t in texts}


class _Union:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def join(self, x: str, y: str) -> None:
        self.parent[self.find(x)] = self.find(y)


@dataclass
class World:
    """Who shares an answer with whom, which prompts are traps of which, and the two halves."""

    answer: dict[str, str]
    traps: dict[str, set[str]]
    source: dict[str, str]
    halves: tuple[list[str], list[str]]


def build_world(pairs: list[Pair]) -> World:
    same, linked = _Union(), _Union()
    traps: dict[str, set[str]] = defaultdict(set)
    source: dict[str, str] = {}
    for p in pairs:
        for t in (p.a, p.b):
            same.find(t)
            source.setdefault(t, p.source)
        linked.join(p.a, p.b)
        if p.same_answer:
            same.join(p.a, p.b)
        else:
            traps[p.a].add(p.b)
            traps[p.b].add(p.a)
    answer = {t: same.find(t) for t in same.parent}
    groups: dict[str, list[str]] = defaultdict(list)
    for t in answer:
        groups[linked.find(t)].append(t)
    halves: tuple[list[str], list[str]] = ([], [])
    for members in groups.values():
        half = int(hashlib.sha1(min(members).encode()).hexdigest(), 16) % 2
        halves[half].extend(sorted(members))
    return World(answer, traps, source, halves)


@dataclass
class Tally:
    requests: int = 0
    para: int = 0
    para_hit: int = 0
    para_by_source: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    trap: int = 0
    trap_served: int = 0
    served: int = 0
    wrong: int = 0
    explored: int = 0
    refined: int = 0


class Fixed:
    """One global cosine threshold, optionally behind the guards: the GPTCache/RedisVL design."""

    def __init__(self, threshold: float, use_guards: bool) -> None:
        self.threshold, self.use_guards = threshold, use_guards

    def choose(self, text: str, cands: list[Candidate]) -> tuple[Verdict, Candidate | None]:
        for c in cands:  # most similar first
            if c.similarity < self.threshold:
                break
            if not self.use_guards or guards.check(c.text, text) is None:
                return Verdict.SERVE, c
        return Verdict.MISS, None

    def feedback(self, c: Candidate, correct: bool, explored: bool = False) -> None:
        pass

    def serve_from(self, c: Candidate) -> float:
        return self.threshold


class Learned:
    def __init__(
        self, delta: float, use_guards: bool, rng: random.Random, learner: ThresholdLearner | None = None
    ) -> None:
        learner = learner or ThresholdLearner(delta=delta)
        self.decision = MatchDecision(learner, rng.random, use_guards=use_guards)

    def choose(self, text: str, cands: list[Candidate]) -> tuple[Verdict, Candidate | None]:
        result = self.decision.best_candidate(text, cands)
        return result.verdict, result.candidate

    def feedback(self, c: Candidate, correct: bool, explored: bool = False) -> None:
        self.decision.feedback(c, correct, explored=explored)

    def serve_from(self, c: Candidate) -> float:
        return self.decision.learner_for(c.group or "").thresholds(c.state)[0]


def simulate(
    method: Fixed | Learned,
    stream: list[str],
    vectors: dict[str, np.ndarray],
    world: World,
    rng: random.Random,
    feedback_rate: float,
    top_k: int,
    screen: dict[str, np.ndarray] | None = None,
    band: float = 0.0,
) -> Tally:
    """`screen`: the cheap model's vectors of the requests (the tier node's screened lookups,
    services/tiers/node/refine.py): the nearest entries by them, re-scored with `vectors` (the precise
    model, which also embedded the entries) when one lies within `band` of its threshold."""
    tally = Tally()
    texts: list[str] = []
    states: list[EntryThreshold] = []
    matrix = np.zeros((len(stream), next(iter(vectors.values())).shape[0]), dtype=np.float32)
    cached_answers: set[str] = set()

    def precisely(c: Candidate) -> Candidate:
        # Feedback is embedded by the precise model (the node's POST /v1/feedback): its similarity.
        return c if screen is None else replace(c, similarity=float(matrix[int(c.key)] @ vectors[text]))

    for text in stream:
        tally.requests += 1
        mine = world.answer[text]
        is_para = mine in cached_answers
        is_trap = not is_para and any(world.answer[t] in cached_answers for t in world.traps.get(text, ()))
        verdict, chosen = Verdict.MISS, None
        if texts:
            sims = matrix[: len(texts)] @ (vectors if screen is None else screen)[text]
            order = np.argsort(-sims)[:top_k]
            cands = [Candidate(str(i), texts[i], float(sims[i]), state=states[i]) for i in order.tolist()]
            if screen is not None and unsettled(
                [c.similarity for c in cands], [method.serve_from(c) for c in cands], band
            ):
                tally.refined += 1
                precise = matrix[: len(texts)] @ vectors[text]
                cands = [Candidate(c.key, c.text, float(precise[int(c.key)]), state=c.state) for c in cands]
                cands.sort(key=lambda c: -c.similarity)
            verdict, chosen = method.choose(text, cands)
        if verdict is Verdict.SERVE and chosen is not None:
            correct = world.answer[chosen.text] == mine
            tally.served += 1
            tally.wrong += not correct
            tally.trap_served += is_trap
            if is_para:
                tally.para_hit += correct
            if rng.random() < feedback_rate:
                method.feedback(precisely(chosen), correct)
        else:
            if verdict is Verdict.EXPLORE and chosen is not None:
                tally.explored += 1
                method.feedback(precisely(chosen), world.answer[chosen.text] == mine, explored=True)
            matrix[len(texts)] = vectors[text]
            texts.append(text)
            states.append(EntryThreshold())
            cached_answers.add(mine)
        tally.para += is_para
        tally.trap += is_trap
        if is_para:
            by = tally.para_by_source[world.source[text]]
            by[0] += 1
            by[1] += verdict is Verdict.SERVE and chosen is not None and world.answer[chosen.text] == mine
    return tally


METHODS: list[tuple[str, float, bool, bool, str]] = [  # name, threshold or δ, learned, guards, pooled model
    ("fixed 0.60", 0.60, False, False, ""),
    ("fixed 0.80", 0.80, False, False, ""),
    ("fixed 0.92", 0.92, False, False, ""),
    ("fixed 0.92 + guards", 0.92, False, True, ""),
    ("learned tail δ=2%, no guards", 0.02, True, False, "tail"),
    *(
        (f"learned {model} δ={100 * delta:.0f}% + guards", delta, True, True, model)
        for model in POOLED_MODELS
        for delta in (0.01, 0.02, 0.05)
    ),
]


def run(args: argparse.Namespace, console: Console) -> list[dict[str, object]]:
    pairs, dropped = load_pairs(args.gptcache)
    console.print(f"{len(pairs)} pairs ({dropped} ambiguous GPTCache pairs left out)")
    world = build_world(pairs)
    texts = sorted(world.answer)
    vectors = embed(texts, args.out, args.embedder)
    args.screen_vectors = None if args.screen == "none" else embed(texts, args.out, args.screen)
    rows: list[dict[str, object]] = []
    # The test half continues with the pool each seed learned on the dev half (its entries are new):
    # in production the pooled model persists, and a half of ~1,000 prompts is short for a cold start.
    pools: dict[tuple[str, int], ThresholdLearner] = {}
    for half_name, half in zip(("dev", "test"), world.halves, strict=True):
        for name, param, learned, use_guards, model in METHODS:
            if args.methods and not any(m in name for m in args.methods.split(",")):
                continue

            def make(
                seed: int,
                name: str = name,
                param: float = param,
                learned: bool = learned,
                use_guards: bool = use_guards,
                model: str = model,
            ) -> Fixed | Learned:
                if not learned:
                    return Fixed(param, use_guards)
                pool = pools.get((name, seed)) if args.warm_test else None
                pool = pool or ThresholdLearner(delta=param, model=model)  # type: ignore[arg-type]
                method = Learned(param, use_guards, random.Random(seed + 1000), pool)
                pools[(name, seed)] = method.decision.learner
                return method

            rows.append(measure(half_name, half, name, make, vectors, world, args))
            console.print(f"{half_name} {name}: {float(str(rows[-1]['seconds'])):.1f} s", style="dim")
        rows += hindsight(half_name, half, vectors, world, args)
    return rows


def measure(
    half_name: str,
    half: list[str],
    name: str,
    make: Callable[[int], Fixed | Learned],
    vectors: dict[str, np.ndarray],
    world: World,
    args: argparse.Namespace,
) -> dict[str, object]:
    """One method over `args.seeds` shuffles of a half, as one table row."""
    total = Tally()
    started = time.perf_counter()
    for seed in range(args.seeds):
        rng = random.Random(seed)
        stream = list(half)
        rng.shuffle(stream)
        t = simulate(
            make(seed),
            stream,
            vectors,
            world,
            rng,
            args.feedback_rate,
            args.candidates,
            getattr(args, "screen_vectors", None),  # bench.embedders' arguments have no screen
            getattr(args, "band", 0.0),
        )
        keys = (
            "requests",
            "para",
            "para_hit",
            "trap",
            "trap_served",
            "served",
            "wrong",
            "explored",
            "refined",
        )
        for k in keys:
            setattr(total, k, getattr(total, k) + getattr(t, k))
        for src, (n, hit) in t.para_by_source.items():
            total.para_by_source[src][0] += n
            total.para_by_source[src][1] += hit
    return {
        "half": half_name,
        "method": name,
        "requests": total.requests,
        "para_hit": total.para_hit / max(total.para, 1),
        "gptcache_hit": _ratio(total.para_by_source.get("gptcache")),
        "fow_hit": _ratio(total.para_by_source.get("fow")),
        "traps_served": total.trap_served / max(total.trap, 1),
        "wrong": total.wrong / max(total.served, 1),
        "served": total.served / max(total.requests, 1),
        "explored": total.explored / max(total.requests, 1),
        "refined": total.refined / max(total.requests, 1),
        "seconds": time.perf_counter() - started,
    }


def _fixed_with_guards(threshold: float, _seed: int) -> Fixed:
    return Fixed(threshold, use_guards=True)


HINDSIGHT_GRID = [round(0.86 + 0.01 * i, 2) for i in range(14)]  # 0.86 .. 0.99


def hindsight(
    half_name: str, half: list[str], vectors: dict[str, np.ndarray], world: World, args: argparse.Namespace
) -> list[dict[str, object]]:
    """Not a method, a ceiling: per δ, the lowest fixed threshold (+ guards) whose wrong/served on this
    very half is <= δ, chosen knowing every label. No similarity rule can hit more at that error."""
    grid = {
        t: measure(
            half_name,
            half,
            f"hindsight fixed {t:.2f} + guards",
            partial(_fixed_with_guards, t),
            vectors,
            world,
            args,
        )
        for t in HINDSIGHT_GRID
    }
    rows = []
    for delta in (0.01, 0.02, 0.05):
        ok = [t for t, r in grid.items() if float(str(r["wrong"])) <= delta]
        if ok:
            row = dict(grid[min(ok)])
            row["method"] = f"ceiling δ={100 * delta:.0f}%: {row['method']}"
        else:
            row = {**grid[HINDSIGHT_GRID[-1]], "method": f"ceiling δ={100 * delta:.0f}%: none <= δ"}
            row.update(para_hit=0.0, gptcache_hit=0.0, fow_hit=0.0, traps_served=0.0, wrong=0.0, served=0.0)
        rows.append(row)
    return rows


def _ratio(cell: list[int] | None) -> float:
    return cell[1] / cell[0] if cell and cell[0] else float("nan")


HEADER = [
    "method",
    "para hit",
    "gptcache hit",
    "fow hit",
    "traps served",
    "wrong/served",
    "served",
    "explored",
    "re-scored",
]


def _cells(r: dict[str, object]) -> list[str]:
    def pct(k: str) -> str:
        return f"{100 * float(str(r[k])):.1f}"

    keys = ("para_hit", "gptcache_hit", "fow_hit", "traps_served", "wrong", "served", "explored", "refined")
    return [str(r["method"]), *(pct(k) for k in keys)]


def report(rows: list[dict[str, object]], args: argparse.Namespace, console: Console) -> None:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    with (out / "semantic.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    md = ["# Semantic match benchmark", ""]
    for half in ("dev", "test"):
        mine = [r for r in rows if r["half"] == half]
        title = (
            f"{half} half: {mine[0]['requests']:,} requests over {args.seeds} seeds, feedback "
            f"{100 * args.feedback_rate:.0f}% of served (%; target wrong <= δ, traps <= 5, para hit >= 60)"
        )
        table = Table(*HEADER, title=title)
        body = [_cells(r) for r in mine]
        for row in body:
            table.add_row(*row)
        console.print(table)
        md += [f"**{title}**", "", "| " + " | ".join(HEADER) + " |", "|---|" + "---:|" * (len(HEADER) - 1)]
        md += ["| " + " | ".join(row) + " |" for row in body] + [""]
    (out / "semantic.md").write_text("\n".join(md))
    plot(rows, out / "semantic.png")
    console.print(f"wrote {out / 'semantic.csv'}, {out / 'semantic.md'} and {out / 'semantic.png'}")


def plot(rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, half in zip(axes, ("dev", "test"), strict=True):
        for r in (r for r in rows if r["half"] == half):
            x, y = 100 * float(str(r["wrong"])), 100 * float(str(r["para_hit"]))
            ax.scatter(x, y, marker="o" if "learned" in str(r["method"]) else "s")
            ax.annotate(str(r["method"]), (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("wrong answers among served (%)")
        ax.set_title(f"{half} half")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("true paraphrases hit (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gptcache", type=Path, default=GPTCACHE)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--feedback-rate", type=float, default=0.5, help="share of served answers rated")
    parser.add_argument(
        "--cold-test", dest="warm_test", action="store_false", help="start the test half's learner cold too"
    )
    parser.add_argument("--candidates", type=int, default=3, help="nearest entries considered per request")
    parser.add_argument("--embedder", default="torch", choices=("torch", "onnx", "onnx-int8"))
    parser.add_argument(
        "--screen",
        default="none",
        choices=("none", "onnx-int8"),
        help="screen requests with this cheaper model; --embedder re-scores near a threshold",
    )
    parser.add_argument("--band", type=float, default=0.04, help="the screen's band (services/tiers)")
    parser.add_argument("--methods", default="", help="comma-separated name parts: run only those methods")
    args = parser.parse_args()
    console = Console(width=140)
    report(run(args, console), args, console)


if __name__ == "__main__":
    main()
