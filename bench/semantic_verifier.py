"""Does a pair verifier earn its place over the cosine alone? Leave-one-data-set-out.

    python -m bench.semantic_verifier [--n 1500] [--seed 0] [--zone 0.7] [--out bench/results]

Data: the training sets of ../shared/data/semantic/train/ (graded ones made binary: STS-B >= 4 same,
<= 2 different; SICK >= 4.5 / <= 3; the rest by their own label), and the dev pairs (fow-cache's
labelled questions with GPTCache's paraphrases), `n` pairs of each, deduplicated on the normalised
pair. Each text is embedded by the node's default embedder (onnx-int8). The verifier acts in the grey
zone only (cosine >= `zone`, the learned decision's explore floor, and no guard vetoes), so that is
where it is judged: for each set, matching/verifier.py's logistic model is fitted on the other sets
(each set weighted equally) and scores the held-out one; beside it the cosine alone, and a cautious
fit that keeps only the signals whose direction agrees on every training set (each signal's own AUC
above 0.52 on all of them, or below 0.48 on all). Columns: AUC in the zone, and the recall a
threshold chosen in hindsight reaches with at most 5% wrong. A second fit on
the sets whose licences allow shipping weights (PAWS, STS-B) is judged on all the others. The verifier
earns its place only if it beats the cosine on every held-out set. Writes semantic_verifier.json and
.png into OUT.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import track
from rich.table import Table

from bench._pair_verifier import FEATURES, Verifier, auc, features
from bench.semantic import GPTCACHE, embed
from matching import guards

TRAIN = Path(__file__).resolve().parents[2] / "shared" / "data" / "semantic" / "train"
PERMISSIVE = ("paws_wiki", "stsb")
BACKEND = "onnx-int8"
DELTA = 0.05


def _binary(name: str, label: float) -> int | None:
    if name == "stsb":
        return 1 if label >= 4 else 0 if label <= 2 else None
    if name == "sick":
        return 1 if label >= 4.5 else 0 if label <= 3 else None
    return int(label) if label in (0, 1) else None


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def load_sets(n: int, seed: int) -> dict[str, list[tuple[str, str, int]]]:
    sets: dict[str, list[tuple[str, str, int]]] = {}
    for path in sorted(TRAIN.glob("*.jsonl")):
        rows = []
        for line in path.open():
            row = json.loads(line)
            label = _binary(path.stem, float(row["label"]))
            if label is not None and row["a"].strip() and row["b"].strip():
                rows.append((row["a"], row["b"], label))
        sets[path.stem] = rows
    from fow_cache.data import load_questions

    dev = [(p["origin"], p["similar"], 1) for p in json.loads(GPTCACHE.read_text())]
    dev += [(q["a"], q["b"], int(bool(q["same_answer"]))) for q in load_questions()]
    sets["dev"] = dev
    rng = random.Random(seed)
    seen: set[tuple[str, str]] = set()
    out: dict[str, list[tuple[str, str, int]]] = {}
    for name, rows in sets.items():
        kept = []
        for a, b, label in rng.sample(rows, len(rows)):
            key = (_norm(a), _norm(b))
            if key[0] == key[1] or key in seen or key[::-1] in seen:
                continue
            seen.add(key)
            kept.append((a, b, label))
            if len(kept) == n:
                break
        out[name] = kept
    return out


def hindsight_recall(scores: np.ndarray, labels: np.ndarray, positives: int, delta: float) -> float:
    """The most positives a threshold on `scores` serves with wrong/served <= delta (0 if none)."""
    order = np.argsort(-scores, kind="mergesort")
    y = labels[order].astype(bool)
    correct = np.cumsum(y)
    served = np.arange(1, len(y) + 1)
    ok = (served - correct) <= delta * served
    return float(correct[ok].max() / positives) if ok.any() and positives else 0.0


def _row(
    verifier_scores: np.ndarray,
    cosine: np.ndarray,
    y: np.ndarray,
    positives: int,
    cautious: np.ndarray | None = None,
) -> dict[str, Any]:
    row = {
        "zone_pairs": len(y),
        "zone_positives": int(y.sum()),
        "auc_cosine": auc(cosine, y),
        "auc_verifier": auc(verifier_scores, y),
        "recall_cosine": hindsight_recall(cosine, y, positives, DELTA),
        "recall_verifier": hindsight_recall(verifier_scores, y, positives, DELTA),
    }
    if cautious is not None:
        row["auc_cautious"] = auc(cautious, y)
    return row


def consistent(data: dict[str, dict[str, np.ndarray]], names: list[str]) -> list[int]:
    """The cosine and the signals whose direction (own AUC > 0.52, or < 0.48) agrees on every set."""
    cols = [0]
    for j in range(1, len(FEATURES)):
        own = [auc(data[m]["x"][:, j], data[m]["y"]) for m in names]
        if all(v > 0.52 for v in own) or all(v < 0.48 for v in own):
            cols.append(j)
    return cols


def main(
    n: Annotated[int, typer.Option(help="pairs per data set")] = 1500,
    seed: int = 0,
    zone: Annotated[float, typer.Option(help="the lowest cosine the verifier sees")] = 0.7,
    out: Path = Path("bench/results"),
) -> None:
    console = Console()
    sets = load_sets(n, seed)
    texts = sorted({t for rows in sets.values() for a, b, _ in rows for t in (a, b)})
    vectors = embed(texts, out, backend=BACKEND)
    data: dict[str, dict[str, np.ndarray]] = {}
    for name, rows in sets.items():
        x, y, cos = [], [], []
        for a, b, label in track(rows, description=f"pair signals {name}", console=console):
            s = float(np.dot(vectors[a], vectors[b]))
            if s < zone or guards.check(a, b) is not None:
                continue
            x.append(features(a, b, s))
            y.append(label)
            cos.append(s)
        data[name] = {
            "x": np.array(x).reshape(-1, len(FEATURES)),
            "y": np.array(y, dtype=np.int64),
            "cos": np.array(cos),
            "positives": np.array(sum(label for _, _, label in rows)),
        }

    def fit(names: list[str], cols: list[int] | None = None) -> Verifier:
        cols = cols if cols is not None else list(range(len(FEATURES)))
        x = np.vstack([data[m]["x"][:, cols] for m in names])
        y = np.concatenate([data[m]["y"] for m in names])
        w = np.concatenate([np.full(len(data[m]["y"]), 1.0 / max(len(data[m]["y"]), 1)) for m in names])
        return Verifier.fit(x, y, w * len(y) / w.sum())

    result: dict[str, Any] = {"n": n, "seed": seed, "zone": zone, "delta": DELTA, "loo": {}, "permissive": {}}
    names = list(data)
    for held in names:
        others = [m for m in names if m != held]
        model = fit(others)
        cols = consistent(data, others)
        cautious = fit(others, cols).score_features(data[held]["x"][:, cols])
        d = data[held]
        result["loo"][held] = _row(
            model.score_features(d["x"]), d["cos"], d["y"], int(d["positives"]), cautious
        )
        result["loo"][held]["cautious_signals"] = [FEATURES[j] for j in cols]
    shipped = fit([m for m in PERMISSIVE if m in data])
    for held in names:
        if held in PERMISSIVE:
            continue
        d = data[held]
        result["permissive"][held] = _row(
            shipped.score_features(d["x"]), d["cos"], d["y"], int(d["positives"])
        )
    result["permissive_weights"] = shipped.to_dict()
    wins = [
        max(r["auc_verifier"], r["auc_cautious"]) > r["auc_cosine"]
        for r in result["loo"].values()
        if r["zone_positives"]
    ]
    result["earns_its_place"] = bool(wins) and all(wins)

    for title, rows in (
        ("leave one data set out", result["loo"]),
        ("fitted on PAWS + STS-B", result["permissive"]),
    ):
        table = Table(title=f"verifier vs cosine in the grey zone (cosine >= {zone}, guards pass): {title}")
        for col in (
            "held-out set",
            "zone pairs",
            "positives",
            "AUC cosine",
            "AUC verifier",
            f"recall@{DELTA:.0%} cosine",
            f"recall@{DELTA:.0%} verifier",
            "AUC cautious",
        ):
            table.add_column(col, justify="right")
        for name, r in rows.items():
            table.add_row(
                name,
                str(r["zone_pairs"]),
                str(r["zone_positives"]),
                f"{r['auc_cosine']:.3f}",
                f"{r['auc_verifier']:.3f}",
                f"{r['recall_cosine']:.1%}",
                f"{r['recall_verifier']:.1%}",
                f"{r['auc_cautious']:.3f}" if "auc_cautious" in r else "-",
            )
        console.print(table)
    console.print(f"earns its place (beats cosine on every held-out set): {result['earns_its_place']}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "semantic_verifier.json").write_text(json.dumps(result, indent=2))
    _plot(result, out / "semantic_verifier.png")


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["loo"]
    names = list(rows)
    xs = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(xs - 0.27, [rows[m]["auc_cosine"] for m in names], 0.27, label="cosine")
    ax.bar(xs, [rows[m]["auc_verifier"] for m in names], 0.27, label="verifier (fitted on the others)")
    ax.bar(xs + 0.27, [rows[m]["auc_cautious"] for m in names], 0.27, label="cautious verifier")
    ax.set_xticks(xs, names, rotation=20)
    ax.set_ylabel("AUC in the grey zone")
    ax.set_ylim(0.4, 1.0)
    ax.legend()
    ax.set_title("Leave one data set out: does the verifier beat the cosine?")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    typer.run(main)
