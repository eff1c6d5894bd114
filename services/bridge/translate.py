"""vLLM KV events as `kv.events.v1`, without I/O: one `KvBlockStored` / `KvBlockRemoved` per block, the
parent link kept (a `BlockStored` of n blocks is a chain: each block's parent is the one before it, the
first one's is `parent_block_hash`), the engine as `node_id`, and an event id derived from
(engine, epoch, seq, position) so that a batch forwarded twice is dropped downstream as a duplicate.

vLLM's `AllBlocksCleared` has no counterpart in v1: it becomes a removal of every block this bridge saw
stored by that engine and not removed since (`LiveBlocks`, bounded; the oldest are forgotten first).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from schemas.events import Event, KvBlockRemoved, KvBlockStored
from services.bridge.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored, hash_key

Medium = Literal["gpu", "cpu", "disk"]
_MEDIA: dict[str, Medium] = {"gpu": "gpu", "cpu": "cpu", "disk": "disk"}


@dataclass(frozen=True, slots=True)
class Engine:
    """Who published the batch: `engine_id` becomes the events' `node_id`; `model` their model."""

    engine_id: str
    model: str | None = None


@dataclass
class LiveBlocks:
    """Blocks an engine holds as far as this bridge heard, to turn `AllBlocksCleared` into removals."""

    capacity: int
    _blocks: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def add(self, key: str) -> None:
        self._blocks[key] = None
        self._blocks.move_to_end(key)
        if len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def discard(self, key: str) -> None:
        self._blocks.pop(key, None)

    def clear(self) -> list[str]:
        keys = list(self._blocks)
        self._blocks.clear()
        return keys

    def __len__(self) -> int:
        return len(self._blocks)


def event_id(engine_id: str, epoch: int, seq: int, index: int, block: int) -> str:
    material = f"vllm|{engine_id}|{epoch}|{seq}|{index}|{block}"
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def medium_of(raw: str | None) -> Medium | None:
    """vLLM says "GPU" / "CPU" (connectors may add others); v1 knows gpu, cpu and disk."""
    return None if raw is None else _MEDIA.get(raw.lower())


def to_kv_events(batch: Batch, engine: Engine, epoch: int, seq: int, live: LiveBlocks) -> list[Event]:
    at_ms = max(0, round(batch.ts * 1000))
    out: list[Event] = []
    for i, ev in enumerate(batch.events):
        if isinstance(ev, BlockStored):
            parent = None if ev.parent_block_hash is None else hash_key(ev.parent_block_hash)
            for j, h in enumerate(ev.block_hashes):
                key = hash_key(h)
                out.append(
                    KvBlockStored(
                        event_id=event_id(engine.engine_id, epoch, seq, i, j),
                        occurred_at_ms=at_ms,
                        block_hash=key,
                        parent_block_hash=parent,
                        model=engine.model,
                        block_size_tokens=ev.block_size,
                        medium=medium_of(ev.medium),
                        node_id=engine.engine_id,
                    )
                )
                live.add(key)
                parent = key
        elif isinstance(ev, BlockRemoved):
            for j, h in enumerate(ev.block_hashes):
                key = hash_key(h)
                out.append(_removed(engine, epoch, seq, i, j, key, at_ms, medium_of(ev.medium)))
                live.discard(key)
        elif isinstance(ev, AllBlocksCleared):
            for j, key in enumerate(live.clear()):
                out.append(_removed(engine, epoch, seq, i, j, key, at_ms, None))
    return out


def _removed(
    engine: Engine, epoch: int, seq: int, i: int, j: int, key: str, at_ms: int, medium: Medium | None
) -> KvBlockRemoved:
    return KvBlockRemoved(
        event_id=event_id(engine.engine_id, epoch, seq, i, j),
        occurred_at_ms=at_ms,
        block_hash=key,
        model=engine.model,
        medium=medium,
        node_id=engine.engine_id,
    )


def waves(events: list[Event]) -> list[list[Event]]:
    """The events split so that no block appears twice in one wave: a wave is sent concurrently, the
    waves one after another, so two events of the same block keep their order."""
    out: list[list[Event]] = []
    occurrences: dict[str, int] = {}
    for ev in events:
        key = ev.kafka_key()
        n = occurrences.get(key, 0)
        occurrences[key] = n + 1
        if n == len(out):
            out.append([])
        out[n].append(ev)
    return out
