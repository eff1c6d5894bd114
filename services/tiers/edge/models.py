"""The request and response bodies of the tier node's HTTP API (pydantic; they make its OpenAPI
document). Bounds live here so a bad body is refused before a route runs."""

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from schemas.descriptor import DEFAULT_SIMILARITY_FLOOR, MAX_DEPENDENCIES, MAX_TAGS
from schemas.events import MAX_KEY_CHARS, EntryKind, Tier
from services.tiers import codec


def encodable(text: str) -> str:
    """A string UTF-8 can encode (JSON may carry a lone surrogate; nothing downstream can store it)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return text


def storable(text: str) -> str:
    """A string Postgres text can hold: encodable and without NUL. Refused here as a 422; later it would
    fail in L3 and count against the circuit breaker, so garbage input could degrade every lookup."""
    if "\x00" in text:
        raise ValueError("must not contain NUL (\\u0000)")
    return encodable(text)


Encodable = Annotated[str, AfterValidator(encodable)]
Storable = Annotated[str, AfterValidator(storable)]
DTypeName = Literal["float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]

Key = Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS), AfterValidator(storable)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
TagName = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(storable)]
TagValue = Annotated[str, Field(max_length=4096), AfterValidator(storable)]
Tags = Annotated[dict[TagName, TagValue], Field(max_length=MAX_TAGS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TensorIn(_Strict):
    dtype: DTypeName
    shape: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=codec.MAX_NDIM)]
    data_b64: str = Field(description="little-endian, C order; bfloat16 as its 16-bit patterns")


class ValueIn(_Strict):
    """Exactly one of `text` (an answer, stored as UTF-8) or `tensor`."""

    text: Encodable | None = None
    tensor: TensorIn | None = None


class EmbeddingFields(_Strict):
    embedding: list[Finite] | None = Field(default=None, description="float vector of the cache's dimension")
    embedding_b64: str | None = Field(default=None, description="the same as base64 little-endian float32")


class PutBody(EmbeddingFields):
    value: ValueIn
    model: Annotated[str, Field(min_length=1, max_length=256), AfterValidator(storable)]
    kind: EntryKind = "prompt"
    embed_text: Storable | None = Field(
        default=None,
        description=(
            "embed this text (the prompt) with all-MiniLM-L6-v2 as the entry's embedding; it is kept as "
            "the entry's prompt_text, which the match guards compare with a lookup's text"
        ),
    )
    ttl_hint_ms: Annotated[int, Field(gt=0)] | None = None
    similarity_tolerance: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(
        default=None,
        description=f"cosine a semantic match of this entry must reach (default {DEFAULT_SIMILARITY_FLOOR}); "
        "a lookup's "
        "tolerance can only make it stricter",
    )
    invalidate_threshold: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(
        default=None, description="cosine at which other entries are invalidated (default: the tolerance)"
    )
    context_dependency_ids: Annotated[list[Key], Field(max_length=MAX_DEPENDENCIES)] = Field(
        default_factory=list
    )
    trace_id: Key | None = None
    semantic_tags: Annotated[dict[TagName, TagValue], Field(max_length=MAX_TAGS)] = Field(
        default_factory=dict
    )
    layer_range: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]] = (0, 0)
    token_range: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]] = (0, 0)


class LookupBody(EmbeddingFields):
    """A key, an embedding, a text (embedded here), or a key with either: the exact key goes first."""

    key: Key | None = None
    text: Encodable | None = Field(
        default=None, description="embedded here; the match guards compare it with the entries' prompts"
    )
    model: Storable | None = None
    tolerance: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(
        default=None,
        description="cosine floor for a semantic match; the stricter of it and the entry's "
        "similarity_tolerance applies",
    )
    trace_id: Key | None = None
    include_value: bool = True


class FeedbackBody(EmbeddingFields):
    """Whether the entry `key` answered a request (given by its text or embedding) correctly."""

    key: Key
    text: Encodable | None = None
    correct: bool
    explored: bool = Field(
        default=False,
        description="true: the lookup was a miss to explore (explore_key) and `correct` says whether the "
        "model's answer agreed with the entry's; false: a rating of an answer that was served",
    )


class FeedbackOut(BaseModel):
    key: str
    similarity: float = Field(description="cosine between the request and the entry's embedding")
    correct: bool
    learned: bool = Field(
        description="false: the request is the entry's own text (an exact match), which teaches the "
        "similarity threshold nothing; the label was not kept"
    )
    labels: int = Field(description="labels this node holds for the entry")
    threshold: float = Field(description="the similarity a candidate of this entry now needs")


class BatchBody(_Strict):
    requests: Annotated[list[LookupBody], Field(min_length=1)]


class ValueOut(BaseModel):
    kind: EntryKind
    model: str
    dtype: str
    shape: list[int]
    layer_range: tuple[int, int]
    token_range: tuple[int, int]
    checksum: int
    size_bytes: int
    text: str | None = None
    data_b64: str | None = None


class DescriptorOut(BaseModel):
    key: str
    kind: EntryKind
    model: str
    similarity_tolerance: float
    ttl_hint_ms: int | None
    trace_id: str | None
    context_dependency_ids: list[str]
    semantic_tags: dict[str, str]
    created_at_ms: int
    updated_at_ms: int
    size_bytes: int
    prompt_text: str | None = None


class LookupOut(BaseModel):
    hit: bool
    key: str | None = None
    tier: Tier | None = None
    match: Literal["exact", "semantic"] | None = None
    similarity: float | None = None
    latency_us: float
    degraded: bool = Field(description="L3 was skipped (circuit breaker open) or failed")
    remote: bool = Field(default=False, description="tier l2 of another node: its pool served the value")
    peer: str | None = Field(default=None, description="that node's block server (host:port)")
    explore_key: str | None = Field(
        default=None,
        description="a miss the learned decision explores: ask the model, then POST /v1/feedback with "
        "this key, explored true and whether the answers agree",
    )
    miss_rule: str | None = Field(
        default=None,
        description="why a semantic lookup missed: the rule that refused its best candidate (threshold, "
        "floor, guard:<name>, uncertain) or 'no candidate'; `similarity` is that candidate's",
    )
    miss_reason: str | None = Field(default=None, description="the same in words")
    descriptor: DescriptorOut | None = None
    value: ValueOut | None = None
    value_omitted: bool = False
    explore_value: ValueOut | None = Field(
        default=None,
        description="with explore_key (and include_value): that entry's value, to compare with the "
        "model's answer",
    )


class BatchOut(BaseModel):
    results: list[LookupOut]


class PutOut(BaseModel):
    key: str
    size_bytes: int
    tiers: list[Tier]
    persisted: bool = Field(description="False: queued for L3 (circuit breaker open)")
    invalidated_local: list[str]
    updated_at_ms: int


class DeleteOut(BaseModel):
    key: str
    deleted: bool


# --- KV-block prefixes (prefix.py) ---------------------------------------------------------------

# A hard ceiling; the node's own bound is `max_batch` (413 beyond it).
_MAX_CHAIN = 100_000


class PrefixBody(_Strict):
    """A prompt's KV blocks in order, as the engine chunked it (vLLM block hashes, LMCache chunk keys)."""

    keys: Annotated[list[Key], Field(min_length=1, max_length=_MAX_CHAIN)]
    model: str | None = None
    block_size_tokens: Annotated[int, Field(gt=0)] | None = Field(
        default=None, description="tokens per block: given, the answer also counts the prefix in tokens"
    )


