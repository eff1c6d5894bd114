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
