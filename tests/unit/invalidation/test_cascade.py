"""From triggering events to roots, eviction commands and records."""

from __future__ import annotations

from schemas.events import (
    MAX_KEYS_PER_EVENT,
    CacheInvalidated,
    ConversationEnded,
    ConversationStarted,
    SourceChanged,
)
from services.invalidation.cascade import eviction_commands, records, trigger_of
from services.invalidation.walk import Cascade


def test_triggers() -> None:
    inv = trigger_of(CacheInvalidated(key="faq:pw", reason="delete"))
    assert inv is not None and inv.roots == ("faq:pw",) and inv.root_vias == ("dependency",)
    assert inv.cause == "invalidated" and inv.reason == "delete"
    ended = trigger_of(ConversationEnded(trace_id="conv-1"))
    assert (
        ended is not None
        and ended.root_vias == ("dependency", "trace")
        and ended.cause == "conversation_ended"
    )
    changed = trigger_of(SourceChanged(source="orders", ids=["42", "42", "7"], reason="delete"))
    assert changed is not None and changed.root == "orders"
    assert changed.roots == ("row:orders/42", "row:orders/7") and changed.cause == "source_changed"
    assert trigger_of(ConversationStarted(trace_id="conv-1")) is None


def test_evictions_are_chunked_and_each_record_names_its_command() -> None:
    trigger = trigger_of(ConversationEnded(trace_id="conv-1"))
    assert trigger is not None
    keys = tuple(f"k{i}" for i in range(MAX_KEYS_PER_EVENT * 2 + 5))
    cascade = Cascade(keys, 3, "max_dependants")
    commands = eviction_commands(trigger, cascade)
    assert [len(c.keys) for c in commands] == [MAX_KEYS_PER_EVENT, MAX_KEYS_PER_EVENT, 5]
    assert all(c.node_id == "*" and c.reason == "conversation_ended:conv-1" for c in commands)
    assert tuple(k for c in commands for k in c.keys) == keys
    recs = records(trigger, cascade, commands, l3_deleted=7)
    assert [r.command_event_id for r in recs] == [c.event_id for c in commands]
    assert [(r.chunk, r.chunks) for r in recs] == [(0, 3), (1, 3), (2, 3)]
    assert all(r.truncated and r.bound == "max_dependants" and r.dependants == len(keys) for r in recs)
    assert all(r.source_event_id == trigger.event_id and r.l3_deleted == 7 and r.depth == 3 for r in recs)


def test_nothing_found_makes_no_command_and_one_empty_record() -> None:
    trigger = trigger_of(CacheInvalidated(key="k"))
    assert trigger is not None
    assert eviction_commands(trigger, Cascade((), 0, None)) == []
    [rec] = records(trigger, Cascade((), 0, None), [], l3_deleted=0)
    assert rec.keys == [] and rec.dependants == 0 and rec.command_event_id is None and not rec.truncated
