"""The event contracts: golden payloads keep validating, exports stay in sync, bad bytes get reasons."""

from __future__ import annotations

import json
import math
import os
import uuid

import jsonschema
import pytest
from pydantic import ValidationError

from schemas.descriptor import CacheDescriptor
from schemas.events import (
    EVENT_TYPES,
    MAX_ACCESS_BATCH,
    MAX_HEAT_BATCH,
    CacheAccessBatch,
    CacheAccessed,
    CacheInvalidated,
    HeatScored,
    HeatScoredBatch,
    access_batch,
    heat_batch,
    heat_decisions,
    record_events,
)
from schemas.export import GOLDEN_DIR, JSONSCHEMA_DIR, golden_documents, json_schema_documents
from schemas.ids import new_event_id, new_event_ids
from schemas.topics import BY_NAME, CATALOGUE, dlq_name, qualified
from schemas.wire import DecodeError, decode, encode
from services.runtime.publisher import partition_groups

GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))


def test_every_event_type_has_a_committed_golden_payload() -> None:
    assert {p.stem for p in GOLDEN_FILES} == set(EVENT_TYPES)


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden_payload_still_decodes(path) -> None:
    event = decode(path.read_bytes())
    assert event.type == path.stem  # type: ignore[attr-defined]
    assert decode(encode(event)) == event


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden_payload_validates_against_exported_json_schema(path) -> None:
    schema = json.loads((JSONSCHEMA_DIR / path.name).read_text())
    jsonschema.validate(json.loads(path.read_text()), schema)


def test_committed_json_schemas_match_the_models() -> None:
    for name, doc in json_schema_documents().items():
        committed = json.loads((JSONSCHEMA_DIR / f"{name}.json").read_text())
        assert committed == doc, f"{name}.json is stale: run `cachemesh schemas export`"


def test_golden_documents_cover_every_type() -> None:
    assert set(golden_documents()) == set(EVENT_TYPES)


def _payload(**overrides: object) -> bytes:
    doc = {
        "type": "cache.accessed",
        "schema_version": 1,
        "event_id": "e1",
        "occurred_at_ms": 1,
        "key": "k",
        "hit": True,
    }
    doc.update(overrides)
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    ("data", "kind", "fragment"),
    [
        (b"x" * 300, "oversized", "exceeds the 256-byte limit"),
        (b"{not json", "malformed_json", "not valid UTF-8 JSON"),
        (b"\xff\xfe", "malformed_json", "not valid UTF-8 JSON"),
        (None, "malformed_json", "tombstone"),
        (b"[1, 2]", "not_an_object", "got list"),
        (_payload(schema_version=2), "unsupported_schema_version", "schema_version 2"),
        (_payload(schema_version="1"), "unsupported_schema_version", "schema_version '1'"),
        (_payload(schema_version=...), "unsupported_schema_version", "schema_version None"),
        (_payload(type="cache.exploded"), "unknown_type", "cache.exploded"),
        # unhashable values where a version or a type belongs: refused, never a TypeError (a poison pill)
        (_payload(schema_version=[1]), "unsupported_schema_version", "schema_version [1]"),
        (_payload(schema_version={"v": 1}), "unsupported_schema_version", "schema_version {'v': 1}"),
        (_payload(type=["cache.accessed"]), "unknown_type", "['cache.accessed']"),
        (_payload(event_id=...), "invalid", "event_id"),
        (_payload(key=""), "invalid", "key"),
        (_payload(hit="maybe"), "invalid", "hit"),
        (_payload(latency_ms=-1), "invalid", "latency_ms"),
    ],
)
def test_decode_failures_carry_a_kind_and_a_reason(data: bytes | None, kind: str, fragment: str) -> None:
    with pytest.raises(DecodeError) as err:
        decode(data, max_bytes=256)
    assert err.value.kind == kind
    assert fragment in err.value.reason


def test_non_finite_embedding_is_rejected() -> None:
    doc = json.loads(encode(CacheInvalidated(key="k", embedding=[0.1, 0.2])))
    raw = json.dumps(doc).replace("0.2", "NaN").encode()
    with pytest.raises(DecodeError, match="finite"):
        decode(raw)
    with pytest.raises(ValueError, match="finite"):
        CacheDescriptor(key="k", kind="prompt", model="m", embedding=[1.0, math.inf])


