"""Every v1 event cachemesh puts on Kafka, defined once (docs/design.md §5).

Events are pydantic v2 models with a discriminated `type`. Names are past tense. Within v1 only
optional fields may be added; `schemas/golden/` holds one payload per type that must keep validating.
Each event class names its topic and the field that keys its Kafka record.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from schemas.ids import new_event_id

SCHEMA_VERSION: Literal[1] = 1
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})

Tier = Literal["l1", "l2", "l3"]
EntryKind = Literal["prompt", "embedding", "kv_block"]
PenetrationLayer = Literal["model", "sequence", "token"]
Decision = Literal["keep", "evict", "keep_alive"]
DriftPattern = Literal["pulse", "migrating", "stable"]

# Bounds that keep one event well under the broker's message size and a consumer's memory.
MAX_KEY_CHARS = 512
MAX_EMBEDDING_DIM = 4096
MAX_PROMPT_CHARS = 65_536
MAX_KEYS_PER_EVENT = 1024
MAX_HEADS = 1024


def now_ms() -> int:
    return time.time_ns() // 1_000_000


Key = Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS)]
Score = Annotated[float, Field(ge=0.0, le=1.0)]


def _finite(values: list[float] | None) -> list[float] | None:
    if values is not None and not all(math.isfinite(v) for v in values):
        raise ValueError("must contain only finite numbers (no NaN or inf)")
    return values


class Event(BaseModel):
    """Fields every event carries. `topic` and `key_field` are class-level routing facts."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    topic: ClassVar[str]
    key_field: ClassVar[str]

    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: Annotated[str, Field(min_length=1, max_length=64)] = Field(default_factory=new_event_id)
    occurred_at_ms: Annotated[int, Field(ge=0)] = Field(default_factory=now_ms)

    def kafka_key(self) -> str:
        return str(getattr(self, self.key_field))


# --- cache.access.v1 ---------------------------------------------------------------------------


class CacheAccessed(Event):
    """A lookup against a tier node or an inference server's cache, hit or miss."""

    topic: ClassVar[str] = "cache.access.v1"
    key_field: ClassVar[str] = "key"
    type: Literal["cache.accessed"] = "cache.accessed"

    key: Key
    hit: bool
    kind: EntryKind = "prompt"
    model: str | None = None
    tier: Tier | None = None
    match: Literal["exact", "semantic"] | None = None
    similarity: Annotated[float, Field(ge=-1.0, le=1.0)] | None = None
    latency_ms: Annotated[float, Field(ge=0.0)] = 0.0
    layer: PenetrationLayer | None = None
    token_count: Annotated[int, Field(ge=0)] | None = None
    size_bytes: Annotated[int, Field(ge=0)] | None = None
    trace_id: str | None = None
    node_id: str | None = None
    service: str | None = None
    call_depth: Annotated[int, Field(ge=0)] | None = None
    shard: str | None = None


# Access events in one batch record, at most (a full batch stays well under the event size limit).
MAX_ACCESS_BATCH = 512


class CacheAccessBatch(Event):
    """Several `CacheAccessed` in one record, in the order they happened (vLLM's `KVEventBatch` does the
    same for KV events): what a busy producer sends so that consumers pay the per-record cost once per
    batch, not once per access. All of a batch's events belong on the partition of `key`; producers
    group them by the partition of each event's key (tiers does), so per-key order holds as for single
    records. `occurred_at_ms` is the newest event's time. Consumers treat it as its events in order
    (`access_events`)."""

    topic: ClassVar[str] = "cache.access.v1"
    key_field: ClassVar[str] = "key"
    type: Literal["cache.accessed.batch"] = "cache.accessed.batch"

    key: Key
    events: Annotated[list[CacheAccessed], Field(min_length=1, max_length=MAX_ACCESS_BATCH)]


def access_batch(events: list[CacheAccessed]) -> CacheAccessBatch:
    """One batch record of `events` (1 to MAX_ACCESS_BATCH, all on one partition), keyed by the first."""
    return CacheAccessBatch(
        key=events[0].key, events=events, occurred_at_ms=max(e.occurred_at_ms for e in events)
    )


def record_events(event: Event) -> list[Event]:
    """What one record stands for: a batch's events in order (`CacheAccessBatch`, `HeatScoredBatch`),
    or the event itself."""
    return list(event.events) if isinstance(event, CacheAccessBatch | HeatScoredBatch) else [event]


# --- kv.events.v1 ------------------------------------------------------------------------------


