"""Settings of the vLLM KV-event bridge (env prefix CACHEMESH_BRIDGE_).

One engine: CACHEMESH_BRIDGE_ENDPOINT (vLLM's `endpoint`, e.g. tcp://vllm-host:5557), and
CACHEMESH_BRIDGE_MODEL (the name the engine serves: block keys are computed from it and the token ids,
so it must be what the connector and the gateway call the model), and _REPLAY_ENDPOINT, _ZMQ_TOPIC,
_ENGINE_ID. Several engines:
CACHEMESH_BRIDGE_PUBLISHERS='[{"engine_id": "a", "endpoint": "tcp://a:5557", ...}, ...]'.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServiceSettings

EngineId = Annotated[str, Field(min_length=1, max_length=200)]


class PublisherConfig(BaseModel):
    """One vLLM publisher: its PUB endpoint, its replay ROUTER endpoint, and who it is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine_id: EngineId
    endpoint: str
    replay_endpoint: str | None = None
    # vLLM's `topic` (default ""): the SUB socket's prefix filter.
    topic: str = ""

    # The served model name: the model identity in the block keys.
    model: Annotated[str, Field(min_length=1, max_length=200)]


class BridgeSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CACHEMESH_BRIDGE_", frozen=True, extra="ignore")

    endpoint: str | None = None
    replay_endpoint: str | None = None
    zmq_topic: str = ""
    # The engine's identity in kv.events.v1 (`node_id`); the bridge's node id when not given.
    engine_id: EngineId | None = None
    model: str | None = None
    publishers: list[PublisherConfig] = Field(default_factory=list)
    # How long to wait for each reply of a replay before giving the gap up as lost.
    replay_timeout_ms: Annotated[int, Field(gt=0)] = 2_000
    # A bridge with no saved position asks for the whole replay buffer (what the engine still holds).
    replay_history_on_first_start: bool = True
    # Blocks remembered per engine to turn AllBlocksCleared into removals.
    max_tracked_blocks: Annotated[int, Field(gt=0)] = 1_000_000
    # A payload larger than this is dead-lettered undecoded.
    max_payload_bytes: Annotated[int, Field(gt=0)] = 16 << 20
    # ZMQ receive high-water mark of the SUB socket (messages queued while a replay runs).
    rcvhwm: Annotated[int, Field(gt=0)] = 100_000

    @model_validator(mode="after")
    def _one_id_per_engine(self) -> Self:
        ids = [p.engine_id for p in self.engines()]
        if len(ids) != len(set(ids)):
            raise ValueError(f"engine ids must be unique, got {ids}")
        return self

    def engines(self) -> list[PublisherConfig]:
        """Every publisher to bridge: the single-engine fields (if an endpoint is set), then the list."""
        single = []
        if self.endpoint is not None:
            if not self.model:
                raise ValueError("CACHEMESH_BRIDGE_MODEL is required: block keys are computed from it")
            single.append(
                PublisherConfig(
                    engine_id=self.engine_id or self.node_id,
                    endpoint=self.endpoint,
                    replay_endpoint=self.replay_endpoint,
                    topic=self.zmq_topic,
                    model=self.model,
                )
            )
        return single + list(self.publishers)
