"""vLLM KV-event payloads built as vLLM's publisher builds them (vllm/distributed/kv_events.py, encoded
by `msgspec.msgpack.Encoder`), with msgpack instead of msgspec, for the bridge's tests.

msgspec encodes a `tag=True` struct under `array_like=True` as `[ClassName, field, ...]` in declaration
order, and under `omit_defaults=True` leaves out trailing fields still at their default; without
`array_like` as a map whose first key is "type". Floats are float64, bytes are msgpack bin, both as
msgpack-python packs them by default. The generations of the format (read from vLLM's source at
commits b4e69e0 (the first) and 0181ea3 (main), the rest from the projects that adapted to them):

- "array-first": array_like; BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id),
            BlockRemoved(block_hashes); batch [ts, events]
- "array": array_like; BlockStored(..., lora_id, medium), BlockRemoved(block_hashes, medium);
            batch [ts, events, data_parallel_rank] (rank omitted while None)
- "map-events": vllm#42892 (June 2026) dropped array_like from the events: each a map, tag under
            "type", BlockStored(..., medium, lora_name, extra_keys=None, group_idx=None,
            kv_cache_spec_kind=None, kv_cache_spec_sliding_window=None), BlockRemoved(block_hashes,
            medium, group_idx=None); the batch still [ts, events, rank] (as captured from v0.26.0)
- "map": as "map-events", and the batch a map too {ts, events, data_parallel_rank=None} (main)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack

Version = Literal["array-first", "array", "map-events", "map"]
Hash = bytes | int


@dataclass(frozen=True)
class Stored:
    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"
    lora_name: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True)
class Removed:
    block_hashes: list[Hash]
    medium: str | None = "GPU"
    group_idx: int | None = None


@dataclass(frozen=True)
class Cleared:
    pass


@dataclass(frozen=True)
class Batch:
    ts: float
    events: list[Stored | Removed | Cleared] = field(default_factory=list)
    data_parallel_rank: int | None = None


def _trim(values: list[Any], required: int) -> list[Any]:
    """omit_defaults on an array-like struct: trailing optional fields still None are left out."""
    while len(values) > required and values[-1] is None:
        values.pop()
    return values


def event_obj(event: Stored | Removed | Cleared, version: Version) -> Any:
    if isinstance(event, Stored):
        required = [
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            event.lora_id,
        ]
        if version == "array-first":
            return ["BlockStored", *required]
        if version == "array":
            return ["BlockStored", *required, event.medium]
        out: dict[str, Any] = {"type": "BlockStored"}
        names = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id")
        out.update(zip(names, required, strict=True))
        out["medium"] = event.medium
        out["lora_name"] = event.lora_name
        if event.group_idx is not None:
            out["group_idx"] = event.group_idx
        return out
    if isinstance(event, Removed):
        if version == "array-first":
            return ["BlockRemoved", event.block_hashes]
        if version == "array":
            return ["BlockRemoved", event.block_hashes, event.medium]
        out = {"type": "BlockRemoved", "block_hashes": event.block_hashes, "medium": event.medium}
        if event.group_idx is not None:
            out["group_idx"] = event.group_idx
        return out
    return ["AllBlocksCleared"] if version in ("array-first", "array") else {"type": "AllBlocksCleared"}


def encode(batch: Batch, version: Version = "array") -> bytes:
    events = [event_obj(e, version) for e in batch.events]
    obj: Any
    if version == "array-first":
        obj = [batch.ts, events]
    elif version in ("array", "map-events"):
        obj = _trim([batch.ts, events, batch.data_parallel_rank], 2)
    else:
        obj = {"ts": batch.ts, "events": events}
        if batch.data_parallel_rank is not None:
            obj["data_parallel_rank"] = batch.data_parallel_rank
    return msgpack.packb(obj, use_bin_type=True)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)
