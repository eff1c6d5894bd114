"""vLLM events as kv.events.v1: one event per block, parent links chained, the engine as node_id, event
ids stable across re-sends and distinct across epochs, AllBlocksCleared as removals of the live blocks."""

from __future__ import annotations

from schemas.events import Event, KvBlockRemoved, KvBlockStored
from schemas.wire import decode, encode
from services.bridge.translate import Engine, LiveBlocks, to_kv_events, waves
from services.bridge.wire import decode_batch
from tests.vllm_events import Batch, Cleared, Removed, Stored
from tests.vllm_events import encode as vllm_encode

ENGINE = Engine("vllm-a", "llama-3-8b")


def _events(batch: Batch, seq: int = 0, epoch: int = 0, live: LiveBlocks | None = None) -> list[Event]:
    return to_kv_events(
        decode_batch(vllm_encode(batch)), ENGINE, epoch, seq, LiveBlocks(100) if live is None else live
    )


def test_a_stored_run_becomes_a_chain() -> None:
    out = _events(
        Batch(2.5, [Stored([b"\x0b" * 32, b"\x0c" * 32, b"\x0d" * 32], b"\x0a" * 32, [0] * 48, 16)])
    )
    assert all(isinstance(e, KvBlockStored) for e in out)
    chain = [(e.block_hash, e.parent_block_hash) for e in out]
    assert chain == [("0b" * 32, "0a" * 32), ("0c" * 32, "0b" * 32), ("0d" * 32, "0c" * 32)]
    first = out[0]
    assert first.node_id == "vllm-a" and first.model == "llama-3-8b"
    assert first.block_size_tokens == 16 and first.medium == "gpu" and first.occurred_at_ms == 2500
    # Every event survives the v1 wire, chains and all.
    assert [decode(encode(e)) for e in out] == out


def test_event_ids_are_stable_for_a_resend_and_distinct_otherwise() -> None:
    batch = Batch(1.0, [Stored([1, 2], None, [0] * 8, 4), Removed([1])])
    a, again = _events(batch, seq=7), _events(batch, seq=7)
    assert [e.event_id for e in a] == [e.event_id for e in again]
    ids = {e.event_id for e in a} | {e.event_id for e in _events(batch, seq=8)}
    ids |= {e.event_id for e in _events(batch, seq=7, epoch=1)}
    assert len(ids) == 3 * len(a)


def test_all_blocks_cleared_removes_what_the_engine_still_held() -> None:
    live = LiveBlocks(100)
    _events(Batch(1.0, [Stored([1, 2, 3], None, [0] * 12, 4), Removed([2])]), seq=0, live=live)
    out = _events(Batch(2.0, [Cleared()]), seq=1, live=live)
    assert all(isinstance(e, KvBlockRemoved) for e in out)
    assert sorted(e.block_hash for e in out) == ["1", "3"]
    assert len(live) == 0


def test_live_blocks_are_bounded() -> None:
    live = LiveBlocks(2)
    for k in "abc":
        live.add(k)
    assert live.clear() == ["b", "c"]


def test_unknown_media_are_left_out() -> None:
    (e,) = _events(Batch(1.0, [Stored([1], None, [0] * 4, 4, medium="LMCACHE")]))
    assert e.medium is None


def test_waves_keep_the_order_of_one_blocks_events() -> None:
    out = _events(Batch(1.0, [Stored([1, 2], None, [0] * 8, 4), Removed([1]), Stored([1], None, [0] * 4, 4)]))
    split = waves(out)
    assert [[(type(e).__name__, e.block_hash) for e in w] for w in split] == [
        [("KvBlockStored", "1"), ("KvBlockStored", "2")],
        [("KvBlockRemoved", "1")],
        [("KvBlockStored", "1")],
    ]
