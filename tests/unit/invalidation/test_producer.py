"""The source-change producer helper makes the documented payload, chunked, without a broker."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from schemas.events import MAX_KEYS_PER_EVENT, SourceChanged, source_dependency_id
from schemas.wire import decode
from services.invalidation.producer import record_of, source_changes


def test_the_payload() -> None:
    [event] = source_changes("orders", [42, "43", 42], "delete", producer="orders-api")
    topic, key, value = record_of(event, "staging.")
    assert topic == "staging.source.changes.v1" and key == b"orders"
    doc = json.loads(value)
    assert {k: doc[k] for k in ("type", "schema_version", "source", "ids", "reason", "producer")} == {
        "type": "source.changed",
        "schema_version": 1,
        "source": "orders",
        "ids": ["42", "43"],
        "reason": "delete",
        "producer": "orders-api",
    }
    assert len(doc["event_id"]) == 32 and doc["occurred_at_ms"] > 0
    again = decode(value)
    assert isinstance(again, SourceChanged) and again.dependency_ids() == ["row:orders/42", "row:orders/43"]
    assert source_dependency_id("orders", "42") == "row:orders/42"


def test_many_ids_are_chunked() -> None:
    events = source_changes("orders", range(MAX_KEYS_PER_EVENT + 1))
    assert [len(e.ids) for e in events] == [MAX_KEYS_PER_EVENT, 1]
    assert events[1].ids == [str(MAX_KEYS_PER_EVENT)] and events[0].reason == "update"


@pytest.mark.parametrize("source", ["", "a/b"])
def test_a_bad_source_is_refused(source: str) -> None:
    with pytest.raises(ValidationError):
        SourceChanged(source=source, ids=["1"])
    with pytest.raises(ValidationError):
        SourceChanged(source="orders", ids=[])
