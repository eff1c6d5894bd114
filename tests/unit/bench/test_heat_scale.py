"""bench.heat_scale's chain backlog: the stream of KV blocks an engine would store."""

from __future__ import annotations

from bench.heat_scale import chain_events


def test_chain_backlog_stores_each_block_once_after_its_parent() -> None:
    events = chain_events(5_000, seed=3, t0=1_000)
    hashes = [e.block_hash for e in events]
    assert len(events) == 5_000 and len(set(hashes)) == 5_000
    seen: set[str] = set()
    chained = 0
    for e in events:
        if e.parent_block_hash is not None:
            assert e.parent_block_hash in seen  # a parent is stored before its children
            chained += 1
        seen.add(e.block_hash)
    assert chained > len(events) // 2  # mostly chains, with roots among them
    assert [e.occurred_at_ms for e in events] == sorted(e.occurred_at_ms for e in events)
