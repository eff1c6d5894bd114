"""One engine's stream through the bridge: hear a batch, decide by its sequence number (sequence.py),
fill gaps from the replay socket, decode (wire.py), produce `kv.events.v1` (translate.py), then save the
position. Produced before saved: a crash in between re-sends that batch, with the same event ids, and
consumers drop it as a duplicate. What cannot be decoded goes to `kv.events.dlq.v1` with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiokafka.errors import KafkaError
from prometheus_client import Counter

from schemas.events import Event, KvBlockStored
from schemas.topics import dlq_name, qualified
from schemas.wire import dead_letter_headers
from services.bridge.positions import PostgresPositionStore
from services.bridge.sequence import SeqTracker
from services.bridge.settings import PublisherConfig
from services.bridge.translate import ChainIndex, Engine, to_kv_events, waves
from services.bridge.wire import AllBlocksCleared, Batch, WireError, decode_batch, split_frames
from services.bridge.zmq_source import ReplayUnavailable, ZmqSource
from services.runtime.consume import backoff_s
from services.runtime.publisher import EventPublisher

log = logging.getLogger(__name__)

BATCHES = Counter("cachemesh_bridge_batches_total", "vLLM batches handled", ["engine", "outcome"])
EVENTS = Counter("cachemesh_bridge_events_total", "kv.events.v1 events produced", ["engine"])
LOST = Counter("cachemesh_bridge_lost_batches_total", "Batches neither heard nor replayed", ["engine"])


def digest(payload: bytes) -> bytes:
    """What tells a replayed batch from a restarted engine's batch under the same number."""
    return hashlib.blake2b(payload, digest_size=16).digest()


@dataclass
class Counts:
    forwarded: int = 0
    events: int = 0
    duplicates: int = 0
    replayed: int = 0
    replays: int = 0
    replay_failures: int = 0
    dead_lettered: int = 0
    restarts: int = 0


