"""Settings of the invalidation service (env prefix CACHEMESH_INVALIDATION_)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServiceSettings


class InvalidationSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CACHEMESH_INVALIDATION_", frozen=True, extra="ignore")

    group_id: str = "invalidation"
    # Bounds of one walk (one triggering event): levels followed, and dependants collected in all.
    # Memory per event is O(max_dependants); a bound hit is recorded (`truncated`, `bound`).
    max_depth: Annotated[int, Field(gt=0, le=1000)] = 16
    max_dependants: Annotated[int, Field(gt=0, le=1_000_000)] = 10_000
    # Frontier ids per dependency query (one array parameter each).
    query_batch_ids: Annotated[int, Field(gt=0)] = 1_000
    # Delete the dependants' descriptors (and so their L3 values) so no node reads them back.
    delete_l3: bool = True
    # Publish a record also when nothing depended on the root (every write would make one).
    record_noops: bool = False
    # Orphaned dependency edges (their entry is gone) are kept this long for walks still to come.
    edge_gc_interval_s: Annotated[float, Field(gt=0)] = 60.0
    edge_gc_grace_ms: Annotated[int, Field(ge=0)] = 600_000
    edge_gc_batch: Annotated[int, Field(gt=0)] = 10_000
    # The inbox (`processed_events`) keeps an event id as long as its event can come back: the longest
    # retention of the topics consumed (context.lifecycle.v1: 7 days). Pruned in batches.
    inbox_retention_ms: Annotated[int, Field(gt=0)] = 7 * 24 * 3_600_000
    inbox_prune_interval_s: Annotated[float, Field(gt=0)] = 60.0
    inbox_prune_batch: Annotated[int, Field(gt=0)] = 1_000
