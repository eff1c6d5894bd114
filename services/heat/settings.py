"""Settings of the heat service (env prefix CACHEMESH_HEAT_)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from schemas.events import MAX_HEAT_BATCH
from services.runtime.settings import ServiceSettings


class HeatSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CACHEMESH_HEAT_", frozen=True, extra="ignore")

    group_id: str = "heat"
    # Entries tracked (the resident set the policy manages on behalf of the tier nodes).
    capacity: Annotated[int, Field(gt=0)] = 100_000
    # docs/design.md §1.2: the MLP re-scores every 100 ms.
    rescore_interval_ms: Annotated[int, Field(gt=0)] = 100
    seed: int = 0
    # Model checkpoints in Postgres (`model_fits`), restored at start.
    model_name: str = "heat_mlp"
    # Set where several heat services share the group's partitions (each owns the keys of its
    # partitions): a name stable across this instance's restarts. It checkpoints its model as
    # `model_name@instance` (starting from the newest model of any instance when it has none of its
    # own) and hears every `context.lifecycle.v1` event in a group of its own, since a conversation's
    # blocks can sit on any instance.
    instance: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")] | None = None
    checkpoint_interval_s: Annotated[float, Field(gt=0)] = 30.0
    # BLAS and torch intra-op threads (set by `python -m services.heat`). The matrices are tiny: on 2
    # cores the default thread pools cost 23 us of CPU per event against 15 us with one thread, for
    # the same events/s (bench/heat_scale.py).
    threads: Annotated[int, Field(ge=1)] = 1
    # Bound on decisions published per re-score round; the rest wait for the next round.
    max_decisions_per_round: Annotated[int, Field(gt=0)] = 10_000
    # Decisions per record: a round's decisions go out as `HeatScoredBatch` records of up to this many,
    # one partition's each (a lone decision as a `HeatScored`); 1: one `HeatScored` record each.
    decisions_per_record: Annotated[int, Field(ge=1, le=MAX_HEAT_BATCH)] = 128

    @property
    def checkpoint_name(self) -> str:
        return self.model_name if self.instance is None else f"{self.model_name}@{self.instance}"