class KvBlockStored(Event):
    """An inference engine stored a KV block (vLLM `BlockStored`, one record per block)."""

    topic: ClassVar[str] = "kv.events.v1"
    key_field: ClassVar[str] = "block_hash"
    type: Literal["kv.block_stored"] = "kv.block_stored"

    block_hash: Key
    parent_block_hash: Key | None = None
    model: str | None = None
    block_size_tokens: Annotated[int, Field(gt=0)] | None = None
    size_bytes: Annotated[int, Field(ge=0)] | None = None
    medium: Literal["gpu", "cpu", "disk"] | None = None
    head_heat: Annotated[list[float], Field(max_length=MAX_HEADS)] | None = None
    trace_id: str | None = None
    node_id: str | None = None

    _check_heat = field_validator("head_heat")(_finite)


class KvBlockRemoved(Event):
    """An inference engine dropped a KV block."""

    topic: ClassVar[str] = "kv.events.v1"
    key_field: ClassVar[str] = "block_hash"
    type: Literal["kv.block_removed"] = "kv.block_removed"

    block_hash: Key
    model: str | None = None
    medium: Literal["gpu", "cpu", "disk"] | None = None
    node_id: str | None = None


class AttentionHeatReported(Event):
    """Per-head activation/gradient magnitudes for one step (head-heat sharding, docs/design.md §3.1)."""

    topic: ClassVar[str] = "kv.events.v1"
    key_field: ClassVar[str] = "block_hash"
    type: Literal["kv.attention_heat_reported"] = "kv.attention_heat_reported"

    block_hash: Key
    model: str | None = None
    layer: Annotated[int, Field(ge=0)] | None = None
    step: Annotated[int, Field(ge=0)] | None = None
    head_heat: Annotated[list[float], Field(min_length=1, max_length=MAX_HEADS)]
    node_id: str | None = None

    _check_heat = field_validator("head_heat")(_finite)


# --- cache.invalidate.v1 -----------------------------------------------------------------------


class CacheInvalidated(Event):
    """A write or delete: every node drops entries at least `similarity_threshold` similar
    (write-with-sync, docs/design.md §1.3). Without an embedding only the exact key goes."""

    topic: ClassVar[str] = "cache.invalidate.v1"
    key_field: ClassVar[str] = "key"
    type: Literal["cache.invalidated"] = "cache.invalidated"

    key: Key
    reason: Literal["write", "delete", "context_ended", "expired"] = "write"
    model: str | None = None
    embedding: Annotated[list[float], Field(min_length=1, max_length=MAX_EMBEDDING_DIM)] | None = None
    similarity_threshold: Score | None = None
    trace_id: str | None = None
    origin_node_id: str | None = None
    # 1 = the immediate delete, 2 = the delayed second delete (delayed double delete, docs/design.md §4.4).
    attempt: Annotated[int, Field(ge=1, le=2)] = 1
    # The written entry's prompt, when known: receiving nodes run the match guards with it, so a write
    # does not drop a neighbour that asks the opposite question.
    prompt_text: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] | None = None

    _check_embedding = field_validator("embedding")(_finite)


# --- context.lifecycle.v1 ----------------------------------------------------------------------


class ConversationStarted(Event):
    topic: ClassVar[str] = "context.lifecycle.v1"
    key_field: ClassVar[str] = "trace_id"
    type: Literal["context.conversation_started"] = "context.conversation_started"

    trace_id: Key
    model: str | None = None
    ttl_hint_ms: Annotated[int, Field(gt=0)] | None = None


class ConversationEnded(Event):
    """The conversation is over: entries bound to `trace_id` go (context lifecycle, docs/design.md §1.2)."""

    topic: ClassVar[str] = "context.lifecycle.v1"
    key_field: ClassVar[str] = "trace_id"
    type: Literal["context.conversation_ended"] = "context.conversation_ended"

    trace_id: Key


# --- source.changes.v1 -------------------------------------------------------------------------


def source_dependency_id(source: str, row_id: str) -> str:
    """The dependency id an entry lists (`context_dependency_ids`) to die with a source row:
    `row:<source>/<id>`, e.g. `row:orders/42`."""
    return f"row:{source}/{row_id}"


class SourceChanged(Event):
    """Rows of the application's source of truth changed: every entry listing
    `row:<source>/<id>` among its `context_dependency_ids` goes, and what depends on it, transitively."""

    topic: ClassVar[str] = "source.changes.v1"
    key_field: ClassVar[str] = "source"
    type: Literal["source.changed"] = "source.changed"

    source: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^/]+$")]
    ids: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=256)]],
        Field(min_length=1, max_length=MAX_KEYS_PER_EVENT),
    ]
    reason: Annotated[str, Field(min_length=1, max_length=200)] = "update"
    producer: str | None = None

    def dependency_ids(self) -> list[str]:
        return [source_dependency_id(self.source, i) for i in dict.fromkeys(self.ids)]


