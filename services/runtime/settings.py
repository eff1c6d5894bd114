"""Settings shared by every service: where Kafka and Postgres are, and how a service shows itself.

Each service defines one frozen settings class with its own env prefix (`CACHEMESH_<NAME>_`) and
embeds these shared groups, which read the unprefixed, conventional variables (`KAFKA_BOOTSTRAP`,
`DATABASE_URL`). Built once in `__main__` and passed down.
"""

from __future__ import annotations

import socket
from typing import Annotated, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.wire import DEFAULT_MAX_EVENT_BYTES


class KafkaSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KAFKA_", frozen=True, extra="ignore")

    bootstrap: str = "127.0.0.1:9092"
    client_id: str = "cachemesh"
    # Consumers dead-letter anything larger; producers refuse to send it.
    max_event_bytes: Annotated[int, Field(gt=0)] = DEFAULT_MAX_EVENT_BYTES
    # A prefix on every topic name, so several meshes (or tests) can share one cluster.
    topic_namespace: str = ""
    # Event ids remembered per consumer to drop duplicates cheaply before the handler runs.
    dedupe_window: Annotated[int, Field(ge=0)] = 100_000
    max_poll_records: Annotated[int, Field(gt=0)] = 500
    poll_timeout_ms: Annotated[int, Field(gt=0)] = 200
    # How long the broker may hold a fetch waiting for data: bounds the latency of a quiet partition.
    fetch_max_wait_ms: Annotated[int, Field(gt=0)] = 100
    # Attempts for a handler that raises a non-transient error before the event is dead-lettered.
    handler_max_attempts: Annotated[int, Field(gt=0)] = 3
    # Producer batching: a request never waits on Kafka; linger lets events share a batch.
    linger_ms: Annotated[int, Field(ge=0)] = 5
    # Bytes per producer batch (one partition's share of a request). The client's 16 KiB holds ~50
    # events with their headers, and only one batch per partition is in flight: at a few ms a
    # round trip under load that, not the CPU, bounded a burst.
    max_batch_bytes: Annotated[int, Field(gt=0)] = 256 * 1024
    request_timeout_ms: Annotated[int, Field(gt=0)] = 30_000
    session_timeout_ms: Annotated[int, Field(gt=0)] = 10_000
    heartbeat_interval_ms: Annotated[int, Field(gt=0)] = 3_000


class PostgresSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", frozen=True, extra="ignore")

    database_url: SecretStr = SecretStr("postgresql://postgres@127.0.0.1:5432/postgres")
    pg_pool_min: Annotated[int, Field(ge=0)] = 1
    pg_pool_max: Annotated[int, Field(gt=0)] = 8
    # How long a query keeps retrying through a lost connection (database restart) before failing.
    pg_retry_deadline_s: Annotated[float, Field(gt=0)] = 60.0
    pg_command_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    # Dimension of the descriptor embedding column (all-MiniLM-L6-v2: 384).
    cachemesh_embedding_dim: Annotated[int, Field(gt=0, le=16000)] = 384


class ServiceSettings(BaseSettings):
    """Base for every service's settings; subclasses set `env_prefix`."""

    model_config = SettingsConfigDict(env_prefix="CACHEMESH_", frozen=True, extra="ignore")

    node_id: str = Field(default_factory=socket.gethostname)
    # Port of the /metrics and /healthz endpoint; 0 picks a free one.
    metrics_host: str = "127.0.0.1"
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 0
    log_level: str = "INFO"
    # The event loop `run_service` runs on: uvloop measured 1.3-1.8x the tier node's exact lookups/s
    # over asyncio's (bench/api.py --loop); "asyncio" where uvloop is unwanted or missing.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    # Allocations between two young-generation collections of Python's cyclic GC in the service's
    # process (`run_service`; Python's own: 700); 0 keeps Python's. The services allocate a few short-
    # lived objects per event or request, almost none in cycles: at 700 the collector took a third of
    # the streams stages' CPU (bench/streams_stages.py shows both).
    gc_threshold: Annotated[int, Field(ge=0)] = 50_000
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
