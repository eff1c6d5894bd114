"""The tier node's shipped semantic decision on any labelled pair file, as a black box.

    python -m bench.semantic_pairs --pairs FILE.jsonl [--n 4000] [--seed 0] --out OUT.json

Each line of FILE is `{"a": str, "b": str, "label": 0|1}`. Protocol: a fixed random sample of `n` pairs;
every `a` is put through the node's API with an answer of its own; every `b` is looked up once, in
shuffled order. A served answer is correct only when the pair's label is 1 and the answer is that
pair's own `a` (or an `a` of identical text), or when it was cached for the very text asked (the public
sets reuse sentences: a `b` may be another pair's `a` word for word, and its answer is then the
answer to that question whatever the pair's label). The truth is fed back (`POST /v1/feedback`) for half of
the served answers, chosen at random, and for every exploration the node asks for. The node runs
in-process (its API app over httpx's ASGI transport, the default embedder, L1 large enough to hold
every entry), first in its shipped configuration (top level of OUT), then learned at δ = 0.01, 0.02
and 0.05 (`"by_delta"`). Each row: served, correct, wrong, positives, recall (correct answers to
duplicate pairs / positives: a repeat served for a pair labelled 0 is correct but no recall),
wrong_rate (wrong / served), its 95% Wilson upper bound, and `ceiling_recall`: what the best fixed
threshold (with the guards) chosen knowing the labels reaches with wrong <= δ under the same protocol
(0 where none does; for the shipped row, δ = 0.02), and `ceiling_recall_bounded`: the same where the
threshold's 95% upper bound on wrong is <= δ (what a rule that must show its bound reaches knowing
every label from the start: the price of the confidence alone). Beside them, `served_repeats` /
`wrong_repeats`: answers served because the asked `b` is itself the text of a cached `a` (any cache
serves these), and `by_similarity`, the same counts without those repeats: the semantic decision's own;
`explored`, the misses the node offered for a label, and `verified`, those that were would-be hits (the
exploration budget's price in hits).
Prints the table, draws OUT's .png beside it.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
from pathlib import Path
from typing import Annotated, Any

import httpx
import numpy as np
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from matching import guards
from services.runtime.breaker import LatencyBreaker
from services.tiers.edge.api import create_app
from services.tiers.edge.embedder import Embedder
from services.tiers.l1.cache import L1Cache, monotonic_ms
from services.tiers.node.matcher import Matcher
from services.tiers.node.outbox import Outbox
from services.tiers.node.tiered import TieredCache
from services.tiers.settings import TiersSettings

DELTAS = (0.01, 0.02, 0.05)
SHIPPED_DELTA = 0.02  # the δ the shipped row's ceiling is read at
MODEL = "pairs"


def wilson_upper(wrong: int, served: int, z: float = 1.96) -> float | None:
    """The 95% upper confidence bound of a rate of `wrong` in `served` (None with nothing served)."""
    if served == 0:
        return None
    p = wrong / served
    centre = p + z * z / (2 * served)
    spread = z * math.sqrt(p * (1 - p) / served + z * z / (4 * served * served))
    return min(1.0, (centre + spread) / (1 + z * z / served))


def read_pairs(path: Path, n: int, seed: int) -> list[tuple[str, str, int]]:
    pairs = []
    with path.open() as fh:
        for i, line in enumerate(fh):
            if not line.strip():
                continue
            row = json.loads(line)
            a, b, label = row.get("a"), row.get("b"), row.get("label")
            if not isinstance(a, str) or not isinstance(b, str) or label not in (0, 1):
                raise typer.BadParameter(f"{path}:{i + 1}: needs a and b (text) and label 0 or 1")
            if a.strip() and b.strip():
                pairs.append((a, b, int(label)))
    rng = random.Random(seed)
    return rng.sample(pairs, min(n, len(pairs)))


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def correct_answer(pairs: list[tuple[str, str, int]], asked: int, served: int) -> bool:
    """The pair's own answer when it is a duplicate (or the answer of an `a` of the same text), or the
    answer cached for the very text asked (another pair's `a` that is `b` word for word)."""
    a, b, label = pairs[asked]
    served_text = _norm(pairs[served][0])
    return (label == 1 and (served == asked or served_text == _norm(a))) or served_text == _norm(b)


def node_settings(delta: float | None) -> TiersSettings:
    """The shipped configuration (`delta` None), or the learned decision at `delta`."""
    shipped = TiersSettings(l2_pages=0, max_text_chars=20_000)
    if delta is None:
        return shipped
    return shipped.model_copy(update={"match_rule": "learned", "match_delta": delta})


def shipped_rule(settings: TiersSettings) -> str:
    if settings.match_rule == "learned":
        return f"learned δ = {settings.match_delta}"
    return f"{settings.default_similarity_tolerance} + guards"


def node(settings: TiersSettings, entries: int) -> TieredCache:
    """One node as the service builds it, its L1 large enough for every entry, without L2 and L3."""
    return TieredCache(
        l1=L1Cache(
            dim=settings.embedding_dim,
            capacity_bytes=max(settings.l1_capacity_bytes, entries * 8192),
            max_entries=max(settings.l1_max_entries, 2 * entries),
            default_similarity_tolerance=settings.default_similarity_tolerance,
        ),
        l2=None,
        l3=None,
        outbox=Outbox(clock=monotonic_ms),
        breaker=LatencyBreaker(clock=monotonic_ms),
        node_id="pairs",
        matcher=Matcher(
            delta=settings.match_delta if settings.match_rule == "learned" else None,
            default_similarity_tolerance=settings.default_similarity_tolerance,
            explore_rate=settings.match_explore_rate,
            verify_rate=settings.match_verify_rate,
        ),
    )


async def run_protocol(
    pairs: list[tuple[str, str, int]], delta: float | None, embedder: Embedder, seed: int, progress: Progress
) -> dict[str, Any]:
    settings = node_settings(delta)
    app = create_app(node(settings, len(pairs)), settings, embedder)
    rng = random.Random(seed + 1)
    served = correct = wrong = explored = verified = repeats = wrong_repeats = found = 0
    label = f"shipped ({shipped_rule(settings)})" if delta is None else f"δ = {delta}"
    task = progress.add_task(f"{label}: put and ask", total=2 * len(pairs))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as http:
        for i, (a, _, _) in enumerate(pairs):
            body = {"value": {"text": f"answer {i}"}, "model": MODEL, "embed_text": a}
            (await http.put(f"/v1/entries/a{i}", json=body)).raise_for_status()
            progress.advance(task)
        order = list(range(len(pairs)))
        rng.shuffle(order)
        for i in order:
            b = pairs[i][1]
            got = (await http.post("/v1/lookup", json={"text": b, "model": MODEL})).json()
            progress.advance(task)
            if got.get("hit"):
                served += 1
                j = int(str(got["key"])[1:])
                ok = correct_answer(pairs, i, j)
                correct += ok
                found += ok and pairs[i][2] == 1
                wrong += not ok
                # The same text as another pair's `a`: served as a repeat, not by similarity (any cache
                # serves it, and it is that question's own answer).
                if _norm(pairs[j][0]) == _norm(b):
                    repeats += 1
                    wrong_repeats += not ok
                if rng.random() < 0.5:
                    fb = {"key": got["key"], "text": b, "correct": ok}
                    (await http.post("/v1/feedback", json=fb)).raise_for_status()
            elif got.get("explore_key"):
                explored += 1
                verified += got.get("miss_rule") == "verify"
                key = str(got["explore_key"])
                fb = {
                    "key": key,
                    "text": b,
                    "correct": correct_answer(pairs, i, int(key[1:])),
                    "explored": True,
                }
                (await http.post("/v1/feedback", json=fb)).raise_for_status()
    positives = sum(label for _, _, label in pairs)
    return {
        "served": served,
        "correct": correct,
        "wrong": wrong,
        "explored": explored,  # the model asked to label a candidate: the exploration budget spent
        "verified": verified,  # of those, would-be hits (the rest were misses anyway)
        "positives": positives,
        "recall": found / positives if positives else 0.0,
        "wrong_rate": wrong / served if served else 0.0,
        "wrong_rate_upper95": wilson_upper(wrong, served),
        "served_repeats": repeats,  # of `served`: the asked text itself was cached (another pair's `a`)
        "wrong_repeats": wrong_repeats,
        "by_similarity": {  # what the semantic decision served: repeats of a cached text left out
            "served": served - repeats,
            "wrong": wrong - wrong_repeats,
            "wrong_rate": (wrong - wrong_repeats) / (served - repeats) if served > repeats else 0.0,
            "wrong_rate_upper95": wilson_upper(wrong - wrong_repeats, served - repeats),
        },
    }


def ceilings(pairs: list[tuple[str, str, int]], embedder: Embedder) -> dict[float, tuple[float, float]]:
    """Per δ, (the most correct answers to duplicates / positives any fixed threshold with the guards
    serves with wrong <= δ * served, the same where the 95% upper bound of its wrong rate is <= δ),
    knowing every label: each `b` gets its most similar `a` the guards let through. The second is
    what a rule that must show its bound could reach if it knew all the labels from the start."""
    a = embedder.embed_blocking([p[0] for p in pairs])
    b = embedder.embed_blocking([p[1] for p in pairs])
    sims = b @ a.T
    best: list[tuple[float, bool, bool]] = []  # (similarity, correct, correct for a duplicate pair)
    for i in range(len(pairs)):
        for j in np.argsort(-sims[i])[:10]:
            if guards.check(pairs[int(j)][0], pairs[i][1]) is None:
                ok = correct_answer(pairs, i, int(j))
                best.append((float(sims[i, j]), ok, ok and pairs[i][2] == 1))
                break
    return hindsight(best, sum(label for _, _, label in pairs))


def hindsight(best: list[tuple[float, bool, bool]], positives: int) -> dict[float, tuple[float, float]]:
    """`ceilings` from each asked text's best candidate (similarity, correct, correct for a duplicate)."""
    positives = positives or 1
    out = {}
    for delta in (*DELTAS, SHIPPED_DELTA):
        top = sure = 0.0
        for t in np.arange(0.70, 1.0001, 0.0025):
            chosen = [(ok, found) for s, ok, found in best if s >= t]
            wrong = len(chosen) - sum(ok for ok, _ in chosen)
            recall = sum(found for _, found in chosen) / positives
            if chosen and wrong <= delta * len(chosen):
                top = max(top, recall)
            if chosen and (wilson_upper(wrong, len(chosen)) or 1.0) <= delta:
                sure = max(sure, recall)
        out[delta] = (top, sure)
    return out


def main(
    pairs_file: Annotated[Path, typer.Option("--pairs", help="JSON lines of {a, b, label}")],
    out: Annotated[Path, typer.Option("--out", help="Where the results go (JSON)")],
    n: Annotated[int, typer.Option("--n", help="Pairs sampled")] = 4000,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    console = Console()
    pairs = read_pairs(pairs_file, n, seed)
    s = node_settings(None)
    embedder = Embedder(
        threads=s.embedder_threads, backend=s.embedder, max_call_texts=s.embedder_max_call_texts
    )
    with Progress(console=console) as progress:
        shipped = asyncio.run(run_protocol(pairs, None, embedder, seed, progress))
        by_delta = {str(d): asyncio.run(run_protocol(pairs, d, embedder, seed, progress)) for d in DELTAS}
    ceiling = ceilings(pairs, embedder)
    shipped["ceiling_recall"], shipped["ceiling_recall_bounded"] = ceiling[SHIPPED_DELTA]
    for d in DELTAS:
        by_delta[str(d)]["ceiling_recall"], by_delta[str(d)]["ceiling_recall_bounded"] = ceiling[d]
    result = {"pairs": str(pairs_file), "n": len(pairs), "seed": seed, **shipped, "by_delta": by_delta}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"{pairs_file.name}: {len(pairs)} pairs, {shipped['positives']} duplicates")
    for col in (
        "rule",
        "served",
        "recall",
        "wrong",
        "wrong ≤ (95%)",
        "by similarity: served, wrong",
        "ceiling recall",
        "bounded ceiling",
    ):
        table.add_column(col, justify="right")
    rows = [(f"shipped ({shipped_rule(s)})", shipped)]
    rows += [(f"learned δ = {d}", by_delta[str(d)]) for d in DELTAS]
    for name, r in rows:
        upper = r["wrong_rate_upper95"]
        table.add_row(
            name,
            str(r["served"]),
            f"{r['recall']:.1%}",
            f"{r['wrong_rate']:.1%}",
            "-" if upper is None else f"{upper:.1%}",
            f"{r['by_similarity']['served']}, {r['by_similarity']['wrong_rate']:.1%}",
            f"{r['ceiling_recall']:.1%}",
            f"{r['ceiling_recall_bounded']:.1%}",
        )
    console.print(table)
    plot(rows, out.with_suffix(".png"), pairs_file.name)
    console.print(f"wrote {out} and {out.with_suffix('.png')}")


def plot(rows: list[tuple[str, dict[str, Any]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in rows:
        ax.scatter(100 * r["wrong_rate"], 100 * r["recall"], label=name)
        ax.scatter(0, 100 * r["ceiling_recall"], marker="x", color="grey")
        ax.scatter(0, 100 * r["ceiling_recall_bounded"], marker="+", color="black")
    ax.set_xlabel("wrong among served (%)")
    ax.set_ylabel("true duplicates served (%)")
    ax.set_title(f"{title} (x: hindsight ceiling, +: its 95% bound <= δ)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    typer.run(main)