class PrefixBlock(BaseModel):
    key: str
    tier: Tier
    node: str = Field(description="the node holding it: this node's id, or the block server of a peer")
    remote: bool
    size_bytes: int


class PrefixOut(BaseModel):
    requested: int
    prefix_blocks: int = Field(description="how many leading blocks of the chain are cached")
    prefix_tokens: int | None = None
    first_miss: str | None = Field(default=None, description="the first key not cached (None: all are)")
    blocks: list[PrefixBlock] = Field(description="where each block of the cached prefix is")


class BlockPutResult(BaseModel):
    key: str
    status: Literal["stored", "present"] = Field(description="present: the node held this block already")
    tiers: list[Tier]


class BlocksPutOut(BaseModel):
    stored: int
    present: int
    results: list[BlockPutResult]


class LocatedBlock(BaseModel):
    key: str
    spans: list[tuple[int, int]] = Field(description="(byte offset, length) in the segment, in order")
    nbytes: int
    crc32: int = Field(description="of the whole value: what a reader checks the copied bytes against")


class LocateOut(BaseModel):
    segment: str | None = Field(description="the shared-memory segment of the node's L2 (None: not shared)")
    segment_bytes: int
    blocks: list[LocatedBlock] = Field(description="the leading keys held in L2, up to the first that is not")


class FetchBody(_Strict):
    keys: Annotated[list[Key], Field(min_length=1, max_length=_MAX_CHAIN)]
    model: str | None = None