# --- heat.scores.v1 ----------------------------------------------------------------------------


class HeatScored(Event):
    topic: ClassVar[str] = "heat.scores.v1"
    key_field: ClassVar[str] = "key"
    type: Literal["heat.scored"] = "heat.scored"

    key: Key
    score: Score
    decision: Decision
    cluster: int | None = None
    model_version: Annotated[int, Field(ge=0)] = 0
    # The tier node the decision is for; None means every node.
    node_id: str | None = None


MAX_HEAT_BATCH = 512


class HeatScoredBatch(Event):
    """Several `HeatScored` in one record, in the order they were decided: what the heat service sends
    (one re-score round's decisions of one partition), so that consumers pay the per-record cost once
    per batch, not once per decision. As with `CacheAccessBatch`, all of a batch's decisions belong on
    the partition of `key` (the heat service groups them by the partition of each decision's key), so
    per-key order holds. `occurred_at_ms` is the newest decision's. Consumers treat it as its decisions
    in order (`record_events`)."""

    topic: ClassVar[str] = "heat.scores.v1"
    key_field: ClassVar[str] = "key"
    type: Literal["heat.scored.batch"] = "heat.scored.batch"

    key: Key
    events: Annotated[list[HeatScored], Field(min_length=1, max_length=MAX_HEAT_BATCH)]


def heat_batch(events: list[HeatScored]) -> HeatScoredBatch:
    """One batch record of `events` (1 to MAX_HEAT_BATCH, all on one partition), keyed by the first."""
    return HeatScoredBatch(
        key=events[0].key, events=events, occurred_at_ms=max(e.occurred_at_ms for e in events)
    )


def heat_decisions(event: Event) -> list[HeatScored] | None:
    """The decisions a `heat.scores.v1` record stands for, in order (a batch's, or the decision
    itself); None for an event of any other type."""
    if isinstance(event, HeatScoredBatch):
        return list(event.events)
    return [event] if isinstance(event, HeatScored) else None


# --- stream.window.v1 --------------------------------------------------------------------------


class WindowComputed(Event):
    """Statistics of one window for one shard (and model, when set)."""

    topic: ClassVar[str] = "stream.window.v1"
    key_field: ClassVar[str] = "shard"
    type: Literal["stream.window_computed"] = "stream.window_computed"

    shard: Key
    model: str | None = None
    window: Literal["tumbling_1s", "hopping_10s"]
    window_start_ms: Annotated[int, Field(ge=0)]
    window_end_ms: Annotated[int, Field(ge=0)]
    requests: Annotated[int, Field(ge=0)]
    qps: Annotated[float, Field(ge=0.0)]
    entropy_bits: Annotated[float, Field(ge=0.0)]
    hit_rate: Score
    hit_rate_by_tier: dict[str, Score] = Field(default_factory=dict)
    penetration_by_layer: dict[str, Score] = Field(default_factory=dict)
    added_latency_ms_by_layer: dict[str, float] = Field(default_factory=dict)
    miss_latency_ms_p50: float | None = None
    miss_latency_ms_p95: float | None = None
    # Added within v1 (optional): exact counts behind the rates above.
    hits: Annotated[int, Field(ge=0)] | None = None
    distinct_keys: Annotated[int, Field(ge=0)] | None = None
    penetrated: Annotated[int, Field(ge=0)] | None = None
    latency_spikes: Annotated[int, Field(ge=0)] | None = None


class RequestPenetrated(Event):
    """A request missed the model, sequence and token layers (docs/design.md §2.3): warm it up."""

    topic: ClassVar[str] = "stream.window.v1"
    key_field: ClassVar[str] = "shard"
    type: Literal["stream.request_penetrated"] = "stream.request_penetrated"

    shard: Key
    key: Key
    model: str | None = None
    trace_id: str | None = None
    latency_ms: Annotated[float, Field(ge=0.0)] = 0.0


class LatencySpikeDetected(Event):
    """RTT above the spike threshold (320 ms, docs/design.md §2.5) and the warmup mismatch Δt."""

    topic: ClassVar[str] = "stream.window.v1"
    key_field: ClassVar[str] = "shard"
    type: Literal["stream.latency_spike_detected"] = "stream.latency_spike_detected"

    shard: Key
    key: Key
    rtt_ms: Annotated[float, Field(ge=0.0)]
    t_peak_ms: Annotated[int, Field(ge=0)] | None = None
    t_warm_ms: Annotated[int, Field(ge=0)] | None = None
    delta_t_ms: int | None = None


