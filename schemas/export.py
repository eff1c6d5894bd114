"""Writes the JSON Schema of every event type (for producers in other languages) and a golden payload
per type (`cachemesh schemas export`). Both are committed; tests keep them honest."""

from __future__ import annotations

import json
from pathlib import Path

from schemas.descriptor import DEFAULT_SIMILARITY_FLOOR, CacheDescriptor
from schemas.events import (
    EVENT_TYPES,
    AttentionHeatReported,
    CacheAccessBatch,
    CacheAccessed,
    CacheInvalidated,
    ConversationEnded,
    ConversationStarted,
    DriftClustered,
    Event,
    EvictionRequested,
    HeatScored,
    HeatScoredBatch,
    InvalidationRecorded,
    KvBlockRemoved,
    KvBlockStored,
    LatencySpikeDetected,
    PromotionRequested,
    RequestPenetrated,
    ShardPlanned,
    SourceChanged,
    TierModeChanged,
    WarmupApplied,
    WarmupDecided,
    WarmupMeasured,
    WarmupRequested,
    WindowComputed,
)

SCHEMAS_DIR = Path(__file__).parent
JSONSCHEMA_DIR = SCHEMAS_DIR / "jsonschema"
GOLDEN_DIR = SCHEMAS_DIR / "golden"

_T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, fixed so golden files are stable
_ID = "0" * 31 + "1"

