"""The invalidation service: hears `cache.invalidate.v1`, `context.lifecycle.v1` and `source.changes.v1`,
walks the dependency index in Postgres, deletes the dependants from L3, evicts them from every tier node
(`tier.commands.v1`) and records what went and why (`invalidation.records.v1`)."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from typing import Any

from prometheus_client import Counter, Gauge

from schemas.events import CacheInvalidated, ConversationEnded, SourceChanged, now_ms
from services.invalidation.cascade import Trigger, eviction_commands, records, trigger_of
from services.invalidation.settings import InvalidationSettings
from services.invalidation.store import PostgresDependencyIndex
from services.invalidation.walk import Cascade, DependencyWalk
from services.runtime.kafka import Delivery
from services.runtime.postgres import Database, count_processed, prune_inbox
from services.runtime.publisher import EventPublisher
from services.runtime.service import Loop, Service

log = logging.getLogger(__name__)

CASCADES = Counter("cachemesh_invalidation_cascades_total", "Triggering events walked", ["cause"])
DEPENDANTS = Counter("cachemesh_invalidation_dependants_total", "Dependants evicted", ["cause"])
TRUNCATED = Counter("cachemesh_invalidation_truncated_total", "Walks stopped by a bound", ["bound"])
REDELIVERED = Counter("cachemesh_invalidation_redelivered_total", "Events skipped as carried out before")
INBOX_ROWS = Gauge("cachemesh_invalidation_inbox_rows", "Event ids kept in processed_events for dedup")


class InvalidationService(Service):
    name = "invalidation"

    def __init__(self, settings: InvalidationSettings) -> None:
        super().__init__(settings)
        self.invalidation_settings = settings
        self._publisher: EventPublisher | None = None
        self._index: PostgresDependencyIndex | None = None
        self._db: Database | None = None
        self.inbox_rows: int | None = None
        self.counters: dict[str, int] = {"cascades": 0, "dependants": 0, "truncated": 0, "redelivered": 0}

    async def open(self, stack: AsyncExitStack) -> None:
        s = self.invalidation_settings
        db = self._db = await self.open_database(stack)
        self._index = PostgresDependencyIndex(db, s.group_id, batch_ids=s.query_batch_ids)
        self._publisher = await self.open_publisher(stack)
        topics = [CacheInvalidated.topic, ConversationEnded.topic, SourceChanged.topic]
        await self.open_consumer(stack, topics, s.group_id, self._handle, self._publisher)

    def loops(self) -> list[Loop]:
        return [self._collect_orphans, self._prune_inbox]

    async def checks(self) -> dict[str, Any]:
        return {**self.counters, "inbox_rows": self.inbox_rows}

    async def prune_inbox_once(self) -> int:
        """Forget inbox rows past the retention, batch by batch; returns how many went."""
        s = self.invalidation_settings
        assert self._db is not None
        pruned = await prune_inbox(self._db, s.group_id, now_ms() - s.inbox_retention_ms, s.inbox_prune_batch)
        self.inbox_rows = await count_processed(self._db, s.group_id)
        INBOX_ROWS.set(self.inbox_rows)
        return pruned

    async def _prune_inbox(self) -> None:
        while True:
            await asyncio.sleep(self.invalidation_settings.inbox_prune_interval_s)
            await self.prune_inbox_once()

    async def _handle(self, delivery: Delivery) -> None:
        trigger = trigger_of(delivery.event)
        if trigger is None:
            return
        assert self._index is not None and self._publisher is not None
        if await self._index.processed(trigger.event_id):
            self.counters["redelivered"] += 1
            REDELIVERED.inc()
            return
        cascade = await self.walk(trigger)
        # L3 first, then the nodes: an evicted node that misses reads L3, which must not answer.
        deleted = 0
        if cascade.keys and self.invalidation_settings.delete_l3:
            deleted = await self._index.delete_entries(cascade.keys, trigger.occurred_at_ms)
        commands = eviction_commands(trigger, cascade)
        for command in commands:
            await self._publisher.publish(command)
        # Marked done only once the evictions are acknowledged: a crash before redoes the walk.
        await self._index.finish(trigger.event_id, cascade.keys)
        self._count(trigger, cascade)
        if commands or cascade.truncated or self.invalidation_settings.record_noops:
            for record in records(trigger, cascade, commands, l3_deleted=deleted):
                await self._publisher.publish(record, wait=False)

    async def walk(self, trigger: Trigger) -> Cascade:
        assert self._index is not None
        s = self.invalidation_settings
        walk = DependencyWalk(
            trigger.roots,
            max_depth=s.max_depth,
            max_dependants=s.max_dependants,
            root_vias=trigger.root_vias,
            changed_at_ms=trigger.occurred_at_ms,
        )
        while (query := walk.next_query()) is not None:
            walk.add(await self._index.dependants(query.ids, query.vias, query.limit))
        return walk.result()

    def _count(self, trigger: Trigger, cascade: Cascade) -> None:
        self.counters["cascades"] += 1
        self.counters[f"cascades_{trigger.cause}"] = self.counters.get(f"cascades_{trigger.cause}", 0) + 1
        self.counters["dependants"] += len(cascade.keys)
        CASCADES.labels(trigger.cause).inc()
        DEPENDANTS.labels(trigger.cause).inc(len(cascade.keys))
        if cascade.bound is not None:
            self.counters["truncated"] += 1
            TRUNCATED.labels(cascade.bound).inc()
            log.warning(
                "dependency walk stopped by a bound; some dependants may remain",
                extra={"root": trigger.root, "cause": trigger.cause, "bound": cascade.bound},
            )

    async def _collect_orphans(self) -> None:
        s = self.invalidation_settings
        assert self._index is not None
        while True:
            await asyncio.sleep(s.edge_gc_interval_s)
            gone = await self._index.collect_orphans(s.edge_gc_grace_ms, s.edge_gc_batch)
            if gone:
                log.info("collected orphaned dependency edges", extra={"edges": gone})
