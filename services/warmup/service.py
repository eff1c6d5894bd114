"""The warmup service's lifecycle: hears stream windows and drift clusters, penetrations, KV events,
accesses, heat decisions and conversation ends; publishes `tier.commands.v1` (WarmupRequested) and
`warmup.records.v1` (decisions with their reasons, Δt, head-heat shard plans); looks up semantic
neighbours in Postgres (pgvector); checkpoints the FTL fits to `model_fits`."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from contextlib import AsyncExitStack
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from schemas.events import (
    AttentionHeatReported,
    CacheAccessed,
    ConversationEnded,
    DriftClustered,
    Event,
    HeatScored,
    ShardPlanned,
    WarmupDecided,
    WarmupMeasured,
    WarmupRequested,
    WindowComputed,
    record_events,
)
from services.runtime.kafka import Delivery
from services.runtime.model_store import PostgresModelStore
from services.runtime.postgres import Database
from services.runtime.publisher import EventPublisher
from services.runtime.service import Loop, Service
from services.warmup.heads import HeadHeat
from services.warmup.planner import WarmupPlanner
from services.warmup.settings import WarmupSettings

log = logging.getLogger(__name__)

DECISIONS = Counter("cachemesh_warmup_decisions_total", "Warmup decisions", ["source", "action"])
KEYS = Counter("cachemesh_warmup_keys_total", "Keys sent in warmup commands", ["source"])
DELTA_T = Histogram(
    "cachemesh_warmup_delta_t_ms",
    "Δt = t_peak - t_warm of each warmup (ms; >= 0: warm before the peak)",
    buckets=(-5000, -1000, -500, -200, 0, 200, 500, 1000, 2000, 5000, 10000),
)
WASTED = Gauge("cachemesh_warmup_wasted_share", "Share of judged prefetches that were never read")

_NEIGHBOURS_SQL = (
    "SELECT d.key FROM cache_descriptors d, (SELECT embedding FROM cache_descriptors WHERE key = $1) q "
    "WHERE q.embedding IS NOT NULL AND d.embedding IS NOT NULL AND d.key <> $1 "
    "ORDER BY d.embedding <=> q.embedding LIMIT $2"
)


class WarmupService(Service):
    name = "warmup"

    def __init__(self, settings: WarmupSettings) -> None:
        super().__init__(settings)
        self.warmup_settings = settings
        self.planner = WarmupPlanner(settings.planner_config())
        self.heads: dict[str, HeadHeat] = {}
        self.model_version: int | None = None
        self.events_applied = 0
        self.measured: deque[WarmupMeasured] = deque(maxlen=1000)  # the latest Δt samples
        self._publisher: EventPublisher | None = None
        self._db: Database | None = None
        self._store: PostgresModelStore | None = None
        self._lock = asyncio.Lock()  # the consumer and the tick loop share the planner

    async def open(self, stack: AsyncExitStack) -> None:
        self._db = await self.open_database(stack)
        self._store = PostgresModelStore(self._db)
        await self._restore()
        stack.push_async_callback(self.checkpoint)
        self._publisher = await self.open_publisher(stack)
        topics = sorted(
            {
                WindowComputed.topic,
                DriftClustered.topic,
                AttentionHeatReported.topic,
                CacheAccessed.topic,
                HeatScored.topic,
                ConversationEnded.topic,
            }
        )
        await self.open_consumer(stack, topics, self.warmup_settings.group_id, self._handle, self._publisher)

    def loops(self) -> list[Loop]:
        return [self._tick_loop, self._checkpoint_loop]

    async def checks(self) -> dict[str, Any]:
        return {
            "events_applied": self.events_applied,
            "model_version": self.model_version,
            **self.planner.stats(),
        }

    async def _handle(self, delivery: Delivery) -> None:
        event = delivery.event
        async with self._lock:
            out = self.planner.apply(event)
            if isinstance(event, AttentionHeatReported) and event.model is not None:
                out += self._plan_heads(event)
            rising, self.planner.rising = self.planner.rising, []
        for key, at_ms in rising:
            out += await self._semantic_neighbours(key, at_ms)
        self.events_applied += len(record_events(event))
        await self._publish(out)

    def _plan_heads(self, event: AttentionHeatReported) -> list[Event]:
        model = event.model or "*"
        heads = self.heads.get(model)
        if heads is None:
            heads = self.heads[model] = HeadHeat(model)
        heads.observe(event.head_heat)
        plan = heads.plan()
        if plan is None:
            return []
        return [
            ShardPlanned(model=model, scores=list(plan.scores), classes=list(plan.classes), steps=plan.steps)
        ]

    async def _semantic_neighbours(self, key: str, at_ms: int) -> list[Event]:
        """Keys nearest to `key`'s embedding in L3 (pgvector); none without pgvector."""
        limit = self.warmup_settings.semantic_neighbours
        if self._db is None or not self._db.has_vector or limit == 0:
            return []
        rows = await self._db.fetch(_NEIGHBOURS_SQL, key, limit)
        async with self._lock:
            return self.planner.neighbours_found(key, [r["key"] for r in rows], at_ms)

    async def _publish(self, events: list[Event]) -> None:
        assert self._publisher is not None
        for event in events:
            # Commands are acknowledged before the consumer commits the event that caused them.
            await self._publisher.publish(event, wait=isinstance(event, WarmupRequested))
            if isinstance(event, WarmupDecided):
                DECISIONS.labels(event.source, event.action).inc()
                if event.action == "warm":
                    KEYS.labels(event.source).inc(len(event.keys))
            elif isinstance(event, WarmupMeasured):
                DELTA_T.observe(event.delta_t_ms)
                self.measured.append(event)
        WASTED.set(self.planner.ledger.outcomes.wasted_share())

    async def _tick_loop(self) -> None:
        interval = self.warmup_settings.tick_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            async with self._lock:
                out = self.planner.tick(time.time_ns() // 1_000_000)
            await self._publish(out)

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.warmup_settings.checkpoint_interval_s)
            await self.checkpoint()

    async def checkpoint(self) -> None:
        if self._store is None or not self.planner.ftl.fits:
            return
        async with self._lock:
            fits = self.planner.ftl.to_dict()
        blob = json.dumps(fits, sort_keys=True).encode()
        self.model_version = await self._store.save(
            self.warmup_settings.model_name, blob, params={}, metrics={"models": len(fits)}, kind="json"
        )

    async def _restore(self) -> None:
        assert self._store is not None
        latest = await self._store.latest(self.warmup_settings.model_name)
        if latest is None:
            return
        version, blob = latest
        try:
            self.planner.ftl.load(json.loads(blob))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning(
                "ignoring an unreadable FTL checkpoint", extra={"version": version, "error": str(exc)}
            )
            return
        self.model_version = version
        log.info("FTL fits restored", extra={"version": version, "models": len(self.planner.ftl.fits)})