GOLDEN_EVENTS: tuple[Event, ...] = (
    CacheAccessed(
        event_id=_ID,
        occurred_at_ms=_T0,
        key="model:llama-3-8b:v1:9f86d081",
        hit=True,
        kind="prompt",
        model="llama-3-8b",
        tier="l1",
        match="semantic",
        similarity=0.953,
        latency_ms=0.21,
        layer="model",
        token_count=42,
        size_bytes=2048,
        trace_id="conv-42",
        node_id="tiers-a",
        service="gateway",
        call_depth=2,
        shard="0",
    ),
    CacheAccessBatch(
        event_id="0" * 31 + "2",
        occurred_at_ms=_T0 + 5,
        key="model:llama-3-8b:v1:9f86d081",
        events=[
            CacheAccessed(
                event_id="0" * 31 + "3",
                occurred_at_ms=_T0,
                key="model:llama-3-8b:v1:9f86d081",
                hit=True,
                tier="l1",
                match="exact",
                latency_ms=0.08,
                node_id="tiers-a",
            ),
            CacheAccessed(
                event_id="0" * 31 + "4",
                occurred_at_ms=_T0 + 5,
                key="model:llama-3-8b:v1:5e884898",
                hit=False,
                latency_ms=0.4,
                layer="model",
                node_id="tiers-a",
            ),
        ],
    ),
    KvBlockStored(
        event_id=_ID,
        occurred_at_ms=_T0,
        block_hash="b:1c2d",
        parent_block_hash="b:0a1b",
        model="llama-3-8b",
        block_size_tokens=16,
        size_bytes=16384,
        medium="gpu",
        head_heat=[0.1, 0.7, 0.2],
        trace_id="conv-42",
        node_id="vllm-0",
    ),
    KvBlockRemoved(
        event_id=_ID,
        occurred_at_ms=_T0,
        block_hash="b:1c2d",
        model="llama-3-8b",
        medium="gpu",
        node_id="vllm-0",
    ),
    AttentionHeatReported(
        event_id=_ID,
        occurred_at_ms=_T0,
        block_hash="b:1c2d",
        model="llama-3-8b",
        layer=3,
        step=1200,
        head_heat=[0.02, 0.91, 0.33, 0.05],
        node_id="vllm-0",
    ),
    CacheInvalidated(
        event_id=_ID,
        occurred_at_ms=_T0,
        key="model:llama-3-8b:v1:9f86d081",
        reason="write",
        model="llama-3-8b",
        embedding=[0.6, 0.8, 0.0],
        similarity_threshold=DEFAULT_SIMILARITY_FLOOR,
        trace_id="conv-42",
        origin_node_id="tiers-a",
        attempt=1,
    ),
    ConversationStarted(
        event_id=_ID, occurred_at_ms=_T0, trace_id="conv-42", model="llama-3-8b", ttl_hint_ms=600_000
    ),
    ConversationEnded(event_id=_ID, occurred_at_ms=_T0, trace_id="conv-42"),
    HeatScored(
        event_id=_ID,
        occurred_at_ms=_T0,
        key="model:llama-3-8b:v1:9f86d081",
        score=0.87,
        decision="keep_alive",
        cluster=7,
        model_version=12,
        node_id="heat-0",
    ),
    HeatScoredBatch(
        event_id="0" * 31 + "7",
        occurred_at_ms=_T0 + 1,
        key="model:llama-3-8b:v1:9f86d081",
        events=[
            HeatScored(
                event_id="0" * 31 + "8",
                occurred_at_ms=_T0,
                key="model:llama-3-8b:v1:9f86d081",
                score=0.87,
                decision="keep",
                model_version=12,
            ),
            HeatScored(
                event_id="0" * 31 + "9",
                occurred_at_ms=_T0 + 1,
                key="model:llama-3-8b:v1:3c2a9e17",
                score=0.02,
                decision="evict",
                cluster=7,
                model_version=12,
            ),
        ],
    ),
    WindowComputed(
        event_id=_ID,
        occurred_at_ms=_T0,
        shard="0",
        model="llama-3-8b",
        window="tumbling_1s",
        window_start_ms=_T0 - 1000,
        window_end_ms=_T0,
        requests=120,
        qps=120.0,
        entropy_bits=3.1,
        hit_rate=0.82,
        hit_rate_by_tier={"l1": 0.7, "l2": 0.08, "l3": 0.04},
        penetration_by_layer={"model": 0.0037, "sequence": 0.0215, "token": 0.186},
        added_latency_ms_by_layer={"model": 12.4, "sequence": 8.9, "token": 3.2},
        miss_latency_ms_p50=41.0,
        miss_latency_ms_p95=180.0,
    ),
    RequestPenetrated(
        event_id=_ID,
        occurred_at_ms=_T0,
        shard="0",
        key="model:llama-3-8b:v1:9f86d081",
        model="llama-3-8b",
        trace_id="conv-42",
        latency_ms=340.0,
    ),
    LatencySpikeDetected(
        event_id=_ID,
        occurred_at_ms=_T0,
        shard="0",
        key="model:llama-3-8b:v1:9f86d081",
        rtt_ms=351.0,
        t_peak_ms=_T0,
        t_warm_ms=_T0 - 120,
        delta_t_ms=120,
    ),
    DriftClustered(
        event_id=_ID,
        occurred_at_ms=_T0,
        cluster_id="w1767225600000-c3",
        pattern="pulse",
        window_end_ms=_T0,
        keys=["k1", "k2", "k3"],
        size=3,
        duration_ms=6000,
        variance=0.41,
        service_spread=0.1,
    ),
    WarmupRequested(
        event_id=_ID,
        occurred_at_ms=_T0,
        node_id="*",
        keys=["k1", "k2"],
        reason="qps=120 entropy=3.1",
        tier="l1",
        start_at_ms=_T0 + 240,
        deadline_ms=_T0 + 500,
    ),
    PromotionRequested(
        event_id=_ID, occurred_at_ms=_T0, node_id="tiers-a", keys=["k1"], reason="hot", to_tier="l1"
    ),
    EvictionRequested(event_id=_ID, occurred_at_ms=_T0, node_id="*", keys=["k9"], reason="context_ended"),
    WarmupDecided(
        event_id=_ID,
        occurred_at_ms=_T0,
        shard="0",
        source="drift",
        action="warm",
        reason="warm: qps 120.0 and entropy 3.10 bits inside the band; drift cluster c3 labelled pulse",
        keys=["k1", "k2"],
        node_id="*",
        tier="l1",
        bytes=32768,
        command_event_id="0" * 31 + "2",
        start_at_ms=_T0 + 240,
        window_end_ms=_T0,
        cluster_id="w1767225600000-c3",
        qps=120.0,
        entropy_bits=3.1,
    ),
    WarmupMeasured(
        event_id=_ID, occurred_at_ms=_T0, shard="0", t_warm_ms=_T0, t_peak_ms=_T0 + 1000, delta_t_ms=1000
    ),
    WarmupApplied(
        event_id=_ID,
        occurred_at_ms=_T0,
        node_id="tiers-a",
        command_event_id="0" * 31 + "2",
        tier="l1",
        loaded=2,
        already_present=1,
        missing=0,
        from_peers=0,
        from_l3=2,
    ),
    ShardPlanned(
        event_id=_ID,
        occurred_at_ms=_T0,
        model="llama-3-8b",
        scores=[0.01, 0.45, 1.0],
        classes=["cold", "warm", "hot"],
        steps=64,
    ),
    SourceChanged(
        event_id=_ID,
        occurred_at_ms=_T0,
        source="orders",
        ids=["42", "43"],
        reason="update",
        producer="orders-api",
    ),
    InvalidationRecorded(
        event_id=_ID,
        occurred_at_ms=_T0,
        root="conv-42",
        cause="conversation_ended",
        roots=["conv-42"],
        source_event_id="0" * 31 + "2",
        keys=["model:llama-3-8b:v1:9f86d081", "summary:conv-42"],
        chunk=0,
        chunks=1,
        dependants=2,
        depth=2,
        truncated=False,
        command_event_id="0" * 31 + "3",
        node_id="*",
        l3_deleted=2,
    ),
    TierModeChanged(
        event_id=_ID,
        occurred_at_ms=_T0,
        node_id="tiers-a",
        mode="local_only",
        previous_mode="normal",
        reason="hit rate 62.0% over the last 30000 ms (310 hits in 500 lookups) < 85%",
        hit_rate=0.62,
        hits=310,
        lookups=500,
        window_ms=30_000,
        enter_below=0.85,
        exit_at=0.9,
        in_previous_ms=120_000,
        local_only_ms=0,
        changes=1,
    ),
)


