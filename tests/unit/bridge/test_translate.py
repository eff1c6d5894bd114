"""vLLM events as kv.events.v1: one event per block keyed by content (the model and the token ids, as the
connector and the gateway key them), parent links chained across batches, the engine as node_id, event
ids stable across re-sends and distinct across epochs, AllBlocksCleared as removals of the live blocks,
and a block whose history is unknown left out as an orphan."""

from __future__ import annotations

from cachemesh_client.kvkeys import block_keys

from schemas.events import Event, KvBlockRemoved, KvBlockStored
from schemas.wire import decode, encode
from services.bridge.translate import ChainIndex, Engine, to_kv_events, waves
from services.bridge.wire import decode_batch
from tests.vllm_events import Batch, Cleared, Removed, Stored
from tests.vllm_events import encode as vllm_encode

ENGINE = Engine("vllm-a", "llama-3-8b")


def _events(batch: Batch, seq: int = 0, epoch: int = 0, chains: ChainIndex | None = None) -> list[Event]:
    chains = ChainIndex(100) if chains is None else chains
    return to_kv_events(decode_batch(vllm_encode(batch, "map")), ENGINE, epoch, seq, chains)


def keys(tokens: list[int], block_size: int, model: str = "llama-3-8b", namespace: str = "") -> list[str]:
    return block_keys(tokens, model=model, block_size=block_size, namespace=namespace)


def test_a_stored_run_becomes_a_chain_keyed_by_content() -> None:
    tokens = list(range(48))
    out = _events(Batch(2.5, [Stored([b"\x0b" * 32, b"\x0c" * 32, b"\x0d" * 32], None, tokens, 16)]))
    assert all(isinstance(e, KvBlockStored) for e in out)
    k = keys(tokens, 16)
    assert [(e.block_hash, e.parent_block_hash) for e in out] == [(k[0], None), (k[1], k[0]), (k[2], k[1])]
    first = out[0]
    assert first.node_id == "vllm-a" and first.model == "llama-3-8b"
    assert first.block_size_tokens == 16 and first.medium == "gpu" and first.occurred_at_ms == 2500
    # Every event survives the v1 wire, chains and all.
    assert [decode(encode(e)) for e in out] == out


def test_a_chain_continues_across_batches_whatever_the_engines_hashes() -> None:
    tokens = list(range(100, 164))
    chains = ChainIndex(100)
    first = _events(Batch(1.0, [Stored([7], None, tokens[:32], 32)]), chains=chains)
    second = _events(Batch(2.0, [Stored([8], 7, tokens[32:], 32)]), seq=1, chains=chains)
    # Another engine (other hashes, both blocks at once) names the same blocks alike.
    other = _events(Batch(1.0, [Stored([b"\x01" * 32, b"\x02" * 32], None, tokens, 32)]))
    assert [e.block_hash for e in first + second] == [e.block_hash for e in other] == keys(tokens, 32)
    assert second[0].parent_block_hash == first[0].block_hash


def test_the_model_block_size_and_lora_are_part_of_the_key() -> None:
    tokens = list(range(32))
    (base,) = _events(Batch(1.0, [Stored([1], None, tokens, 32)]))
    (lora,) = _events(Batch(1.0, [Stored([1], None, tokens, 32, lora_name="sql-adapter")]))
    assert base.block_hash == keys(tokens, 32)[0]
    assert lora.block_hash == keys(tokens, 32, namespace="sql-adapter")[0] != base.block_hash
    assert keys(tokens, 32, model="other")[0] != base.block_hash
    (half,) = _events(Batch(1.0, [Stored([1], None, tokens[:16], 16)]))
    assert half.block_hash != keys(tokens, 32)[0]


def test_a_block_whose_parent_was_never_heard_is_an_orphan() -> None:
    chains = ChainIndex(100)
    assert _events(Batch(1.0, [Stored([5, 6], 4, list(range(64)), 32)]), chains=chains) == []
    assert chains.orphans == 2 and len(chains) == 0


def test_event_ids_are_stable_for_a_resend_and_distinct_otherwise() -> None:
    batch = Batch(1.0, [Stored([1, 2], None, [0] * 8, 4), Removed([1])])
    a, again = _events(batch, seq=7), _events(batch, seq=7)
    assert [e.event_id for e in a] == [e.event_id for e in again]
    ids = {e.event_id for e in a} | {e.event_id for e in _events(batch, seq=8)}
    ids |= {e.event_id for e in _events(batch, seq=7, epoch=1)}
    assert len(ids) == 3 * len(a)


def test_removals_name_the_content_key_and_unknown_removals_are_dropped() -> None:
    chains = ChainIndex(100)
    stored = _events(Batch(1.0, [Stored([1, 2], None, list(range(8)), 4)]), chains=chains)
    out = _events(Batch(2.0, [Removed([2, 99])]), seq=1, chains=chains)
    assert [(type(e).__name__, e.block_hash) for e in out] == [("KvBlockRemoved", stored[1].block_hash)]


def test_all_blocks_cleared_removes_what_the_engine_still_held() -> None:
    chains = ChainIndex(100)
    stored = _events(Batch(1.0, [Stored([1, 2, 3], None, list(range(12)), 4), Removed([2])]), chains=chains)
    out = _events(Batch(2.0, [Cleared()]), seq=1, chains=chains)
    assert all(isinstance(e, KvBlockRemoved) for e in out)
    assert sorted(e.block_hash for e in out) == sorted([stored[0].block_hash, stored[2].block_hash])
    assert len(chains) == 0


def test_the_chain_index_is_bounded() -> None:
    chains = ChainIndex(2)
    for i, k in enumerate("abc"):
        chains.add(k, bytes([i]))
    assert chains.get("a") is None
    assert chains.clear() == [b"\x01", b"\x02"]


def test_unknown_media_are_left_out() -> None:
    (e,) = _events(Batch(1.0, [Stored([1], None, [0] * 4, 4, medium="LMCACHE")]))
    assert e.medium is None


def test_waves_keep_the_order_of_one_blocks_events() -> None:
    chains = ChainIndex(100)
    out = _events(
        Batch(1.0, [Stored([1, 2], None, [0] * 8, 4), Removed([1]), Stored([1], None, [0] * 4, 4)]),
        chains=chains,
    )
    k = keys([0] * 8, 4)
    split = waves(out)
    assert [[(type(e).__name__, e.block_hash) for e in w] for w in split] == [
        [("KvBlockStored", k[0]), ("KvBlockStored", k[1])],
        [("KvBlockRemoved", k[0])],
        [("KvBlockStored", k[0])],
    ]
