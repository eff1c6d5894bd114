"""Settings of the warmup service (env prefix CACHEMESH_WARMUP_): the QPS/entropy band, the prefetch
budget, timing and what it tracks. Every default is the design's (docs/design.md §2.5, §3.1, §3.3)
unless noted."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from schemas.events import Tier
from services.runtime.settings import ServiceSettings
from services.warmup.planner import PlannerConfig
from services.warmup.trigger import Band


class WarmupSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CACHEMESH_WARMUP_", frozen=True, extra="ignore")

    group_id: str = "warmup"
    # The band (docs/design.md §3.3): warm only when qps_min < QPS < qps_max and
    # entropy_min < H < entropy_max.
    qps_min: float = 50.0
    qps_max: float = 200.0
    entropy_min_bits: float = 2.1
    entropy_max_bits: float = 3.8
    tier: Tier = "l1"
    conversation_tier: Tier = "l2"
    # Not in the design's source: conversations are warmed back into the engines as well (the gateway prefills
    # them on the instance it routes them to); see PlannerConfig.warm_engines.
    warm_engines: bool = False
    # Not in the design's source: a cap on prefetch traffic so warmup never crowds out serving.
    budget_bytes_per_s: Annotated[float, Field(gt=0)] = 64 * 1024 * 1024
    default_entry_bytes: Annotated[int, Field(gt=0)] = 16 * 1024
    # docs/design.md §2.5: start at request time + 1.2 x P95 of the dependency latency.
    dependency_factor: Annotated[float, Field(ge=0)] = 1.2
    prefix_depth: Annotated[int, Field(ge=0)] = 4
    turn_idle_ms: Annotated[int, Field(gt=0)] = 1_000
    rewarm_after_ms: Annotated[int, Field(ge=0)] = 5_000
    rising_heat: Annotated[float, Field(gt=0)] = 0.2
    semantic_neighbours: Annotated[int, Field(ge=0)] = 8
    peak_horizon_ms: Annotated[int, Field(gt=0)] = 10_000
    useful_within_ms: Annotated[int, Field(gt=0)] = 60_000
    tick_interval_ms: Annotated[int, Field(gt=0)] = 100
    # FTL fits (docs/design.md §2.1) are checkpointed to `model_fits` and restored at start.
    model_name: str = "warmup_ftl"
    checkpoint_interval_s: Annotated[float, Field(gt=0)] = 30.0

    def planner_config(self) -> PlannerConfig:
        return PlannerConfig(
            band=Band(self.qps_min, self.qps_max, self.entropy_min_bits, self.entropy_max_bits),
            tier=self.tier,
            conversation_tier=self.conversation_tier,
            warm_engines=self.warm_engines,
            budget_bytes_per_s=self.budget_bytes_per_s,
            default_entry_bytes=self.default_entry_bytes,
            dependency_factor=self.dependency_factor,
            prefix_depth=self.prefix_depth,
            turn_idle_ms=self.turn_idle_ms,
            rewarm_after_ms=self.rewarm_after_ms,
            rising_heat=self.rising_heat,
            peak_horizon_ms=self.peak_horizon_ms,
            useful_within_ms=self.useful_within_ms,
        )