def test_unknown_optional_fields_are_ignored_for_forward_compatibility() -> None:
    event = decode(_payload(added_in_v1_1="fine"))
    assert isinstance(event, CacheAccessed)


def test_every_event_topic_is_in_the_catalogue_with_a_dead_letter_sibling() -> None:
    for cls in EVENT_TYPES.values():
        assert cls.topic in BY_NAME
        assert dlq_name(cls.topic) in BY_NAME
    assert dlq_name("cache.access.v1") == "cache.access.dlq.v1"
    assert dlq_name(qualified("cache.access.v1", "t1.")) == "t1.cache.access.dlq.v1"
    assert all(t.partitions >= 1 for t in CATALOGUE)


def test_kafka_key_follows_the_catalogue_key_field() -> None:
    assert CacheAccessed(key="abc", hit=False).kafka_key() == "abc"


def test_an_access_batch_stands_for_its_events_and_is_bounded() -> None:
    events = [CacheAccessed(key=f"k{n}", hit=n % 2 == 0, occurred_at_ms=100 + n) for n in range(3)]
    batch = access_batch(events)
    assert batch.key == "k0" and batch.occurred_at_ms == 102 and batch.topic == CacheAccessed.topic
    decoded = decode(encode(batch))
    assert record_events(decoded) == events
    assert record_events(events[1]) == [events[1]]
    for bad in ([], [events[0]] * (MAX_ACCESS_BATCH + 1)):
        with pytest.raises(ValidationError):
            CacheAccessBatch(key="k0", events=bad)
    # A batch with one invalid event is refused whole, with a reason (dead-lettered as one record).
    raw = encode(batch).replace(b'"hit":true', b'"hit":"maybe"', 1)
    with pytest.raises(DecodeError, match="hit"):
        decode(raw)


def test_a_heat_batch_stands_for_its_decisions_and_is_bounded() -> None:
    decisions = [
        HeatScored(
            key=f"k{n}", score=n / 4, decision=("keep", "evict", "keep_alive")[n % 3], occurred_at_ms=50 + n
        )
        for n in range(4)
    ]
    batch = heat_batch(decisions)
    assert batch.key == "k0" and batch.occurred_at_ms == 53 and batch.topic == HeatScored.topic
    assert batch.kafka_key() == "k0"
    assert record_events(decode(encode(batch))) == decisions
    assert heat_decisions(batch) == decisions and heat_decisions(decisions[1]) == [decisions[1]]
    assert heat_decisions(CacheAccessed(key="k0", hit=True)) is None
    for bad in ([], [decisions[0]] * (MAX_HEAT_BATCH + 1)):
        with pytest.raises(ValidationError):
            HeatScoredBatch(key="k0", events=bad)
    raw = encode(batch).replace(b'"decision":"evict"', b'"decision":"drop"', 1)
    with pytest.raises(DecodeError, match="decision"):
        decode(raw)


def test_partition_groups_keep_each_partitions_order_in_runs_of_at_most_per_record() -> None:
    events = list(range(10))
    partitions = [0, 1, 0, 2, 0, 0, 1, 0, 2, 0]
    groups = partition_groups(events, partitions, 3)
    assert groups == [[0, 2, 4], [5, 7, 9], [1, 6], [3, 8]]
    assert all(len({partitions[e] for e in g}) == 1 for g in groups)
    assert sorted(e for g in groups for e in g) == events
    assert partition_groups(events, partitions, 1) == [[e] for e in [0, 2, 4, 5, 7, 9, 1, 6, 3, 8]]
    assert partition_groups([], [], 4) == []
    with pytest.raises(ValueError):
        partition_groups(events, partitions[:-1], 3)


def test_event_ids_are_distinct_version_4_uuids_in_hex() -> None:
    ids = [new_event_id() for _ in range(1_000)] + new_event_ids(1_000) + new_event_ids(1)
    assert len(set(ids)) == len(ids) == 2_001
    for event_id in ids:
        parsed = uuid.UUID(hex=event_id)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert parsed.hex == event_id


def test_a_forked_child_draws_ids_of_its_own() -> None:
    new_event_id()  # the parent holds ids drawn ahead
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, " ".join(new_event_id() for _ in range(300)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split())
    parent = {new_event_id() for _ in range(300)}
    assert len(child) == 300 and not child & parent