# --- stream.drift.v1 ---------------------------------------------------------------------------


class DriftClustered(Event):
    """A DBSCAN cluster of keys in one window and its pattern (docs/design.md §2.4)."""

    topic: ClassVar[str] = "stream.drift.v1"
    key_field: ClassVar[str] = "cluster_id"
    type: Literal["stream.drift_clustered"] = "stream.drift_clustered"

    cluster_id: Key
    pattern: DriftPattern
    window_end_ms: Annotated[int, Field(ge=0)]
    keys: Annotated[list[Key], Field(max_length=MAX_KEYS_PER_EVENT)]
    size: Annotated[int, Field(ge=0)]
    duration_ms: Annotated[int, Field(ge=0)]
    variance: Annotated[float, Field(ge=0.0)]
    service_spread: Score
    # Added within v1 (optional): where the cluster was found and the DBSCAN radius used.
    shard: str | None = None
    window_start_ms: Annotated[int, Field(ge=0)] | None = None
    eps: Annotated[float, Field(ge=0.0)] | None = None


# --- tier.commands.v1 --------------------------------------------------------------------------


class _TierCommand(Event):
    topic: ClassVar[str] = "tier.commands.v1"
    key_field: ClassVar[str] = "node_id"

    # "*" addresses every tier node.
    node_id: Key = "*"
    keys: Annotated[list[Key], Field(min_length=1, max_length=MAX_KEYS_PER_EVENT)]
    reason: str | None = None


class WarmupRequested(_TierCommand):
    """Prefetch `keys` into `tier` so the load lands before the traffic peak (docs/design.md §2.5, §3.3)."""

    type: Literal["tier.warmup_requested"] = "tier.warmup_requested"
    tier: Tier = "l1"
    start_at_ms: Annotated[int, Field(ge=0)] | None = None
    deadline_ms: Annotated[int, Field(ge=0)] | None = None  # for a conversation: its next turn, expected
    # Added within v1 (optional): the conversation a conversation warmup is for, so that a gateway
    # routing it can prefill its prompt on the instance the conversation is routed to.
    trace_id: str | None = None


class PromotionRequested(_TierCommand):
    type: Literal["tier.promotion_requested"] = "tier.promotion_requested"
    to_tier: Tier = "l1"


class EvictionRequested(_TierCommand):
    type: Literal["tier.eviction_requested"] = "tier.eviction_requested"


# --- warmup.records.v1 -------------------------------------------------------------------------

WarmupSource = Literal["drift", "penetration", "conversation", "neighbours"]
HeadClass = Literal["cold", "warm", "hot"]


class WarmupDecided(Event):
    """What the warmup service decided and why: `warm` (a command went out, `command_event_id`) or
    `hold` (outside the QPS/entropy band, budget spent, no window yet; the reason says which)."""

    topic: ClassVar[str] = "warmup.records.v1"
    key_field: ClassVar[str] = "shard"
    type: Literal["warmup.decided"] = "warmup.decided"

    shard: Key = "*"
    source: WarmupSource
    action: Literal["warm", "hold"]
    reason: Annotated[str, Field(max_length=1000)]
    keys: Annotated[list[Key], Field(max_length=MAX_KEYS_PER_EVENT)]
    node_id: Key = "*"
    tier: Tier = "l1"
    bytes: Annotated[int, Field(ge=0)] = 0
    command_event_id: str | None = None
    start_at_ms: Annotated[int, Field(ge=0)] | None = None
    window_end_ms: Annotated[int, Field(ge=0)] | None = None
    cluster_id: str | None = None
    qps: Annotated[float, Field(ge=0.0)] | None = None
    entropy_bits: Annotated[float, Field(ge=0.0)] | None = None
    dropped_by_budget: Annotated[int, Field(ge=0)] = 0


class WarmupMeasured(Event):
    """Δt = t_peak - t_warm of one warmup (docs/design.md §2.5): >= 0 means the load landed before the
    peak."""

    topic: ClassVar[str] = "warmup.records.v1"
    key_field: ClassVar[str] = "shard"
    type: Literal["warmup.measured"] = "warmup.measured"

    shard: Key
    t_warm_ms: Annotated[int, Field(ge=0)]
    t_peak_ms: Annotated[int, Field(ge=0)]
    delta_t_ms: int


