"""Settings of the gateway (env prefix `CACHEMESH_GATEWAY_`): its own API, the upstream model server,
the tier node it caches in, what is cacheable, and the bounds on requests, lookups and conversations."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServiceSettings

# Which sampling settings are cached (services/gateway/policy.py):
#   deterministic  only an explicit temperature 0 (or a `seed`);
#   unset_or_zero  also a request that leaves temperature unset (how most applications call);
#   all            every temperature (a repeated question gets the first answer it got).
SamplingPolicy = Literal["deterministic", "unset_or_zero", "all"]


class UpstreamConfig(BaseModel):
    """One engine instance behind the gateway."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=100)]
    url: str  # its OpenAI base, e.g. http://10.0.0.5:8000/v1
    # The `node_id` of its KV events (the bridge's engine id for it); default: `name`.
    engine_id: str | None = None


class GatewaySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CACHEMESH_GATEWAY_", frozen=True, extra="ignore")

    # --- the gateway's API -------------------------------------------------------------------
    api_host: str = "127.0.0.1"
    # 0 picks a free port (tests); /healthz reports the one in use.
    api_port: Annotated[int, Field(ge=0, le=65535)] = 8780
    # When set, every /v1 route needs `Authorization: Bearer <token>` (an OpenAI client's api_key).
    api_token: SecretStr | None = None

    # --- the upstream: any OpenAI-compatible server (vLLM: `vllm serve` on :8000) -------------
    upstream_url: str = "http://127.0.0.1:8000/v1"
    # Sent to the upstream as its bearer token. Unset (and no api_token here): the client's own
    # Authorization header is passed through.
    upstream_api_key: SecretStr | None = None
    # Several instances: CACHEMESH_GATEWAY_UPSTREAMS='[{"name": "a", "url": "http://a:8000/v1",
    # "engine_id": "vllm-a"}, ...]'. Each request goes to one, chosen by the prefix of its KV blocks each
    # holds (from kv.events.v1), what the tiers hold, load and conversation (services/gateway/routing.py);
    # one that fails before answering is retried on another. Empty: `upstream_url` alone.
    upstreams: list[UpstreamConfig] = Field(default_factory=list)
    # The model's directory (tokenizer and chat template) to compute a prompt's block keys as the
    # engine does; None: route by load and conversation only.
    routing_tokenizer_dir: str | None = None
    # The model identity in the block keys (the connector's `model`, the bridge's MODEL); None: the
    # request's `model`.
    routing_model: str | None = None
    routing_block_size: Annotated[int, Field(gt=0)] = 16
    # Blocks of prompt a request queued ahead is worth; a block the tiers hold against one an instance
    # holds (1.0); how much better another instance must be to move a conversation.
    routing_load_cost: Annotated[float, Field(ge=0.0)] = 4.0
    routing_tier_value: Annotated[float, Field(ge=0.0, le=1.0)] = 0.8
    routing_affinity_slack: Annotated[float, Field(ge=0.0)] = 8.0
    # Warm engines for a conversation's next turn: the blocks of each routed conversation's prompt go
    # out as `cache.accessed` (kind kv_block, its trace id) for the warmup service to follow, and its
    # commands naming a conversation are answered with a prefill on the conversation's instance, when
    # that instance is idle (services/gateway/warming.py). Needs several upstreams and the tokenizer.
    routing_warm: bool = True
    # A warm is sent only when the chance its conversation's turn comes while it still lives in the
    # engine (from the gaps between turns this gateway saw) reaches this.
    routing_warm_min_precision: Annotated[float, Field(ge=0.0, le=1.0)] = 0.8
    # How often each instance's queue is read from its /metrics.
    queue_poll_ms: Annotated[int, Field(gt=0)] = 500
    # How often each upstream (GET /v1/models) and the tier node (/healthz) are probed for the health
    # report, and how long a probe waits: an unreachable one makes the gateway `degraded`.
    probe_interval_ms: Annotated[int, Field(gt=0)] = 2_000
    probe_timeout_ms: Annotated[int, Field(gt=0)] = 1_000
    upstream_connect_timeout_ms: Annotated[int, Field(gt=0)] = 2_000
    # Whole answer (or, streaming, the gap between two chunks): generation takes seconds.
    upstream_timeout_ms: Annotated[int, Field(gt=0)] = 120_000
    upstream_max_connections: Annotated[int, Field(gt=0)] = 256
    # Circuit breaker on the upstream: opens when failures (5xx, timeouts, refused connections) make up
    # this share of the last `breaker_window` calls (at least `breaker_min_calls`), or on this many in a
    # row; then answers 503 at once (hits are still served) and lets one probe through per cooldown.
    breaker_failure_ratio: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5
    breaker_consecutive: Annotated[int, Field(gt=0)] = 5
    breaker_window: Annotated[int, Field(gt=0)] = 50
    breaker_min_calls: Annotated[int, Field(gt=0)] = 10
    breaker_cooldown_ms: Annotated[int, Field(gt=0)] = 5_000

    # --- the cache: a tier node's HTTP API ----------------------------------------------------
    tiers_url: str = "http://127.0.0.1:8700"
    tiers_token: SecretStr | None = None
    # A lookup (exact key, then the embedding of the prompt) that takes longer is abandoned and the
    # request goes upstream: the cache never holds a miss up for longer than this.
    lookup_timeout_ms: Annotated[int, Field(gt=0)] = 50
    # Hedging: a lookup that has not answered after this long no longer holds the request: it goes
    # upstream too, and whichever answers first wins (a hit then cancels the upstream call). A miss waits
    # at most this for the cache; a hit slower than this costs one aborted upstream request. None: off
    # (a miss waits for the lookup, up to lookup_timeout_ms; the upstream never sees a request the cache
    # answers).
    hedge_after_ms: Annotated[int, Field(ge=0)] | None = None
    # Writes of answers run in the background, after the answer went out; beyond this many in flight a
    # new one is skipped (counted), never queued without bound.
    max_pending_stores: Annotated[int, Field(gt=0)] = 256
    store_timeout_ms: Annotated[int, Field(gt=0)] = 5_000
    # A tier node that failed this many lookups in a row is skipped for the cooldown.
    cache_breaker_consecutive: Annotated[int, Field(gt=0)] = 5
    cache_breaker_cooldown_ms: Annotated[int, Field(gt=0)] = 2_000
    # Cosine a paraphrase must reach (the entry's similarity_tolerance; the tier node's guards and
    # match decision apply on top). None: the tier node's default (DEFAULT_SIMILARITY_FLOOR).
    similarity_tolerance: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    # A stored answer invalidates other entries only when their prompt embeds identically: entries of
    # other tenants or contexts that ask the same question are not this answer's to replace.
    invalidate_threshold: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    ttl_hint_ms: Annotated[int, Field(gt=0)] = 24 * 3_600_000
    # A miss the tier node wants explored (its learned decision's grey zone, sampled at its explore
    # rate: the exploration budget) is a label without a human: the model's answer is compared with the
    # candidate's stored one (services/gateway/answers.py `answers_agree`) and the result goes back to
    # the node (POST /v1/feedback, explored). It costs one comparison and one call, after the answer.
    label_explorations: bool = True
    # Prompts longer than this are matched by exact key only (the tier node embeds at most 8192 chars).
    max_semantic_chars: Annotated[int, Field(gt=0)] = 8_192

    # --- what is cached (services/gateway/policy.py) ------------------------------------------
    sampling_policy: SamplingPolicy = "unset_or_zero"
    # Requests that declare tools (or carry tool results) and answers that call tools: a tool call
    # acts on the world, so by default it is never answered from the cache.
    cache_tools: bool = False

    # --- bounds --------------------------------------------------------------------------------
    max_request_bytes: Annotated[int, Field(gt=0)] = 1 << 20
    max_messages: Annotated[int, Field(gt=0)] = 1_024
    # Answers above this are relayed but not stored (the tier node's value limit is 1 MiB).
    max_answer_bytes: Annotated[int, Field(gt=0)] = 1 << 20
    # A cached answer streamed back goes out in pieces of about this many characters.
    stream_chunk_chars: Annotated[int, Field(gt=0)] = 16

    # --- conversations (context.lifecycle.v1) --------------------------------------------------
    # A conversation not seen for this long ends (its entries go); 0: only the explicit end route.
    conversation_idle_ms: Annotated[int, Field(ge=0)] = 30 * 60_000
    idle_sweep_interval_ms: Annotated[int, Field(gt=0)] = 10_000
    # Conversations tracked at once; past it the longest idle one is forgotten (not ended).
    max_conversations: Annotated[int, Field(gt=0)] = 100_000
    # Served answers remembered for feedback by response id.
    max_feedback_refs: Annotated[int, Field(gt=0)] = 10_000

    @property
    def api_token_bytes(self) -> bytes | None:
        return self.api_token.get_secret_value().encode() if self.api_token is not None else None
