"""Prometheus metrics of the faust worker (served on `/metrics` next to faust's own)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

EVENTS = Counter(
    "cachemesh_streams_events_total",
    "Records read by stage 1, by outcome (applied, replayed, late, dead_lettered, other, reread)",
    ["outcome"],
)
WINDOWS = Counter("cachemesh_streams_windows_emitted_total", "Windows emitted", ["window"])
WINDOW_LAG = Histogram(
    "cachemesh_streams_window_lag_seconds",
    "Wall time between a window's end (event time) and its emission",
    buckets=(0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0),
)
INGEST_DELAY = Histogram(
    "cachemesh_streams_ingest_delay_seconds",
    "Wall time between an access's occurrence and stage 1 reading it (the queue before the worker; "
    "one sample per record: its oldest access)",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0),
)
LAST_WINDOW_LAG = Gauge("cachemesh_streams_last_window_lag_seconds", "Lag of the latest emitted window")
PENETRATIONS = Counter("cachemesh_streams_penetrations_total", "Requests that missed all three layers")
SPIKES = Counter("cachemesh_streams_latency_spikes_total", "Latency spikes reported (after cooldown)")
CLUSTERS = Counter("cachemesh_streams_drift_clusters_total", "Drift clusters emitted", ["pattern"])
OPEN_PANES = Gauge("cachemesh_streams_open_panes", "Stage-1 panes not closed yet")
QPS = Gauge("cachemesh_streams_qps", "QPS of the latest window", ["window", "shard", "model"])
ENTROPY = Gauge(
    "cachemesh_streams_entropy_bits", "Key entropy of the latest window", ["window", "shard", "model"]
)
HIT_RATE = Gauge("cachemesh_streams_hit_rate", "Hit rate of the latest window", ["window", "shard", "model"])
