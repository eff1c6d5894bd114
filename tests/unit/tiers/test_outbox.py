"""The outbox: invalidations come out when due (the delayed second delete), access records in order,
both bounded, with the overflow counted rather than blocking."""

from __future__ import annotations

from schemas.events import CacheInvalidated
from services.tiers.node.outbox import AccessRecord, Outbox
from tests.unit.tiers.fakes import Clock


def test_due_order_and_urgent_signal() -> None:
    clock = Clock()
    woken = []
    box = Outbox(clock=clock, on_urgent=lambda: woken.append(1))
    later = CacheInvalidated(key="later", attempt=2)
    now = CacheInvalidated(key="now")
    box.invalidation(later, delay_ms=200)
    assert woken == []
    box.invalidation(now)
    assert woken == [1]
    assert box.take_due() == [now]
    assert box.next_due_ms() == clock() + 200
    clock.advance(200)
    assert box.take_due() == [later] and box.next_due_ms() is None


def test_bounds_drop_and_count() -> None:
    box = Outbox(clock=Clock(), max_access=2, max_invalidations=1)
    for i in range(3):
        box.access(AccessRecord(f"k{i}", True, 0.1, 0))
    box.invalidation(CacheInvalidated(key="a"))
    box.invalidation(CacheInvalidated(key="b"))
    assert [r.key for r in box.take_access()] == ["k0", "k1"]
    stats = box.stats()
    assert (stats.dropped_access, stats.dropped_invalidations, stats.queued_invalidations) == (1, 1, 1)


def test_access_record_builds_a_valid_event() -> None:
    event = AccessRecord("k", True, 0.25, 123, tier="l2", match="exact", similarity=1.0000001).event("n1")
    assert (event.key, event.tier, event.similarity, event.node_id, event.service) == (
        "k",
        "l2",
        1.0,
        "n1",
        "tiers",
    )
    assert event.occurred_at_ms == 123


def test_access_batch_json_is_what_the_models_encode() -> None:
    """The batch JSON written straight from the records decodes to the batch the models build, and its
    bytes are the models' own encoding but for the random event ids."""
    import json
    import random

    from schemas.events import CacheAccessBatch, access_batch
    from schemas.wire import decode, encode
    from services.tiers.node.outbox import access_batch_json

    rng = random.Random(7)
    records = [
        AccessRecord(
            f"key-{i}",
            rng.random() < 0.5,
            rng.choice([-0.5, 0.0, 0.3, 12.5]),  # a negative latency is clamped to 0, as the model is told
            1_767_225_600_000 + rng.randrange(10_000),
            tier=rng.choice([None, "l1", "l2", "l3"]),
            match=rng.choice([None, "exact", "semantic"]),
            similarity=rng.choice([None, -1.2, 0.93, 1.0000001]),
            kind=rng.choice(["prompt", "embedding", "kv_block"]),
            model=rng.choice([None, "m"]),
            size_bytes=rng.choice([None, 0, 160]),
            trace_id=rng.choice([None, "conv-1"]),
        )
        for i in range(50)
    ]
    raw = access_batch_json(records, "node-1")
    got = decode(raw)
    want = access_batch([r.event("node-1") for r in records])
    assert isinstance(got, CacheAccessBatch)

    def without_ids(payload: bytes) -> dict:
        body = json.loads(payload)
        body.pop("event_id")
        for event in body["events"]:
            assert len(event.pop("event_id")) == 32
        return body

    assert without_ids(raw) == without_ids(encode(want))
    assert got.model_dump(exclude={"event_id"}) | {"events": None} == want.model_dump(
        exclude={"event_id"}
    ) | {"events": None}
    assert len({e.event_id for e in got.events}) == len(records)  # every event its own id
