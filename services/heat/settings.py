"""Settings of the heat service (env prefix CACHEMESH_HEAT_)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServiceSettings


class HeatSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CACHEMESH_HEAT_", frozen=True, extra="ignore")

    group_id: str = "heat"
    # Entries tracked (the resident set the policy manages on behalf of the tier nodes).
    capacity: Annotated[int, Field(gt=0)] = 100_000
    # Seed §1.2: the MLP re-scores every 100 ms.
    rescore_interval_ms: Annotated[int, Field(gt=0)] = 100
    seed: int = 0
    # Model checkpoints in Postgres (`model_fits`), restored at start.
    model_name: str = "heat_mlp"
    checkpoint_interval_s: Annotated[float, Field(gt=0)] = 30.0
    # Bound on decisions published per re-score round; the rest wait for the next round.
    max_decisions_per_round: Annotated[int, Field(gt=0)] = 10_000
