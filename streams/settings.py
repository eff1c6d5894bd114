"""Settings of the faust worker, from the environment (`CACHEMESH_STREAMS_*`, plus `KAFKA_BOOTSTRAP`
and `KAFKA_TOPIC_NAMESPACE` through the shared Kafka settings)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServiceSettings
from streams.drift import DriftParams
from streams.spikes import SPIKE_RTT_MS

_DRIFT = DriftParams()


class StreamsSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CACHEMESH_STREAMS_", frozen=True, extra="ignore")

    # The faust app id: consumer group and prefix of its internal topics (after the namespace).
    app_id: str = "cachemesh-streams"
    # faust's local state; a fresh temporary directory when unset.
    data_dir: str | None = None
    # Partitions of the hand-off topic and of the stage-2 tables.
    partitions: Annotated[int, Field(gt=0)] = 6
    # Partitions of cache.access.v1 (and kv.events.v1); the stage-1 table has as many. Unset: the
    # topic's actual count when it exists, the catalogue's otherwise.
    source_partitions: Annotated[int, Field(gt=0)] | None = None
    # How far behind the newest event of a partition an access may still arrive and be counted.
    lateness_ms: Annotated[int, Field(ge=0)] = 250
    # A partition consumed to its end and quiet this long stops holding windows back.
    idle_ms: Annotated[int, Field(gt=0)] = 1_000
    # Panes are closed and handed to stage 2 (and their records acknowledged) this often.
    tick_interval_ms: Annotated[int, Field(gt=0)] = 100
    spike_rtt_ms: Annotated[float, Field(gt=0)] = SPIKE_RTT_MS
    spike_cooldown_ms: Annotated[int, Field(ge=0)] = 1_000
    drift_enabled: bool = True
    drift_min_samples: Annotated[int, Field(gt=0)] = _DRIFT.min_samples
    drift_eps_scale: Annotated[float, Field(gt=0)] = _DRIFT.eps_scale
    drift_max_keys: Annotated[int, Field(ge=0)] = _DRIFT.max_keys
    # Kafka group session: how long a worker that died silently holds its partitions.
    session_timeout_ms: Annotated[int, Field(ge=6_000)] = 10_000
    # Create the catalogue and the internal topics before the worker starts.
    create_topics: bool = True
    # Longest a fetch waits at the broker for data (faust's own 1.5 s is replaced; see faust_adapter.py).
    fetch_max_wait_ms: Annotated[int, Field(gt=0)] = 100
    # Records an agent may have queued (faust's stream_buffer_maxsize); see app.py.
    stream_buffer: Annotated[int, Field(gt=0)] = 256
    # faust's own per-message Prometheus sensors on /metrics too (costs per-event work).
    faust_metrics: bool = False
    # A changelog recovery that reads nothing for this long is restarted (streams/recovery_watch.py);
    # after this many restarts in a row without progress the worker exits for its supervisor to start.
    recovery_stall_s: Annotated[float, Field(gt=0)] = 30.0
    recovery_restarts: Annotated[int, Field(ge=0)] = 3

    def drift_params(self) -> DriftParams:
        return DriftParams(
            min_samples=self.drift_min_samples,
            eps_scale=self.drift_eps_scale,
            max_keys=self.drift_max_keys,
        )
