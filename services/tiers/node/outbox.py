"""Events a tier node owes Kafka, queued on the request path and sent by a background loop, so a request
never waits on the broker (write-with-sync, docs/design.md §1.3: the invalidation is published
asynchronously).

Two bounded queues: invalidations (each may carry a due time: the delayed second delete of
docs/design.md §4.4) and access records (cheap tuples; the `CacheAccessed` events are built off the
request path). Whatever would overflow a queue is dropped and counted. Pure: the clock is passed in.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import orjson

from schemas.events import SCHEMA_VERSION, CacheAccessed, CacheInvalidated, EntryKind, Tier
from schemas.ids import new_event_ids


class AccessRecord(NamedTuple):  # a tuple: one is built per lookup (0.57 us; a frozen dataclass 1.37)
    key: str
    hit: bool
    latency_ms: float
    occurred_at_ms: int
    tier: Tier | None = None
    match: str | None = None  # "exact" | "semantic"
    similarity: float | None = None
    kind: EntryKind = "prompt"
    model: str | None = None
    size_bytes: int | None = None
    trace_id: str | None = None

    def event(self, node_id: str) -> CacheAccessed:
        return CacheAccessed(
            key=self.key,
            hit=self.hit,
            kind=self.kind,
            model=self.model,
            tier=self.tier,
            match=self.match,  # type: ignore[arg-type]
            similarity=None if self.similarity is None else max(-1.0, min(1.0, self.similarity)),
            latency_ms=max(0.0, self.latency_ms),
            size_bytes=self.size_bytes,
            trace_id=self.trace_id,
            node_id=node_id,
            service="tiers",
            occurred_at_ms=self.occurred_at_ms,
        )


def access_batch_json(records: Sequence[AccessRecord], node_id: str) -> bytes:
    """The JSON of the `CacheAccessBatch` of `records` (1 to MAX_ACCESS_BATCH, one partition's, in
    order), as `encode(access_batch([r.event(node_id) for r in records]))` writes it but without a
    model per event: a busy node sends one per 64 lookups, and the models cost more than the lookups.
    tests/unit/tiers/test_outbox.py holds it equal to the models' encoding."""
    events, ids = [], new_event_ids(len(records) + 1)
    for r, event_id in zip(records, ids, strict=False):
        event: dict[str, object] = {
            "schema_version": SCHEMA_VERSION,
            "event_id": event_id,
            "occurred_at_ms": r.occurred_at_ms,
            "type": "cache.accessed",
            "key": r.key,
            "hit": r.hit,
            "kind": r.kind,
            "latency_ms": max(0.0, r.latency_ms),
            "node_id": node_id,
            "service": "tiers",
        }
        for name, value in (
            ("model", r.model),
            ("tier", r.tier),
            ("match", r.match),
            ("size_bytes", r.size_bytes),
            ("trace_id", r.trace_id),
        ):
            if value is not None:
                event[name] = value
        if r.similarity is not None:
            event["similarity"] = max(-1.0, min(1.0, r.similarity))
        events.append(event)
    batch = {
        "schema_version": SCHEMA_VERSION,
        "event_id": ids[-1],
        "occurred_at_ms": max(r.occurred_at_ms for r in records),
        "type": "cache.accessed.batch",
        "key": records[0].key,
        "events": events,
    }
    return orjson.dumps(batch)


@dataclass(frozen=True, slots=True)
class OutboxStats:
    queued_access: int
    queued_invalidations: int
    dropped_access: int
    dropped_invalidations: int
    send_failures: int  # invalidations the broker did not take (sent again; L3's outbox row stays)
    relayed: int  # invalidations this node relayed from L3's outbox (another node's, or its own late)


class Outbox:
    def __init__(
        self,
        *,
        clock: Callable[[], int],
        max_access: int = 100_000,
        max_invalidations: int = 10_000,
        on_urgent: Callable[[], None] | None = None,
    ) -> None:
        self.clock = clock
        self.max_access = max_access
        self.max_invalidations = max_invalidations
        # Called when an event is ready now (the sender loop sleeps otherwise).
        self.on_urgent = on_urgent
        self._access: deque[AccessRecord] = deque()
        self._due: list[tuple[int, int, CacheInvalidated]] = []  # heap of (due_ms, seq, event)
        self._seq = itertools.count()
        self.dropped_access = 0
        self.dropped_invalidations = 0
        self.send_failures = 0  # counted by the sender (the service)
        self.relayed = 0

    def access(self, record: AccessRecord) -> None:
        if len(self._access) >= self.max_access:
            self.dropped_access += 1
            return
        self._access.append(record)

    def invalidation(self, event: CacheInvalidated, *, delay_ms: int = 0) -> None:
        if len(self._due) >= self.max_invalidations:
            self.dropped_invalidations += 1
            return
        heapq.heappush(self._due, (self.clock() + delay_ms, next(self._seq), event))
        if delay_ms <= 0 and self.on_urgent is not None:
            self.on_urgent()

    def take_due(self) -> list[CacheInvalidated]:
        """Invalidations whose time has come, oldest due first."""
        now = self.clock()
        out = []
        while self._due and self._due[0][0] <= now:
            out.append(heapq.heappop(self._due)[2])
        return out

    def next_due_ms(self) -> int | None:
        return self._due[0][0] if self._due else None

    def take_access(self, max_records: int = 10_000) -> list[AccessRecord]:
        n = min(max_records, len(self._access))
        return [self._access.popleft() for _ in range(n)]

    def __len__(self) -> int:
        return len(self._access) + len(self._due)

    def stats(self) -> OutboxStats:
        return OutboxStats(
            queued_access=len(self._access),
            queued_invalidations=len(self._due),
            dropped_access=self.dropped_access,
            dropped_invalidations=self.dropped_invalidations,
            send_failures=self.send_failures,
            relayed=self.relayed,
        )
