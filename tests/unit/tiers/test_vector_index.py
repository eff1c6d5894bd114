"""One contract suite for every `VectorIndex`, plus the numpy reference kernel and the ANN switch."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from services.tiers.l1.vector_index import (
    ExactCosineIndex,
    HnswlibIndex,
    SemanticIndex,
    VectorIndex,
    cosine_topk,
    normalize,
)
from services.tiers.l2.block_pool import default_array_module

DIM = 16
RNG = np.random.default_rng(11)
DATA = normalize(RNG.standard_normal((400, DIM)))

FACTORIES: dict[str, Callable[[], VectorIndex]] = {
    "exact": lambda: ExactCosineIndex(DIM, initial_rows=2),
    "hnswlib": lambda: HnswlibIndex(DIM, initial_capacity=8),
    "semantic-exact": lambda: SemanticIndex(DIM, ann_threshold=10_000),
    "semantic-ann": lambda: SemanticIndex(DIM, ann_threshold=50),
}


@pytest.fixture(params=list(FACTORIES))
def index(request: pytest.FixtureRequest) -> VectorIndex:
    return FACTORIES[request.param]()


def brute_force(data: np.ndarray, ids: np.ndarray, q: np.ndarray) -> np.ndarray:
    return ids[np.argmax(normalize(q) @ data.T, axis=1)]


def test_finds_each_stored_vector(index: VectorIndex) -> None:
    index.add(np.arange(400), DATA)
    ids, sims = index.search(DATA[:50], 3)
    assert ids.shape == sims.shape == (50, 3)
    np.testing.assert_array_equal(ids[:, 0], np.arange(50))
    np.testing.assert_allclose(sims[:, 0], 1.0, atol=1e-5)
    assert np.all(np.diff(sims, axis=1) <= 1e-6)  # best first


def test_recall_on_noisy_queries(index: VectorIndex) -> None:
    index.add(np.arange(400), DATA)
    q = DATA[:100] + 0.05 * RNG.standard_normal((100, DIM)).astype(np.float32)
    ids, _ = index.search(q, 1)
    assert np.mean(ids[:, 0] == brute_force(DATA, np.arange(400), q)) >= 0.95


def test_removed_ids_are_never_returned(index: VectorIndex) -> None:
    index.add(np.arange(400), DATA)
    gone = np.arange(0, 400, 3)
    index.remove(np.concatenate([gone, [10_000]]))  # an unknown id is ignored
    assert len(index) == 400 - len(gone)
    ids, _ = index.search(DATA[:60], 5)
    assert not np.isin(ids, gone).any()
    keep = np.setdiff1d(np.arange(400), gone)
    assert np.mean(ids[:, 0] == brute_force(DATA[keep], keep, DATA[:60])) >= 0.95


def test_readding_an_id_replaces_its_vector(index: VectorIndex) -> None:
    index.add(np.arange(100), DATA[:100])
    index.remove([5])
    index.add([5], DATA[200:201])  # revive a removed id with a new vector
    index.add([6], DATA[300:301])  # overwrite a live id
    assert len(index) == 100
    assert index.search(DATA[200:201], 1)[0][0, 0] == 5
    assert index.search(DATA[300:301], 1)[0][0, 0] == 6
    assert index.search(DATA[6:7], 2)[0][0, 0] != 6


def test_short_results_are_padded(index: VectorIndex) -> None:
    ids, sims = index.search(DATA[:2], 3)
    assert (ids == -1).all() and np.isneginf(sims).all()
    index.add([7, 8], DATA[:2])
    ids, sims = index.search(DATA[:1], 4)
    assert ids[0, :2].tolist() == [7, 8] and (ids[0, 2:] == -1).all() and np.isneginf(sims[0, 2:]).all()


def test_rejects_bad_input(index: VectorIndex) -> None:
    with pytest.raises(ValueError, match="nonzero"):
        index.add([1], np.zeros((1, DIM)))
    with pytest.raises(ValueError, match="shape"):
        index.add([1], np.ones((1, DIM + 1)))
    with pytest.raises(ValueError, match="non-negative"):
        index.add([-1], np.ones((1, DIM)))


def test_cosine_topk_reference() -> None:
    q = normalize(RNG.standard_normal((5, DIM)))
    rows, sims = cosine_topk(q, DATA, 4)
    full = q @ DATA.T
    expect = np.argsort(-full, axis=1)[:, :4]
    np.testing.assert_array_equal(rows, expect)
    np.testing.assert_allclose(sims, np.take_along_axis(full, expect, axis=1), rtol=1e-6)
    assert cosine_topk(q, DATA[:2], 4)[0].shape == (5, 2)


def test_semantic_index_switches_to_ann_and_back() -> None:
    si = SemanticIndex(DIM, ann_threshold=100, candidates=4)
    si.add(np.arange(99), DATA[:99])
    assert si.ann is None
    si.add([99], DATA[99:100])
    assert si.ann is not None and len(si.ann) == 100
    ids, sims = si.search(DATA[:10], 2)
    exact_sims = np.einsum("nkd,nd->nk", si.vectors(ids), DATA[:10])
    np.testing.assert_allclose(sims, exact_sims, rtol=1e-6)  # re-ranked: exact cosines
    si.remove(np.arange(50))
    assert si.ann is not None  # hysteresis: stays until below half the threshold
    si.remove([50])
    assert si.ann is None and len(si) == 49
    assert si.search(DATA[60:61], 1)[0][0, 0] == 60


def test_exact_vectors_lookup() -> None:
    ex = ExactCosineIndex(DIM)
    ex.add([3, 9], DATA[:2])
    got = ex.vectors(np.array([[9, -1], [3, 500]]))
    np.testing.assert_allclose(got[0, 0], DATA[1], rtol=1e-6)
    assert not got[0, 1].any() and not got[1, 1].any()


@pytest.mark.gpu
@pytest.mark.skipif(default_array_module() is np, reason="needs a CUDA device and CuPy")
def test_cosine_topk_cupy_matches_numpy() -> None:
    import cupy

    q = normalize(RNG.standard_normal((32, DIM)))
    rows, sims = cosine_topk(q, DATA, 5)
    g_rows, g_sims = cosine_topk(cupy.asarray(q), cupy.asarray(DATA), 5, xp=cupy)
    np.testing.assert_array_equal(cupy.asnumpy(g_rows), rows)
    np.testing.assert_allclose(cupy.asnumpy(g_sims), sims, rtol=1e-5)