def _type_name(event_type: type[Event]) -> str:
    return str(event_type.model_fields["type"].default)


def json_schema_documents() -> dict[str, dict[str, object]]:
    docs: dict[str, dict[str, object]] = {}
    for type_name, cls in EVENT_TYPES.items():
        schema = cls.model_json_schema()
        schema["$id"] = f"https://cachemesh.dev/schemas/{cls.topic}/{type_name}.json"
        schema["x-topic"] = cls.topic
        schema["x-kafka-key"] = cls.key_field
        docs[type_name] = schema
    descriptor = CacheDescriptor.model_json_schema()
    descriptor["$id"] = "https://cachemesh.dev/schemas/cache_descriptor.json"
    docs["cache_descriptor"] = descriptor
    return docs


def golden_documents() -> dict[str, dict[str, object]]:
    docs = {_type_name(type(e)): json.loads(e.model_dump_json(exclude_none=True)) for e in GOLDEN_EVENTS}
    missing = set(EVENT_TYPES) - set(docs)
    if missing:
        raise RuntimeError(f"no golden payload for {sorted(missing)}")
    return docs


def _dump(doc: object) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def export(jsonschema_dir: Path = JSONSCHEMA_DIR, golden_dir: Path = GOLDEN_DIR) -> list[Path]:
    """Writes the schema and golden files. Golden files that already exist are kept as they are:
    they record what producers were promised, and a change to the models must keep them valid."""
    written: list[Path] = []
    jsonschema_dir.mkdir(parents=True, exist_ok=True)
    golden_dir.mkdir(parents=True, exist_ok=True)
    for name, doc in json_schema_documents().items():
        path = jsonschema_dir / f"{name}.json"
        path.write_text(_dump(doc))
        written.append(path)
    for name, doc in golden_documents().items():
        path = golden_dir / f"{name}.json"
        if not path.exists():
            path.write_text(_dump(doc))
            written.append(path)
    return written
