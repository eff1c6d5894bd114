"""vLLM's KV-event wire format, decoded without I/O: the ZMQ frames [topic, seq, payload] and the
msgpack `KVEventBatch` in them, with a precise reason for everything that cannot be decoded.

Reference: vllm/distributed/kv_events.py (msgspec structs, `tag=True`, `omit_defaults=True`; read at
commits b4e69e0 and 0181ea3). Batches and events come as arrays (until vllm#42892) or maps; every
combination is accepted. The encodings and the field order: docs/bridge.md ("vLLM's KV-event wire
format").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

WireKind = Literal["bad_frames", "bad_seq", "oversized", "malformed_msgpack", "invalid", "unknown_tag"]

END_OF_REPLAY = -1
# Everything after the tag, in declaration order (kv_events.py); the first `required` always come.
STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
STORED_REQUIRED = 5
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
REMOVED_REQUIRED = 1
BATCH_FIELDS = ("ts", "events", "data_parallel_rank")

BlockHash = bytes | int


class WireError(ValueError):
    def __init__(self, kind: WireKind, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind: WireKind = kind
        self.reason = reason


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    # What else the engine hashed into these blocks (multimodal inputs, a cache salt), per block or
    # None: a block with any is keyed apart from a text-only block of the same tokens.
    extra_keys: tuple[Any, ...] | None = None

    @property
    def token_count(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class Batch:
    ts: float
    events: tuple[KvEvent, ...]
    data_parallel_rank: int | None = None


def seq_of(frame: bytes) -> int:
    """The sequence number frame: 8 bytes, big-endian, signed (so the replay's end marker is -1)."""
    if len(frame) != 8:
        raise WireError("bad_seq", f"sequence frame has {len(frame)} bytes, not 8")
    return int.from_bytes(frame, "big", signed=True)


def split_frames(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """A PUB message: (topic, seq, payload)."""
    if len(frames) != 3:
        raise WireError("bad_frames", f"expected 3 frames [topic, seq, payload], got {len(frames)}")
    topic, seq, payload = frames
    return topic, seq_of(seq), payload


def decode_batch(payload: bytes) -> Batch:
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise WireError("malformed_msgpack", f"not msgpack ({type(exc).__name__}: {exc})") from None
    fields = _fields(raw, BATCH_FIELDS, 2, "KVEventBatch")
    ts, events, rank = fields["ts"], fields["events"], fields.get("data_parallel_rank")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise WireError("invalid", f"KVEventBatch.ts is {type(ts).__name__}, not a number")
    if not isinstance(events, list):
        raise WireError("invalid", f"KVEventBatch.events is {type(events).__name__}, not a list")
    if rank is not None and not _is_int(rank):
        raise WireError("invalid", "KVEventBatch.data_parallel_rank is not an integer")
    return Batch(float(ts), tuple(_event(e, i) for i, e in enumerate(events)), rank)


def _event(raw: Any, index: int) -> KvEvent:
    where = f"events[{index}]"
    body: list[Any] | dict[Any, Any]
    if isinstance(raw, list) and raw:
        tag, body = raw[0], raw[1:]
    elif isinstance(raw, dict):
        tag, body = raw.get("type"), raw
    else:
        raise WireError("invalid", f"{where} is {type(raw).__name__}, not a tagged array or map")
    if tag == "BlockStored":
        f = _fields(body, STORED_FIELDS, STORED_REQUIRED, f"{where} BlockStored")
        tokens, size = f["token_ids"], f["block_size"]
        if not isinstance(tokens, list) or not all(_is_int(t) for t in tokens):
            raise WireError("invalid", f"{where} BlockStored.token_ids is not a list of integers")
        if not _is_int(size) or size <= 0:
            raise WireError("invalid", f"{where} BlockStored.block_size {size!r} is not a positive integer")
        parent = f["parent_block_hash"]
        if parent is not None:
            parent = _hash(parent, f"{where} BlockStored.parent_block_hash")
        hashes = _hashes(f["block_hashes"], f"{where} BlockStored")
        if len(tokens) != len(hashes) * size:
            raise WireError(
                "invalid",
                f"{where} BlockStored has {len(tokens)} token ids for {len(hashes)} blocks of {size}",
            )
        lora, lora_name, extra = f.get("lora_id"), f.get("lora_name"), f.get("extra_keys")
        if extra is not None and (not isinstance(extra, list) or len(extra) != len(hashes)):
            raise WireError("invalid", f"{where} BlockStored.extra_keys is not one entry per block")
        return BlockStored(
            hashes,
            parent,
            tuple(tokens),
            size,
            lora if _is_int(lora) else None,
            _medium(f.get("medium"), where),
            lora_name if isinstance(lora_name, str) else None,
            None if extra is None or all(e is None for e in extra) else tuple(extra),
        )
    if tag == "BlockRemoved":
        f = _fields(body, REMOVED_FIELDS, REMOVED_REQUIRED, f"{where} BlockRemoved")
        return BlockRemoved(
            _hashes(f["block_hashes"], f"{where} BlockRemoved"), _medium(f.get("medium"), where)
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise WireError(
        "unknown_tag", f"{where} has tag {tag!r}; known: BlockStored, BlockRemoved, AllBlocksCleared"
    )


def _fields(raw: Any, names: tuple[str, ...], required: int, what: str) -> dict[str, Any]:
    """An array-like struct (positional) or a map, as a dict of the known fields."""
    if isinstance(raw, list):
        if len(raw) < required:
            raise WireError("invalid", f"{what} has {len(raw)} fields; at least {required} expected")
        # Fields a newer release appended beyond the ones known here are ignored, as msgspec does.
        return dict(zip(names, raw, strict=False))
    if isinstance(raw, dict):
        missing = [n for n in names[:required] if n not in raw]
        if missing:
            raise WireError("invalid", f"{what} lacks {', '.join(missing)}")
        return {n: raw[n] for n in names if n in raw}
    raise WireError("invalid", f"{what} is {type(raw).__name__}, not an array or a map")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _hash(v: Any, what: str) -> BlockHash:
    if isinstance(v, bytes) and v:
        return v
    if _is_int(v):
        return int(v)
    raise WireError("invalid", f"{what} is {type(v).__name__}, not a block hash (bytes or int)")


def _hashes(v: Any, what: str) -> tuple[BlockHash, ...]:
    if not isinstance(v, list):
        raise WireError("invalid", f"{what}.block_hashes is {type(v).__name__}, not a list")
    return tuple(_hash(h, f"{what}.block_hashes[{i}]") for i, h in enumerate(v))


def _medium(v: Any, where: str) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise WireError("invalid", f"{where} medium is {type(v).__name__}, not a string")


def hash_key(h: BlockHash) -> str:
    """A block hash as a `kv.events.v1` key: a digest in hex, an integer in decimal (an engine uses
    one kind throughout: `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` decides)."""
    return h.hex() if isinstance(h, bytes) else str(h)
