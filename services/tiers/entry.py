"""What one cache entry is in every tier: its descriptor facts (`EntryMeta`) and its value, always held
as the LLM-aware encoding of `codec.py` (header + raw payload), so L1, L2, L3 and the wire share bytes.

Text answers travel as kind `prompt`, a 1-d uint8 payload of UTF-8; tensors (embeddings, KV blocks)
as themselves. Decoding hands back a zero-copy numpy view of the payload.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.descriptor import DEFAULT_SIMILARITY_FLOOR, CacheDescriptor
from schemas.events import EntryKind, Tier
from services.tiers import codec


@dataclass(frozen=True, slots=True)
class EntryMeta:
    """The descriptor facts a tier needs to serve, expire, bind and invalidate an entry."""

    key: str
    kind: EntryKind
    model: str
    embedding: np.ndarray | None = field(default=None, repr=False)  # float32 as written; L1 keeps a unit copy
    similarity_tolerance: float = DEFAULT_SIMILARITY_FLOOR
    ttl_hint_ms: int | None = None
    trace_id: str | None = None
    context_dependency_ids: tuple[str, ...] = ()
    semantic_tags: dict[str, str] = field(default_factory=dict)
    created_at_ms: int = 0
    updated_at_ms: int = 0
    size_bytes: int = 0
    # The prompt this entry answers, when it was written by text: the match guards compare it with a
    # request's text (matching/guards.py). None for entries written by embedding or by key only.
    prompt_text: str | None = None

    @property
    def expires_at_ms(self) -> int | None:
        """Wall-clock expiry (epoch ms), as Postgres computes it."""
        return None if self.ttl_hint_ms is None else self.updated_at_ms + self.ttl_hint_ms

    def remaining_ttl_ms(self, now_ms: int) -> int | None:
        """TTL left at `now_ms` (epoch ms): None for no TTL, <= 0 when already expired."""
        expires = self.expires_at_ms
        return None if expires is None else expires - now_ms

    def as_dict(self) -> dict[str, Any]:
        """The descriptor facts as plain JSON-able data (the embedding travels separately)."""
        return {
            "key": self.key,
            "kind": self.kind,
            "model": self.model,
            "similarity_tolerance": self.similarity_tolerance,
            "ttl_hint_ms": self.ttl_hint_ms,
            "trace_id": self.trace_id,
            "context_dependency_ids": list(self.context_dependency_ids),
            "semantic_tags": dict(self.semantic_tags),
            "created_at_ms": self.created_at_ms,
            "updated_at_ms": self.updated_at_ms,
            "size_bytes": self.size_bytes,
            "prompt_text": self.prompt_text,
        }

    def bound_to(self) -> set[str]:
        """Trace ids (conversations) whose end takes this entry with it."""
        bound = set(self.context_dependency_ids)
        if self.trace_id:
            bound.add(self.trace_id)
        return bound

    def with_times(self, created_at_ms: int, updated_at_ms: int) -> EntryMeta:
        return replace(self, created_at_ms=created_at_ms, updated_at_ms=updated_at_ms)

    def descriptor(self, tier: Tier = "l1") -> CacheDescriptor:
        return CacheDescriptor(
            key=self.key,
            kind=self.kind,
            model=self.model,
            embedding=None if self.embedding is None else self.embedding.astype(float).tolist(),
            ttl_hint_ms=self.ttl_hint_ms,
            similarity_tolerance=self.similarity_tolerance,
            context_dependency_ids=list(self.context_dependency_ids),
            trace_id=self.trace_id,
            semantic_tags=dict(self.semantic_tags),
            size_bytes=self.size_bytes,
            tier=tier,
            created_at_ms=self.created_at_ms,
            updated_at_ms=self.updated_at_ms,
        )


@dataclass(frozen=True, slots=True)
class Entry:
    """An entry as the tiers hold it: facts plus the encoded value."""

    meta: EntryMeta
    blob: bytes

    @property
    def key(self) -> str:
        return self.meta.key


def encode_text(text: str, *, model: str, kind: EntryKind = "prompt") -> bytes:
    raw = np.frombuffer(text.encode(), dtype=np.uint8)
    return codec.encode(raw, kind=kind, model=model)


def encode_array(
    array: npt.ArrayLike,
    *,
    kind: EntryKind,
    model: str,
    layer_range: tuple[int, int] = (0, 0),
    token_range: tuple[int, int] = (0, 0),
    dtype: codec.DType | None = None,
) -> bytes:
    return codec.encode(
        array, kind=kind, model=model, layer_range=layer_range, token_range=token_range, dtype=dtype
    )


@dataclass(frozen=True, slots=True)
class DecodedValue:
    header: codec.ValueHeader
    array: np.ndarray  # zero-copy view of the blob's payload

    @property
    def text(self) -> str | None:
        """The answer text, for a `prompt` value carried as UTF-8; None for tensors."""
        h = self.header
        if h.kind != "prompt" or h.dtype is not codec.DType.UINT8 or len(h.shape) != 1:
            return None
        try:
            return bytes(self.array.data).decode()
        except UnicodeDecodeError:
            return None

    def as_python(self) -> Any:
        text = self.text
        return text if text is not None else self.array


def decode_value(blob: bytes | memoryview, *, verify: bool = True) -> DecodedValue:
    header, array = codec.decode(blob, verify=verify)
    return DecodedValue(header, array)
