"""The ports the node core needs, named by role: L3 (`ValueStore` + `DescriptorStore` = `L3Store`) and
other nodes' L2 (`RemoteL2`). Adapters live in their wing (`l3/store.py`, `l2/net/peers.py`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from schemas.events import CacheInvalidated
from services.tiers.entry import Entry

# --- L3: the store of record (docs/design.md §1.1 L3) -----------------------------------------------------


class L3Rejected(ValueError):
    """L3 refused the data itself (a constraint, a malformed value): retrying will not help."""


class StampTaken(RuntimeError):
    """L3 holds another write of the key under the very stamp of this one (two nodes' writes in the same
    millisecond): nothing was written. Stamps order a key's writes on every node, so two writes must
    never share one; the writer stamps again past `stamp_ms` and retries."""

    def __init__(self, key: str, stamp_ms: int) -> None:
        super().__init__(f"L3 holds another write of {key!r} stamped {stamp_ms}")
        self.key = key
        self.stamp_ms = stamp_ms


@dataclass(frozen=True, slots=True)
class SemanticMatch:
    entry: Entry
    similarity: float


class ValueStore(ABC):
    @abstractmethod
    async def put(self, entry: Entry, *, announce: CacheInvalidated | None = None) -> None:
        """Persist descriptor, tags and value together (replacing what `entry.key` had unless that is
        newer), and `announce`, the invalidation the write owes every node, in the outbox: one
        transaction. Raises `StampTaken` (and writes nothing) when the key is held at the same stamp."""

    @abstractmethod
    async def get(self, key: str, now_ms: int) -> Entry | None:
        """The live (unexpired at wall-clock `now_ms`) entry under `key`."""

    @abstractmethod
    async def get_many(self, keys: Sequence[str], now_ms: int) -> dict[str, Entry]: ...


class DescriptorStore(ABC):
    #: False when the store cannot search by embedding (Postgres without pgvector).
    semantic: bool = False

    @abstractmethod
    async def neighbours(
        self,
        embedding: npt.ArrayLike,
        now_ms: int,
        *,
        model: str | None = None,
        min_similarity: float = 0.0,
        candidates: int = 4,
    ) -> list[SemanticMatch]:
        """Up to `candidates` of the most similar live entries (of `model`), best first, at or above
        `min_similarity` whatever their own tolerance: candidates, not a decision (the caller's matcher
        applies each entry's floor). [] when the store cannot search by embedding."""

    @abstractmethod
    async def delete(self, key: str, *, announce: CacheInvalidated | None = None) -> bool:
        """Drop `key`; `announce` goes into the outbox in the same transaction (as for `put`)."""

    @abstractmethod
    async def delete_bound_to(self, trace_id: str) -> list[str]:
        """Drop every entry of the conversation `trace_id` (its own or listed as a dependency)."""

    @abstractmethod
    async def delete_expired(self, now_ms: int, limit: int = 1000) -> int: ...


#: Sends `(key, JSON)` invalidations and returns once the broker acknowledged every one (or raises).
Send = Callable[[list[tuple[str, bytes]]], Awaitable[None]]


class OutboxStore(ABC):
    """The durable outbox (the transactional outbox pattern): each invalidation a write owes is recorded
    with the write (`put`/`delete`'s `announce`). Its node publishes it at once and, once the broker
    acknowledged it, calls `outbox_sent`; what stays unacknowledged past a grace period (its node died
    or cannot reach the broker) any node relays (`relay_outbox`). Consumers ignore a repeated event."""

    @abstractmethod
    async def outbox_sent(self, event_ids: Sequence[str]) -> int:
        """Forget these events (the broker acknowledged them); returns how many rows went."""

    @abstractmethod
    async def relay_outbox(self, send: Send, *, older_than_ms: int, limit: int = 500) -> int:
        """Hand `send` up to `limit` events recorded at least `older_than_ms` ago, oldest first, and
        forget them once it returns; if it raises they stay (for the next relay). Rows another relay
        holds are skipped. Returns how many were relayed."""


class L3Store(ValueStore, DescriptorStore, OutboxStore, ABC):
    """What the tiered cache needs from L3: the three ports in one adapter."""

    async def find_neighbours(
        self,
        key: str,
        embedding: npt.ArrayLike,
        now_ms: int,
        *,
        model: str | None = None,
        min_similarity: float = 0.0,
        candidates: int = 4,
    ) -> tuple[Entry | None, list[SemanticMatch]]:
        """(the live entry under `key`, []) when there is one (of `model`), else (None, `neighbours`):
        one lookup's whole L3 leg for the match decision. Adapters that can answer both in one round
        trip override this."""
        entry = await self.get(key, now_ms)
        if entry is not None and (model is None or entry.meta.model == model):
            return entry, []
        found = await self.neighbours(
            embedding, now_ms, model=model, min_similarity=min_similarity, candidates=candidates
        )
        return None, found


# --- other nodes' L2 pools (docs/design.md §1.1 L2) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RemoteHit:
    entry: Entry
    peer: str  # the node's block server, host:port


class RemoteL2(ABC):
    """Other nodes' L2 pools, by exact key. Must not raise: a peer that fails or times out is a miss
    (counted in `stats`)."""

    @abstractmethod
    async def fetch_many(self, keys: Sequence[str]) -> dict[str, RemoteHit]: ...

    async def fetch(self, key: str) -> RemoteHit | None:
        return (await self.fetch_many([key])).get(key)

    @abstractmethod
    def stats(self) -> dict[str, Any]: ...
