"""Decoding vLLM's KV-event messages from bytes built as vLLM builds them (tests/vllm_events.py), in each
generation of the format, and a precise reason for every kind of bad message."""

from __future__ import annotations

import hashlib

import msgpack
import pytest

from services.bridge.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    WireError,
    decode_batch,
    hash_key,
    seq_of,
    split_frames,
)
from tests.vllm_events import Batch, Cleared, Removed, Stored, encode, seq_bytes

H = [hashlib.sha256(bytes([i])).digest() for i in range(4)]
VERSIONS = ["array-first", "array", "map-events", "map"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_event_type_decodes(version: str) -> None:
    batch = Batch(
        ts=1_700_000_000.25,
        events=[
            Stored([H[1], H[2]], H[0], list(range(32)), 16, lora_id=None, medium="GPU"),
            Removed([H[1]], medium="CPU"),
            Cleared(),
        ],
        data_parallel_rank=0 if version != "array-first" else None,
    )
    got = decode_batch(encode(batch, version))  # type: ignore[arg-type]
    assert got.ts == 1_700_000_000.25
    assert got.data_parallel_rank == batch.data_parallel_rank
    stored, removed, cleared = got.events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == (H[1], H[2]) and stored.parent_block_hash == H[0]
    assert stored.block_size == 16 and stored.token_count == 32 and stored.token_ids == tuple(range(32))
    assert stored.medium == (None if version == "array-first" else "GPU")
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == (H[1],)
    assert removed.medium == (None if version == "array-first" else "CPU")
    assert isinstance(cleared, AllBlocksCleared)


def test_the_array_form_is_exactly_tag_then_fields_in_declaration_order() -> None:
    # What msgspec writes for KVEventBatch(ts=1.5, events=[BlockStored(...)], data_parallel_rank=2).
    raw = msgpack.packb(
        [1.5, [["BlockStored", [7, 8], None, list(range(1, 9)), 4, 3, "GPU", "adapter", None, 1]], 2]
    )
    got = decode_batch(raw)
    (stored,) = got.events
    assert stored == BlockStored((7, 8), None, tuple(range(1, 9)), 4, 3, "GPU", "adapter")
    assert got.data_parallel_rank == 2


def test_a_batch_as_captured_from_vllm_0_26() -> None:
    # kthena#1535: an array batch whose events are maps (vllm#42892), integer hashes, optional fields.
    raw = msgpack.packb(
        [
            1789095808.8378847,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [15760518052499183552],
                    "parent_block_hash": None,
                    "token_ids": list(range(16)),
                    "block_size": 16,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": [None],
                    "group_idx": 0,
                    "kv_cache_spec_kind": "full_attention",
                }
            ],
            0,
        ]
    )
    got = decode_batch(raw)
    assert got.events == (BlockStored((15760518052499183552,), None, tuple(range(16)), 16, None, "GPU"),)
    assert got.data_parallel_rank == 0


def test_token_ids_must_fill_the_blocks() -> None:
    with pytest.raises(WireError, match="3 token ids for 1 blocks of 4"):
        decode_batch(encode(Batch(1.0, [Stored([1], None, [0, 1, 2], 4)])))


def test_integer_hashes_and_a_first_block_without_parent() -> None:
    got = decode_batch(encode(Batch(1.0, [Stored([2**63 + 5, 11], None, [0] * 8, 4)])))
    (stored,) = got.events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == (2**63 + 5, 11) and stored.parent_block_hash is None
    assert [hash_key(h) for h in stored.block_hashes] == [str(2**63 + 5), "11"]
    assert hash_key(H[0]) == H[0].hex()


def test_fields_a_newer_release_appends_are_ignored() -> None:
    raw = msgpack.packb([1.0, [["BlockRemoved", [1], "GPU", 0, "something-new"]]])
    assert decode_batch(raw).events == (BlockRemoved((1,), "GPU"),)


@pytest.mark.parametrize(
    ("payload", "kind", "words"),
    [
        (b"\xc1\xc1\xc1", "malformed_msgpack", "msgpack"),
        (b"", "malformed_msgpack", ""),
        (msgpack.packb(42), "invalid", "KVEventBatch is int"),
        (msgpack.packb([1.0]), "invalid", "at least 2"),
        (msgpack.packb(["now", []]), "invalid", "ts is str"),
        (msgpack.packb([1.0, {}]), "invalid", "events is dict"),
        (msgpack.packb([1.0, [], "zero"]), "invalid", "data_parallel_rank"),
        (msgpack.packb([1.0, [["BlockEvicted", [1]]]]), "unknown_tag", "'BlockEvicted'"),
        (msgpack.packb([1.0, [{"type": "Nope"}]]), "unknown_tag", "'Nope'"),
        (msgpack.packb([1.0, [7]]), "invalid", "events[0] is int"),
        (msgpack.packb([1.0, [["BlockStored", [1], None]]]), "invalid", "at least 5"),
        (msgpack.packb([1.0, [["BlockStored", [1.5], None, [1], 1, None]]]), "invalid", "block_hashes[0]"),
        (msgpack.packb([1.0, [["BlockStored", [1], "p", [1], 1, None]]]), "invalid", "parent_block_hash"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, [1], 0, None]]]), "invalid", "block_size 0"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, "abc", 4, None]]]), "invalid", "token_ids"),
        (msgpack.packb([1.0, [["BlockStored", 1, None, [1], 4, None]]]), "invalid", "not a list"),
        (msgpack.packb([1.0, [["BlockRemoved"]]]), "invalid", "at least 1"),
        (msgpack.packb([1.0, [["BlockRemoved", [1], 5]]]), "invalid", "medium is int"),
        (msgpack.packb([1.0, [{"type": "BlockRemoved"}]]), "invalid", "lacks block_hashes"),
        (msgpack.packb([1.0, [["BlockStored", [True], None, [1], 4, None]]]), "invalid", "bool"),
    ],
)
def test_bad_payloads_say_why(payload: bytes, kind: str, words: str) -> None:
    with pytest.raises(WireError) as err:
        decode_batch(payload)
    assert err.value.kind == kind
    assert words in err.value.reason


def test_frames() -> None:
    assert split_frames([b"kv-events", seq_bytes(5), b"x"]) == (b"kv-events", 5, b"x")
    assert seq_of(seq_bytes(-1)) == -1
    with pytest.raises(WireError) as err:
        split_frames([b"kv-events", seq_bytes(5)])
    assert err.value.kind == "bad_frames"
    with pytest.raises(WireError) as err:
        split_frames([b"t", b"\x00\x01", b"x"])
    assert err.value.kind == "bad_seq"
