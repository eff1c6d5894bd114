"""vLLM KV events as `kv.events.v1`, without I/O: one `KvBlockStored` / `KvBlockRemoved` per block, keyed
by content (cachemesh_client/kvkeys.py), so that two engines, the connector, the gateway and the tiers
name a block alike.

Chains, `AllBlocksCleared`, orphans and event ids: docs/bridge.md ("Translating vLLM's events").
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from cachemesh_client.kvkeys import key_of, next_digest, root_digest

from schemas.events import Event, KvBlockRemoved, KvBlockStored
from services.bridge.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored, hash_key

Medium = Literal["gpu", "cpu", "disk"]
_MEDIA: dict[str, Medium] = {"gpu": "gpu", "cpu": "cpu", "disk": "disk"}


@dataclass(frozen=True, slots=True)
class Engine:
    """Who published the batch: `engine_id` becomes the events' `node_id`; `model` their model and the
    model identity in the block keys (the name the engine serves, as the connector and gateway say it)."""

    engine_id: str
    model: str


@dataclass
class ChainIndex:
    """The content digest of every block an engine holds, as far as this bridge heard, by the engine's own
    hash: the parents of the next `BlockStored`, and what `AllBlocksCleared` removes. Bounded (least
    recently stored first out); `orphans` counts blocks that could not be keyed."""

    capacity: int
    orphans: int = 0
    _blocks: OrderedDict[str, bytes] = field(default_factory=OrderedDict)

    def add(self, engine_hash: str, digest: bytes) -> None:
        self._blocks[engine_hash] = digest
        self._blocks.move_to_end(engine_hash)
        if len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def get(self, engine_hash: str) -> bytes | None:
        return self._blocks.get(engine_hash)

    def discard(self, engine_hash: str) -> bytes | None:
        return self._blocks.pop(engine_hash, None)

    def clear(self) -> list[bytes]:
        digests = list(self._blocks.values())
        self._blocks.clear()
        return digests

    def __len__(self) -> int:
        return len(self._blocks)


def event_id(engine_id: str, epoch: int, seq: int, index: int, block: int) -> str:
    material = f"vllm|{engine_id}|{epoch}|{seq}|{index}|{block}"
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def medium_of(raw: str | None) -> Medium | None:
    """vLLM says "GPU" / "CPU" (connectors may add others); v1 knows gpu, cpu and disk."""
    return None if raw is None else _MEDIA.get(raw.lower())


def to_kv_events(batch: Batch, engine: Engine, epoch: int, seq: int, chains: ChainIndex) -> list[Event]:
    at_ms = max(0, round(batch.ts * 1000))
    out: list[Event] = []
    for i, ev in enumerate(batch.events):
        if isinstance(ev, BlockStored):
            out.extend(_stored(ev, engine, epoch, seq, i, at_ms, chains))
        elif isinstance(ev, BlockRemoved):
            for j, h in enumerate(ev.block_hashes):
                digest = chains.discard(hash_key(h))
                if digest is not None:
                    out.append(_removed(engine, epoch, seq, i, j, digest, at_ms, medium_of(ev.medium)))
        elif isinstance(ev, AllBlocksCleared):
            for j, digest in enumerate(chains.clear()):
                out.append(_removed(engine, epoch, seq, i, j, digest, at_ms, None))
    return out


def _stored(
    ev: BlockStored, engine: Engine, epoch: int, seq: int, i: int, at_ms: int, chains: ChainIndex
) -> list[Event]:
    if ev.parent_block_hash is None:
        parent: bytes | None = root_digest(engine.model, ev.block_size, ev.lora_name or "")
        parent_key = None
    else:
        parent = chains.get(hash_key(ev.parent_block_hash))
        parent_key = None if parent is None else key_of(parent)
    if parent is None:
        chains.orphans += len(ev.block_hashes)
        return []
    out: list[Event] = []
    size = ev.block_size
    for j, h in enumerate(ev.block_hashes):
        tokens = ev.token_ids[j * size : (j + 1) * size]
        extra = None if ev.extra_keys is None else ev.extra_keys[j]
        if extra is not None:
            # Keyed apart from text-only blocks: the connector does not key such blocks at all.
            parent = hashlib.blake2b(parent + repr(extra).encode(), digest_size=len(parent)).digest()
        digest = next_digest(parent, tokens)
        key = key_of(digest)
        out.append(
            KvBlockStored(
                event_id=event_id(engine.engine_id, epoch, seq, i, j),
                occurred_at_ms=at_ms,
                block_hash=key,
                parent_block_hash=parent_key,
                model=engine.model,
                block_size_tokens=size,
                medium=medium_of(ev.medium),
                node_id=engine.engine_id,
            )
        )
        chains.add(hash_key(h), digest)
        parent, parent_key = digest, key
    return out


def _removed(
    engine: Engine, epoch: int, seq: int, i: int, j: int, digest: bytes, at_ms: int, medium: Medium | None
) -> KvBlockRemoved:
    return KvBlockRemoved(
        event_id=event_id(engine.engine_id, epoch, seq, i, j),
        occurred_at_ms=at_ms,
        block_hash=key_of(digest),
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