class EngineBridge:
    def __init__(
        self,
        config: PublisherConfig,
        source: ZmqSource,
        publisher: EventPublisher,
        store: PostgresPositionStore,
        *,
        namespace: str,
        max_tracked_blocks: int,
        max_payload_bytes: int,
        replay_history: bool,
    ) -> None:
        self.config = config
        self.engine = Engine(config.engine_id, config.model)
        self.source = source
        self.tracker = SeqTracker()
        self.chains = ChainIndex(max_tracked_blocks)
        self.counts = Counts()
        self._publisher = publisher
        self._store = store
        self._dlq_topic = qualified(dlq_name(KvBlockStored.topic), namespace)
        self._max_payload_bytes = max_payload_bytes
        self._replay_history = replay_history

    async def resume(self) -> None:
        """Pick up from the saved position, and ask the replay socket for what came since (or, on a
        first start, for what it still holds)."""
        saved = await self._store.load(self.engine.engine_id)
        if saved is not None:
            self.tracker = SeqTracker.resume(saved)
        log.info(
            "bridging an engine",
            extra={
                "engine": self.engine.engine_id,
                "endpoint": self.config.endpoint,
                "from_seq": self.tracker.next_seq,
            },
        )
        if self.config.replay_endpoint is not None and (saved is not None or self._replay_history):
            # From the start of what the engine still holds: batches forwarded before this process
            # began only rebuild the chain index (the parents of the blocks to come), the rest go on.
            await self._replay(rebuild=saved is not None)

    async def run(self) -> None:
        """Resume, then forward what the engine publishes until cancelled."""
        await self.resume()
        while True:
            await self.on_message(await self.source.receive())

    async def on_message(self, frames: Sequence[bytes]) -> None:
        try:
            topic, seq, payload = split_frames(frames)
        except WireError as exc:
            await self._dead_letter(frames[-1] if frames else b"", -1, exc.kind, exc.reason)
            return
        if self.config.topic and topic.decode(errors="replace") != self.config.topic:
            return  # another topic sharing the prefix the SUB filter matched
        verdict = self.tracker.on_live(seq, digest(payload))
        if verdict == "duplicate":
            self.counts.duplicates += 1
            BATCHES.labels(self.engine.engine_id, "duplicate").inc()
            return
        if verdict == "restart":
            self.counts.restarts += 1
            log.warning("engine restarted: a new epoch", extra={"engine": self.engine.engine_id, "seq": seq})
            await self._publish(self._forgotten())
        if seq != self.tracker.next_seq:
            await self._replay()
            if seq < self.tracker.next_seq:
                return  # the replay brought it already
            self._lose_until(seq)
        await self._forward(seq, payload)

    async def _replay(self, *, rebuild: bool = False) -> None:
        start, lost_before = self.tracker.next_seq, self.tracker.lost
        self.counts.replays += 1
        try:
            async for seq, payload in self.source.replay(0 if rebuild else start):
                if seq < start:
                    self._index_only(payload)
                elif self.tracker.on_replayed(seq, digest(payload)):
                    self.counts.replayed += 1
                    await self._forward(seq, payload)
        except ReplayUnavailable as exc:
            self.counts.replay_failures += 1
            log.warning(
                "replay failed", extra={"engine": self.engine.engine_id, "from_seq": start, "error": str(exc)}
            )
        self._count_lost(self.tracker.lost - lost_before, start)

    def _index_only(self, payload: bytes) -> None:
        """Learn the keys of an already forwarded batch without sending its events again."""
        with contextlib.suppress(WireError):
            if len(payload) <= self._max_payload_bytes:
                to_kv_events(decode_batch(payload), self.engine, self.tracker.epoch, -1, self.chains)

    def _lose_until(self, seq: int) -> None:
        before = self.tracker.lost
        self.tracker.skip_to(seq)
        self._count_lost(self.tracker.lost - before, seq)

    def _count_lost(self, n: int, near_seq: int) -> None:
        if n > 0:
            LOST.labels(self.engine.engine_id).inc(n)
            log.warning(
                "batches lost: neither heard nor replayed",
                extra={"engine": self.engine.engine_id, "lost": n, "near_seq": near_seq},
            )

    async def _forward(self, seq: int, payload: bytes) -> None:
        try:
            if len(payload) > self._max_payload_bytes:
                raise WireError(
                    "oversized", f"payload of {len(payload)} bytes exceeds {self._max_payload_bytes}"
                )
            batch = decode_batch(payload)
        except WireError as exc:
            await self._dead_letter(payload, seq, exc.kind, exc.reason)
        else:
            events = to_kv_events(batch, self.engine, self.tracker.epoch, seq, self.chains)
            await self._publish(events)
            self.counts.forwarded += 1
            self.counts.events += len(events)
            EVENTS.labels(self.engine.engine_id).inc(len(events))
            BATCHES.labels(self.engine.engine_id, "forwarded").inc()
        self.tracker.forwarded(seq)
        await self._store.save(self.engine.engine_id, self.tracker.position)

    def _forgotten(self) -> list[Event]:
        """A restarted engine holds none of its old blocks: their removals (as `AllBlocksCleared`),
        numbered apart from any batch of the new epoch."""
        cleared = Batch(time.time(), (AllBlocksCleared(),))
        return to_kv_events(cleared, self.engine, self.tracker.epoch, -1, self.chains)

    async def _publish(self, events: list[Event]) -> None:
        for wave in waves(events):
            await self._retrying(functools.partial(self._publish_wave, wave))

    async def _publish_wave(self, wave: list[Event]) -> None:
        await asyncio.gather(*(self._publisher.publish(e) for e in wave))

    async def _dead_letter(self, payload: bytes, seq: int, kind: str, reason: str) -> None:
        self.counts.dead_lettered += 1
        BATCHES.labels(self.engine.engine_id, "dead_lettered").inc()
        log.warning(
            "dead-lettered a vLLM message",
            extra={"engine": self.engine.engine_id, "seq": seq, "kind": kind, "reason": reason[:200]},
        )
        headers = dead_letter_headers(
            [("vllm.engine_id", self.engine.engine_id.encode())],
            kind=kind,
            reason=reason,
            topic=f"zmq:{self.config.endpoint}",
            partition=0,
            offset=seq,
            group=f"bridge:{self.engine.engine_id}",
            failed_at_ms=time.time_ns() // 1_000_000,
        )
        key = self.engine.engine_id.encode()
        await self._retrying(lambda: self._publisher.publish_raw(self._dlq_topic, key, payload, headers))

    async def _retrying(self, send: Callable[[], Awaitable[object]]) -> None:
        """Kafka being away is no reason to drop a batch: try again (the same event ids) until it is back."""
        attempt = 0
        while True:
            try:
                await send()
                return
            except (KafkaError, OSError) as exc:
                attempt += 1
                log.warning(
                    "produce failed; retrying", extra={"engine": self.engine.engine_id, "error": repr(exc)}
                )
                await asyncio.sleep(backoff_s(attempt, 0.1, 5.0))

    def health(self) -> dict[str, object]:
        return {
            "engine_id": self.engine.engine_id,
            "endpoint": self.config.endpoint,
            "epoch": self.tracker.epoch,
            "last_seq": self.tracker.last_forwarded,
            "lost": self.tracker.lost,
            "live_blocks": len(self.chains),
            "orphan_blocks": self.chains.orphans,
            **self.counts.__dict__,
        }
