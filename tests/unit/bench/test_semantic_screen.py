"""bench/semantic.py's screened requests (the tier node's two-precision cascade): a screen that moves
similarities by less than the band decides as the precise vectors do; one that moves them by more than
the band, with no band, does not; within a band that covers its error it does again."""

from __future__ import annotations

import random

import numpy as np

from bench.semantic import Fixed, Tally, World, simulate


def _world(n: int) -> tuple[World, dict[str, np.ndarray], list[str]]:
    """Pairs of prompts sharing an answer at cosine 0.90-0.94 (around the 0.92 threshold)."""
    rng = np.random.default_rng(3)
    texts, answer, vectors = [], {}, {}
    for i in range(n):
        base = rng.standard_normal(16)
        base /= np.linalg.norm(base)
        other = rng.standard_normal(16)
        other -= (other @ base) * base
        other /= np.linalg.norm(other)
        c = 0.90 + 0.04 * i / n
        for name, vec in ((f"q{i}a", base), (f"q{i}b", c * base + np.sqrt(1 - c * c) * other)):
            texts.append(name)
            answer[name] = f"a{i}"
            vectors[name] = vec.astype(np.float32)
    return World(answer, {}, dict.fromkeys(texts, "test"), (texts, [])), vectors, texts


def _run(vectors: dict[str, np.ndarray], screen: dict[str, np.ndarray] | None, band: float) -> Tally:
    world, _, texts = _world(40)
    stream = sorted(texts)  # each "a" before its "b": the b's are paraphrase requests
    return simulate(Fixed(0.92, False), stream, vectors, world, random.Random(0), 0.0, 3, screen, band)


def test_a_screen_within_its_band_decides_as_the_precise_vectors() -> None:
    _, vectors, _ = _world(40)
    shift = np.random.default_rng(5)
    # The screen's vector of a request: the precise one nudged by up to ~0.02 in cosine.
    screen = {}
    for t, v in vectors.items():
        noisy = v + 0.1 * shift.standard_normal(v.shape).astype(np.float32) / np.sqrt(v.size)
        screen[t] = noisy / np.linalg.norm(noisy)
    precise = _run(vectors, None, 0.0)
    unbanded = _run(vectors, screen, 0.0)
    banded = _run(vectors, screen, 0.05)
    assert 0 < precise.para_hit < precise.para  # the threshold splits the pairs
    assert unbanded.para_hit != precise.para_hit and unbanded.refined == 0
    assert (banded.para_hit, banded.served, banded.wrong) == (precise.para_hit, precise.served, precise.wrong)
    assert banded.refined > 0
