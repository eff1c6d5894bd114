"""The demo's KV traffic (infra/demo.py `kv_events`): the trace's multi-turn conversations, on the
running node, under the content keys the node's block API takes, one conversation id per run."""

from __future__ import annotations

from collections import Counter

from cachemesh_client.blockframe import encode_blocks, parse_blocks
from cachemesh_client.valuecodec import decode_header

from infra.demo import DemoPlan, kv_events, stand_in_block
from schemas.events import CacheAccessed


def test_the_demo_replays_conversations_on_the_running_node() -> None:
    events = kv_events(DemoPlan(seconds=6, trace_s=120), 1_000_000, "vm")
    assert len(events) > 500
    assert {getattr(e, "node_id", "vm") for e in events} == {"vm"}
    blocks = [e for e in events if isinstance(e, CacheAccessed) and e.kind == "kv_block"]
    assert blocks and all(e.key.startswith("kv:demo-") for e in blocks)
    # Every conversation comes back: two requests or more (a request's blocks share one time).
    requests = Counter((e.trace_id, e.occurred_at_ms) for e in blocks)
    turns = Counter(trace for trace, _ in requests)
    assert turns and min(turns.values()) >= 2
    # Another run: other conversations (the planner must not take them for this run's).
    again = kv_events(DemoPlan(seconds=6, trace_s=120), 2_000_000, "vm")
    assert not {e.trace_id for e in blocks} & {e.trace_id for e in again if isinstance(e, CacheAccessed)}


def test_a_stand_in_block_is_a_kv_block_value_of_its_model() -> None:
    block = stand_in_block("kv:demo-7", "llama-7b")
    assert block.key == "kv:demo-7" and block.status == "hit"
    header = decode_header(block.value)
    assert header.kind == "kv_block" and header.model == "llama-7b"
    assert parse_blocks(encode_blocks([block]))[0].key == block.key


def test_every_figure_of_the_summary_says_what_it_means() -> None:
    from infra.demo import MEANING, DemoReport

    report = DemoReport(writes_refused=1, calls_failed=1, delta_t_ms=[1, 2], chats=4, chat_hits=2)
    report.before = {"lookups": 0, "hits_by_tier": {}}
    report.after = {"lookups": 4, "hits": 2, "hits_by_tier": {"l1:semantic": 2}}
    report.board_after = {
        k: 1 for k in ("warmup_decisions", "invalidations", "heat_decisions", "drift_clusters")
    }
    whats = [what for what, _ in report.rows() if not what.startswith("  ")]  # per-tier lines indent
    assert len(whats) == 18
    assert [w for w in whats if w not in MEANING] == []


def test_a_repeated_chat_s_miss_is_put_down_to_what_the_gateway_said() -> None:
    from infra.demo import chat_miss_reason

    assert chat_miss_reason({"x-cachemesh-lookup": "hedged"}) == "hedged"
    assert chat_miss_reason({"x-cachemesh-lookup": "timeout"}) == "timeout"
    assert chat_miss_reason({"x-cachemesh-miss": "below_threshold; similarity 0.8100"}) == "below_threshold"
    assert chat_miss_reason({}) == "no reason given"
