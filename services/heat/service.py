"""The heat service: hears `cache.access.v1`, `kv.events.v1` and `context.lifecycle.v1`, re-scores
every entry every 100 ms in which events arrived (an idle service does nothing), publishes changed
decisions to `heat.scores.v1`, and checkpoints the model to Postgres (at start, periodically, at stop).

Several heat services (each with its own `instance`) share the partitions through their consumer group,
each deciding the keys of its own; after a rebalance the keys of the partitions that went to another
owner are forgotten (engine.py's `forget`; docs/heat.md, "More than one heat service")."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from contextlib import AsyncExitStack
from typing import Any

from aiokafka import TopicPartition
from prometheus_client import Counter, Gauge

from policies.learned.compiled import CompiledHeat
from schemas.events import (
    AttentionHeatReported,
    CacheAccessed,
    ConversationEnded,
    HeatScored,
    HeatScoredBatch,
    KvBlockStored,
    heat_batch,
)
from schemas.topics import qualified
from services.heat.checkpoint import dump_scorer, load_scorer
from services.heat.engine import HeatEngine, Origin
from services.heat.settings import HeatSettings
from services.runtime import metrics
from services.runtime.kafka import Delivery, EventConsumer
from services.runtime.model_store import PostgresModelStore
from services.runtime.publisher import EventPublisher, partition_groups, partition_hash
from services.runtime.service import Loop, Service

log = logging.getLogger(__name__)
# Decisions handed to the producer between two turns of the event loop.
_PUBLISH_SLICE = 4096

DECISIONS = Counter("cachemesh_heat_decisions_total", "heat.scores.v1 decisions published", ["decision"])
TRACKED = Gauge("cachemesh_heat_tracked_entries", "Entries the heat policy tracks")
MODEL_STEPS = Gauge("cachemesh_heat_model_steps", "Training steps the heat model has taken")
CHAIN_REUSE = Gauge(
    "cachemesh_heat_chain_reuse_probability",
    "Learned P(a prefix block is re-used within 3 capacities), by whether the block was ever extended",
    ["extended"],
)
CHAIN_TERM = Gauge(
    "cachemesh_heat_chain_term_on",
    "1 while the learned chain term is on; 0 while its guard (miniatures with and without it) stands it down",
)
CHAIN_HALF_LIFE = Gauge(
    "cachemesh_heat_chain_half_life",
    "LRFU's half-life in capacities of accesses, as the guard's miniatures (one per candidate) moved it",
)


class HeatService(Service):
    name = "heat"

    def __init__(self, settings: HeatSettings) -> None:
        super().__init__(settings)
        self.heat_settings = settings
        policy = CompiledHeat(settings.capacity, seed=settings.seed, rescore_ms=settings.rescore_interval_ms)
        self.engine = HeatEngine(policy)
        self.model_version: int | None = None
        self._publisher: EventPublisher | None = None
        self._store: PostgresModelStore | None = None
        # The consumer's handler and the re-score loop share the policy; one at a time.
        self._lock = asyncio.Lock()
        # Partitions revoked by a rebalance not yet complete (no decisions go out meanwhile).
        self._revoked: set[Origin] = set()
        # What the last assignment gave this instance (a partition lost without a revoke, as when the
        # group dropped this member, is still found missing from the next one).
        self._held: set[Origin] = set()
        # With several instances: the kv.events partitions this one holds, of how many (a block whose
        # parent hashes elsewhere starts a chain here).
        self._kv_topic = qualified(KvBlockStored.topic, settings.kafka.topic_namespace)
        self._kv_owned: set[int] = set()
        self._kv_partitions = 0
        self._keyed: EventConsumer | None = None
        if settings.instance is not None:
            self.engine.foreign_parent = self._foreign_parent
        # `_learned()` as last saved or restored: (MLP steps, MLP labels, chain re-use labels, the
        # chains' half-life); a fresh model has nothing to save
        self._saved: tuple[int, int, int, float] = self._learned()

    async def open(self, stack: AsyncExitStack) -> None:
        db = await self.open_database(stack)
        self._store = PostgresModelStore(db)
        await self._restore()
        # Registered after the database: on stop the last checkpoint is written before it closes.
        stack.push_async_callback(self.checkpoint)
        self._publisher = await self.open_publisher(stack)
        settings = self.heat_settings
        keyed = [CacheAccessed.topic, AttentionHeatReported.topic]
        if settings.instance is None:
            keyed.append(ConversationEnded.topic)
        self._keyed = await self.open_consumer(
            stack,
            keyed,
            settings.group_id,
            self._handle,
            self._publisher,
            on_revoked=self._on_revoked,
            on_assigned=self._on_assigned,
        )
        if settings.instance is not None:
            # A conversation's end concerns keys on every instance: each hears all of them.
            lifecycle = f"{settings.group_id}.{settings.instance}"
            await self.open_consumer(
                stack, [ConversationEnded.topic], lifecycle, self._handle, self._publisher
            )

    def loops(self) -> list[Loop]:
        return [self._rescore_loop, self._checkpoint_loop]

    async def checks(self) -> dict[str, Any]:
        return {
            "tracked_entries": len(self.engine.policy),
            "events_applied": self.engine.events_applied,
            "orphans": {
                "parked": self.engine.orphans_parked,
                "adopted": self.engine.orphans_adopted,
                "expired": self.engine.orphans_expired,
            },
            "model_version": self.model_version,
            "model_steps": self.engine.policy.scorer.steps,
            "keys_forgotten": self.engine.forgotten,
        }

    async def _handle(self, delivery: Delivery) -> None:
        async with self._lock:
            self.engine.apply(delivery.event, (delivery.topic, delivery.partition))

    # Both synchronous, as every use of the engine is: neither can land in the middle of one.
    def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        self._revoked |= {(tp.topic, tp.partition) for tp in revoked}

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        self._kv_owned = {tp.partition for tp in assigned if tp.topic == self._kv_topic}
        self._kv_partitions = self._keyed.partition_count(self._kv_topic) if self._keyed else 0
        held = {(tp.topic, tp.partition) for tp in assigned}
        moved = (self._held | self._revoked) - held
        self._held, self._revoked = held, set()
        if not moved:
            return
        dropped = self.engine.forget(moved)
        TRACKED.set(len(self.engine.policy))
        log.info(
            "partitions moved to another owner; their keys forgotten",
            extra={"partitions": sorted(f"{t}-{p}" for t, p in moved), "keys": dropped},
        )

    def _foreign_parent(self, parent: str) -> bool:
        """Whether `parent`'s events go to another instance: its partition by Kafka's default
        partitioner (murmur2 of the block hash, as producers key kv.events.v1), not held here."""
        if not self._kv_partitions and self._keyed is not None:
            # At a first assignment the consumer's metadata may not know the topic yet; by the time
            # records of it arrive, it does.
            self._kv_partitions = self._keyed.partition_count(self._kv_topic)
        if not self._kv_partitions:
            return False
        return partition_hash(parent.encode()) % self._kv_partitions not in self._kv_owned

    async def _rescore_loop(self) -> None:
        interval = self.heat_settings.rescore_interval_ms / 1000
        assert self._publisher is not None
        while True:
            started = time.monotonic()
            if self._revoked:  # a rebalance is under way: whose keys are whose is not known yet
                await asyncio.sleep(interval)
                continue
            async with self._lock:
                # Event time drives the policy, so a replay and the live service agree.
                decisions = self.engine.rescore(
                    self.engine.last_event_ms, self.heat_settings.max_decisions_per_round
                )
            await self._publish(decisions)
            for decision, count in collections.Counter(d.decision for d in decisions).items():
                metrics.child(DECISIONS, decision).inc(count)
            TRACKED.set(len(self.engine.policy))
            MODEL_STEPS.set(self.engine.policy.scorer.steps)
            chain = self.engine.policy.chain_reuse
            if chain is not None:
                CHAIN_REUSE.labels("false").set(chain.probability(False))
                CHAIN_REUSE.labels("true").set(chain.probability(True))
            guard = self.engine.policy.chain_guard
            if guard is not None:
                state = guard.state()
                CHAIN_TERM.set(state.term_on)
                CHAIN_HALF_LIFE.set(state.half_life)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def _publish(self, decisions: list[HeatScored]) -> None:
        """A round's decisions, as batch records of one partition's decisions each (per-key order
        holds), filled into one producer batch per partition; a slice at a time, so the event loop
        turns between slices."""
        publisher, per_record = self._publisher, self.heat_settings.decisions_per_record
        assert publisher is not None
        for start in range(0, len(decisions), _PUBLISH_SLICE):
            chunk = decisions[start : start + _PUBLISH_SLICE]
            records: list[HeatScored | HeatScoredBatch] = list(chunk)
            if per_record > 1:
                partitions = await publisher.partitions_of_keys(HeatScored, [d.key for d in chunk])
                groups = partition_groups(chunk, partitions, per_record)
                records = [heat_batch(group) if len(group) > 1 else group[0] for group in groups]
            await publisher.publish_many(records, wait=False)

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heat_settings.checkpoint_interval_s)
            if self.model_changed():
                await self.checkpoint()

    def model_changed(self) -> bool:
        """The model has trained since it was last saved or restored (an idle service has nothing new
        to write every interval)."""
        return self._learned() != self._saved

    def _learned(self) -> tuple[int, int, int, float]:
        """How much the model and the chain re-use counts have learned, and the chains' half-life (a
        checkpoint's identity)."""
        policy = self.engine.policy
        chain = policy.chain_reuse.labels if policy.chain_reuse is not None else 0
        return policy.scorer.steps, policy.scorer.labels_seen, chain, self._half_life()

    def _half_life(self) -> float:
        """The chains' LRFU half-life: where the guard moved it, else the one they start at."""
        policy = self.engine.policy
        guard = policy.chain_guard
        return float(guard.state().half_life if guard is not None else policy.chain_half_life)

    async def checkpoint(self) -> None:
        if self._store is None:
            return
        async with self._lock:
            learned = self._learned()
            policy = self.engine.policy
            saved = dump_scorer(policy.scorer, policy.chain_reuse, learned[3])
        self.model_version = await self._store.save(
            self.heat_settings.checkpoint_name,
            saved.blob,
            params={"capacity": self.heat_settings.capacity, "seed": self.heat_settings.seed},
            metrics={"steps": saved.steps, "labels_seen": saved.labels_seen},
        )
        self._saved = learned
        log.info("model checkpointed", extra={"version": self.model_version, "steps": saved.steps})

    async def _restore(self) -> None:
        assert self._store is not None
        settings = self.heat_settings
        version: int | None = None
        latest = await self._store.latest(settings.checkpoint_name)
        if latest is not None:
            version, blob = latest
        elif settings.instance is not None and (newest := await self._store.newest_of(settings.model_name)):
            # A new instance starts from what the others learnt; its own versions start at 1.
            name, other_version, blob = newest
            log.info("starting from another instance's model", extra={"model": name, "v": other_version})
        else:
            log.info("no model checkpoint yet; starting fresh")
            return
        try:
            half_life = load_scorer(self.engine.policy.scorer, blob, self.engine.policy.chain_reuse)
        except ValueError as exc:
            log.warning(
                "ignoring an incompatible model checkpoint", extra={"version": version, "error": str(exc)}
            )
            return
        if half_life is not None and isinstance(self.engine.policy, CompiledHeat):
            self.engine.policy.start_half_life(half_life)  # before any event: the chains have not begun
        self.model_version = version
        self._saved = self._learned()
        log.info("model restored", extra={"version": version, "steps": self.engine.policy.scorer.steps})
