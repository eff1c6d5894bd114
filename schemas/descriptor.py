"""The cache descriptor every entry carries (docs/design.md §1.1); stored in Postgres, values live in
tiers."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas.events import MAX_EMBEDDING_DIM, MAX_KEY_CHARS, EntryKind, Tier, now_ms

MAX_TAGS = 64
MAX_DEPENDENCIES = 256


# The cosine a semantic match must reach when neither the entry nor the request says (the source's
# example, docs/design.md §1.1). The one place this default is written; everything else imports it.
DEFAULT_SIMILARITY_FLOOR = 0.92


class CacheDescriptor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS)]
    kind: EntryKind
    model: Annotated[str, Field(min_length=1, max_length=256)]
    embedding: Annotated[list[float], Field(min_length=1, max_length=MAX_EMBEDDING_DIM)] | None = None
    ttl_hint_ms: Annotated[int, Field(gt=0)] | None = None
    # Cosine similarity a semantic match must reach.
    similarity_tolerance: Annotated[float, Field(ge=0.0, le=1.0)] = DEFAULT_SIMILARITY_FLOOR
    context_dependency_ids: Annotated[list[str], Field(max_length=MAX_DEPENDENCIES)] = Field(
        default_factory=list
    )
    trace_id: str | None = None
    semantic_tags: Annotated[dict[str, str], Field(max_length=MAX_TAGS)] = Field(default_factory=dict)
    size_bytes: Annotated[int, Field(ge=0)] = 0
    tier: Tier = "l1"
    created_at_ms: Annotated[int, Field(ge=0)] = Field(default_factory=now_ms)
    updated_at_ms: Annotated[int, Field(ge=0)] = Field(default_factory=now_ms)
    last_access_ms: Annotated[int, Field(ge=0)] | None = None

    @field_validator("embedding")
    @classmethod
    def _finite(cls, values: list[float] | None) -> list[float] | None:
        if values is not None and not all(math.isfinite(v) for v in values):
            raise ValueError("embedding must contain only finite numbers (no NaN or inf)")
        return values

    def expires_at_ms(self) -> int | None:
        return None if self.ttl_hint_ms is None else self.updated_at_ms + self.ttl_hint_ms
