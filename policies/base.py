"""The one interface every replacement policy implements.

A policy owns the resident set of a cache: it hears accesses, admissions and removals and returns
decisions (`Eviction`s) for the caller to carry out. The same object runs inside a tier node and in
the trace replayer, so it never touches I/O and takes the clock (`now_ms`) from the caller.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from typing import ClassVar, Literal

EvictionReason = Literal["capacity", "rejected", "expired", "context_ended", "cold_cluster", "heat"]


@dataclass(frozen=True, slots=True)
class Eviction:
    """A decision to drop `key`. `rejected` means the key was never admitted (TinyLFU-style)."""

    key: Hashable
    reason: EvictionReason = "capacity"


@dataclass(frozen=True, slots=True)
class AccessMeta:
    """Optional context an access carries; policies that do not need it ignore it.

    `parent` is the prefix parent of a KV block (prefix-chained block ids), `attention_heat` the
    head heat an inference engine reported for the entry, `trace_id` the conversation it belongs to.
    """

    trace_id: str | None = None
    parent: Hashable | None = None
    attention_heat: float | None = None
    ttl_ms: int | None = None
    cluster: int | None = None


class Policy(ABC):
    """Resident-set manager with a capacity in size units (entries unless sizes are given).

    Size-aware policies honour `size`; the classic ones (ARC, W-TinyLFU, ...) count entries and say
    so in their docstring.
    """

    name: ClassVar[str]
    # Declared capabilities: `size_aware` policies fill capacity in size units (others count entries);
    # `prefix_aware` ones read `AccessMeta.parent` and keep prefix chains whole (leaves leave first).
    size_aware: ClassVar[bool] = False
    prefix_aware: ClassVar[bool] = False

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity

    @abstractmethod
    def __contains__(self, key: Hashable) -> bool: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def on_hit(self, key: Hashable, now_ms: int, meta: AccessMeta | None = None) -> None:
        """A resident `key` was read."""

    @abstractmethod
    def on_miss(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> list[Eviction]:
        """`key` is not resident and the caller wants it cached: admit it (or reject it) and
        return every key that must leave, the rejected newcomer included."""

    @abstractmethod
    def on_remove(self, key: Hashable) -> None:
        """`key` left for a reason outside the policy (delete, invalidation, expiry)."""

    def access(
        self, key: Hashable, now_ms: int, size: int = 1, meta: AccessMeta | None = None
    ) -> tuple[bool, list[Eviction]]:
        """Replay convenience: a read that admits on a miss. Returns (hit, evictions)."""
        if key in self:
            self.on_hit(key, now_ms, meta)
            return True, []
        return False, self.on_miss(key, now_ms, size, meta)