class WarmupApplied(Event):
    """What a tier node did with a warmup or promotion command (one record per command)."""

    topic: ClassVar[str] = "warmup.records.v1"
    key_field: ClassVar[str] = "node_id"
    type: Literal["warmup.applied"] = "warmup.applied"

    node_id: Key
    command_event_id: str
    tier: Tier
    loaded: Annotated[int, Field(ge=0)]
    already_present: Annotated[int, Field(ge=0)] = 0
    missing: Annotated[int, Field(ge=0)] = 0
    from_peers: Annotated[int, Field(ge=0)] = 0
    from_l3: Annotated[int, Field(ge=0)] = 0


class ShardPlanned(Event):
    """Head-heat sharding (docs/design.md §3.1): each attention head's score and class, for routing."""

    topic: ClassVar[str] = "warmup.records.v1"
    key_field: ClassVar[str] = "model"
    type: Literal["warmup.shard_planned"] = "warmup.shard_planned"

    model: Key
    scores: Annotated[list[Score], Field(max_length=MAX_HEADS)]
    classes: Annotated[list[HeadClass], Field(max_length=MAX_HEADS)]
    steps: Annotated[int, Field(ge=0)]


# --- tier.status.v1 ----------------------------------------------------------------------------

TierMode = Literal["normal", "local_only"]


class TierModeChanged(Event):
    """A tier node changed how it serves (release safety, docs/design.md §4.4): `local_only` when its hit
    rate over the window fell below `enter_below` (other nodes' L2 is no longer asked), `normal` once the
    rate held at `exit_at` or above for the hold. `hit_rate`, `hits` and `lookups` are the window's at the
    change."""

    topic: ClassVar[str] = "tier.status.v1"
    key_field: ClassVar[str] = "node_id"
    type: Literal["tier.mode_changed"] = "tier.mode_changed"

    node_id: Key
    mode: TierMode
    previous_mode: TierMode
    reason: Annotated[str, Field(max_length=300)]
    hit_rate: Score
    hits: Annotated[int, Field(ge=0)]
    lookups: Annotated[int, Field(ge=0)]
    window_ms: Annotated[int, Field(gt=0)]
    enter_below: Score
    exit_at: Score
    # How long the node was in `previous_mode`; all its time local-only so far (this period included).
    in_previous_ms: Annotated[int, Field(ge=0)]
    local_only_ms: Annotated[int, Field(ge=0)] = 0
    changes: Annotated[int, Field(ge=1)] = 1


# --- invalidation.records.v1 -------------------------------------------------------------------

InvalidationCause = Literal["invalidated", "conversation_ended", "source_changed"]
WalkBound = Literal["max_depth", "max_dependants"]


class InvalidationRecorded(Event):
    """What the invalidation service removed and why: the dependants of `roots` (a written key, an
    ended conversation, changed source rows), one record per eviction command (`chunk` of `chunks`)."""

    topic: ClassVar[str] = "invalidation.records.v1"
    key_field: ClassVar[str] = "root"
    type: Literal["invalidation.recorded"] = "invalidation.recorded"

    root: Key
    cause: InvalidationCause
    reason: Annotated[str, Field(max_length=200)] | None = None
    roots: Annotated[list[Key], Field(min_length=1, max_length=MAX_KEYS_PER_EVENT)]
    source_event_id: str
    keys: Annotated[list[Key], Field(max_length=MAX_KEYS_PER_EVENT)]
    chunk: Annotated[int, Field(ge=0)] = 0
    chunks: Annotated[int, Field(ge=1)] = 1
    dependants: Annotated[int, Field(ge=0)]
    # The deepest level that yielded dependants (1: entries naming a root directly).
    depth: Annotated[int, Field(ge=0)]
    # True when a bound stopped the walk: some dependants may remain.
    truncated: bool = False
    bound: WalkBound | None = None
    command_event_id: str | None = None
    node_id: Key = "*"
    l3_deleted: Annotated[int, Field(ge=0)] = 0


AnyEvent = Annotated[
    CacheAccessed
    | CacheAccessBatch
    | KvBlockStored
    | KvBlockRemoved
    | AttentionHeatReported
    | CacheInvalidated
    | ConversationStarted
    | ConversationEnded
    | HeatScored
    | HeatScoredBatch
    | WindowComputed
    | RequestPenetrated
    | LatencySpikeDetected
    | DriftClustered
    | WarmupRequested
    | PromotionRequested
    | EvictionRequested
    | WarmupDecided
    | WarmupMeasured
    | WarmupApplied
    | ShardPlanned
    | SourceChanged
    | InvalidationRecorded
    | TierModeChanged,
    Field(discriminator="type"),
]

# Each type once: the union above is the list.
EVENT_TYPES: dict[str, type[Event]] = {
    cls.model_fields["type"].default: cls for cls in get_args(get_args(AnyEvent)[0])
}

EVENT_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)
